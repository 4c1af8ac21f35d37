//! The page's first paint, rendered here from the same snapshot as the JSON:
//! the page reads without JavaScript (a text browser, a locked-down one, a
//! screen reader before the script runs), and its script then replaces
//! these parts with the same markup, live. Every name is escaped.

use super::html_escape as esc;
use crate::views::{GpuSnap, PageSnapshot, SliceSnap, WorkerSnap};

/// The page's colours for sharers, as its script picks them (the same hash,
/// so the first paint and the live one agree): blues, greens, violets and
/// greys, never the red and amber that say something is wrong.
const PALETTE: [&str; 12] = [
    "#3b7dd8", "#2ba84a", "#8a63d2", "#00a3a3", "#4f6ab3", "#5c8a2b", "#1f9e89", "#6b7a99",
    "#2c6e9b", "#7a5fa8", "#3f8f6f", "#56658a",
];

/// `text` as one segment of a URL's path: every byte but the unreserved
/// ones percent-encoded (the script's encodeURIComponent, near enough).
fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn colours(names: &[&str]) -> Vec<&'static str> {
    let mut used = [false; PALETTE.len()];
    names
        .iter()
        .map(|n| {
            let h = n
                .chars()
                .fold(0u32, |h, c| h.wrapping_mul(31).wrapping_add(c as u32));
            let mut i = h as usize % PALETTE.len();
            for _ in 0..PALETTE.len() {
                if !used[i] {
                    break;
                }
                i = (i + 1) % PALETTE.len();
            }
            used[i] = true;
            PALETTE[i]
        })
        .collect()
}

/// GB to one decimal, as the script shows them.
fn gb(x: f64) -> String {
    let r = (x * 10.0).round() / 10.0;
    format!("{r}")
}

/// The page with its parts filled in, in one pass over the template (a
/// value that looks like a placeholder is never expanded).
pub fn page(template: &str, snap: &PageSnapshot, served_at: &str) -> String {
    let parts = [
        ("MACHINE", esc(&snap.machine)),
        ("MACHINE_PATH", esc(&path_segment(&snap.machine))),
        ("TZ", esc(&format!("times in {}", snap.time_zone))),
        ("SERVED", esc(&format!("as of {served_at}"))),
        ("GPUS", gpus(snap)),
        ("WORKERS", workers(&snap.workers)),
        ("WORKER_WARNINGS", worker_warnings(&snap.workers)),
        ("PENDING", pending(&snap.workers)),
        ("SLICES", slices(snap)),
    ];
    let mut out = String::with_capacity(template.len() + 4096);
    let mut rest = template;
    while let Some(at) = rest.find("{{") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        match after.find("}}").and_then(|end| {
            parts
                .iter()
                .find(|(k, _)| *k == &after[..end])
                .map(|p| (end, p))
        }) {
            Some((end, (_, value))) => {
                out.push_str(value);
                rest = &after[end + 2..];
            }
            None => {
                out.push_str("{{");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

fn gpus(snap: &PageSnapshot) -> String {
    if snap.gpus.is_empty() {
        return r#"<p class="empty">No GPUs.</p>"#.into();
    }
    snap.gpus.iter().map(gpu).collect()
}

fn gpu(g: &GpuSnap) -> String {
    let v = &g.view;
    let mut h = format!(
        r#"<section class="gpu{}" data-uuid="{}" data-index="{}"><h3 class="title">GPU {} · {} · <span class="mode mode-{}">{}</span></h3><div class="offers">{}</div>"#,
        if v.warning.is_empty() {
            ""
        } else {
            " attention"
        },
        esc(&v.uuid),
        v.index,
        v.index,
        esc(&v.model),
        esc(&v.mode),
        esc(&v.mode),
        esc(&g.offers)
    );
    if !v.healthy {
        h += &format!(
            r#"<div class="warning health">unhealthy: {}</div>"#,
            esc(&v.health)
        );
    }
    if !v.draining_for.is_empty() {
        h += &format!(
            r#"<div class="draining">draining for {}: no new shared work until it is placed</div>"#,
            esc(&v.draining_for)
        );
    }
    let (total, outside) = (v.total_gb, v.held_outside_gb);
    // What sharers use beyond their shares: neither outside nor free.
    let beyond = v.beyond_shares_gb;
    let taken = v.taken_gb;
    let scale = total.max(outside + beyond + taken).max(0.001);
    let names: Vec<&str> = v.sharers.iter().map(|(n, _)| &**n).collect();
    let colour = colours(&names);
    let seg = |class: &str, gbs: f64, label: &str, colour: Option<&str>| {
        if gbs <= 0.0 {
            return String::new();
        }
        let bg = colour.map_or(String::new(), |c| format!(" background: {c};"));
        format!(
            r#"<div class="seg {class}" style="flex: 0 0 {}%;{bg}" title="{}">{}</div>"#,
            100.0 * gbs / scale,
            esc(label),
            esc(label)
        )
    };
    let over = if outside + beyond + taken > total + 1e-9 {
        " over"
    } else {
        ""
    };
    h += &format!(r#"<div class="bar{over}">"#);
    for ((name, gbs), c) in v.sharers.iter().zip(&colour) {
        let gbs = gbs.as_f64();
        h += &seg("sharer", gbs, &format!("{name} {} GB", gb(gbs)), Some(c));
    }
    h += &seg(
        "outside",
        outside,
        &format!("outside {} GB", gb(outside)),
        None,
    );
    h += &seg(
        "outside",
        beyond,
        &format!("beyond shares {} GB", gb(beyond)),
        None,
    );
    let free = total - outside - beyond - taken;
    if v.held_whole_by.is_empty() && closed(v) {
        let label = format!("{}, not offered {} GB", v.mode, gb(free));
        h += &seg("closed", free, &label, None);
    } else if v.held_whole_by.is_empty() {
        h += &seg("free", free, &format!("free {} GB", gb(free)), None);
    } else {
        h += &seg(
            "whole",
            total - outside,
            &format!("held whole by {}", v.held_whole_by),
            None,
        );
    }
    h += "</div>";
    h += &format!(r#"<div class="summary">{}</div>"#, esc(&v.summary));
    let mut m = vec![match g.used_gb {
        Some(u) => format!("uses {} GB of {} GB promised", gb(u), gb(v.taken_gb)),
        None => "use unknown".to_string(),
    }];
    if v.power_w >= 0.0 {
        m.push(format!("{} W", v.power_w.round()));
    }
    if v.utilization_pct >= 0 {
        m.push(format!("{}% busy", v.utilization_pct));
    }
    h += &format!(r#"<div class="metrics">{}</div>"#, esc(&m.join(" · ")));
    if !v.warning.is_empty() {
        h += &format!(r#"<div class="warning">{}</div>"#, esc(&v.warning));
    }
    h + "</section>"
}

/// Memory no shared work may take, though neither shared nor outside: an
/// unhealthy GPU's (placement refuses it) and a time-sliced one's (the
/// baseboard's VM owns it). Drawn apart from free memory.
fn closed(v: &crate::views::GpuView) -> bool {
    v.mode == "unhealthy" || v.mode == "time-sliced" || v.mode == "mig"
}

/// The GPUs cell as the seed writes it: `1 · shared 2.2 GB`.
fn gpus_cell(w: &WorkerSnap) -> String {
    let n = w.view.gpus.len();
    match (n, w.shared_gb) {
        (0, _) => "—".into(),
        (n, Some(s)) => format!("{n} · shared {} GB", gb(s)),
        (n, None) => format!("{n} · whole"),
    }
}

fn workers(ws: &[WorkerSnap]) -> String {
    ws.iter()
        .map(|w| {
            let v = &w.view;
            let warn = if v.warnings.is_empty() {
                String::new()
            } else {
                format!(r#" class="warn" title="{}""#, esc(&v.warnings.join("\n")))
            };
            let used = if v.gpus.is_empty() {
                "—".to_string()
            } else if v.gpu_used_gb >= 0.0 {
                format!("{} GB", gb(v.gpu_used_gb))
            } else {
                "unknown".to_string()
            };
            // held or promised; why, on hover (as page.html's heldCell).
            let held = if v.enforcement.is_empty() || v.state == crate::worker::State::Pending {
                r#"<td class="held">—</td>"#.to_string()
            } else {
                format!(
                    r#"<td class="held" title="{}">{}</td>"#,
                    esc(&v.enforcement),
                    esc(v.enforcement.split(':').next().unwrap_or_default())
                )
            };
            format!(
                r#"<tr data-name="{0}"{warn}><td class="name">{0}</td><td class="state state-{1}">{1}</td><td class="owner">{2}</td><td class="gpus">{3}</td>{held}<td class="use num">{4}</td></tr>"#,
                esc(&v.name),
                esc(v.state.as_str()),
                esc(&w.owner),
                esc(&gpus_cell(w)),
                esc(&used)
            )
        })
        .collect()
}

fn worker_warnings(ws: &[WorkerSnap]) -> String {
    ws.iter()
        .flat_map(|w| {
            w.view.warnings.iter().map(move |x| {
                format!(
                    r#"<div class="warning wwarn" data-name="{}">{}: {}</div>"#,
                    esc(&w.view.name),
                    esc(&w.view.name),
                    esc(x)
                )
            })
        })
        .collect()
}

fn pending(ws: &[WorkerSnap]) -> String {
    let waiting: Vec<&WorkerSnap> = ws
        .iter()
        .filter(|w| w.view.state.as_str() == "pending" || !w.pending_reasons.is_empty())
        .collect();
    if waiting.is_empty() {
        return r#"<p class="empty">Nobody is waiting.</p>"#.into();
    }
    waiting
        .iter()
        .map(|w| {
            let name = esc(&w.view.name);
            let reasons: String = if w.pending_reasons.is_empty() {
                r#"<li class="empty">no reason given</li>"#.into()
            } else {
                w.pending_reasons
                    .iter()
                    .map(|r| format!(r#"<li data-name="{name}">{}</li>"#, esc(r)))
                    .collect()
            };
            format!(
                r#"<div class="worker" data-name="{name}"><strong>{name} ({})</strong><ul>{reasons}</ul></div>"#,
                esc(&w.owner)
            )
        })
        .collect()
}

fn slices(snap: &PageSnapshot) -> String {
    if snap.slices.is_empty() {
        return r#"<p class="empty">No slice templates.</p>"#.into();
    }
    let tz = jiff::tz::TimeZone::get(&snap.time_zone).unwrap_or(jiff::tz::TimeZone::UTC);
    let at = |ms: i64, form: &str| {
        jiff::Timestamp::from_millisecond(ms)
            .map(|t| t.to_zoned(tz.clone()).strftime(form).to_string())
            .unwrap_or_default()
    };
    // As the script writes them: the end's day only when it differs.
    let span = |t: &crate::wire::SliceTriple| {
        let day = "%a %-d %b, %H:%M";
        let same_day = at(t.start_ms, "%F") == at(t.end_ms, "%F");
        let end = at(t.end_ms, if same_day { "%H:%M" } else { day });
        format!("{} – {end}", at(t.start_ms, day))
    };
    let cell = |class: &str, s: &Option<crate::wire::SliceTriple>, none: &str| match s {
        Some(t) => format!(
            r#"<td class="{class}"><span class="when">{}</span></td>"#,
            esc(&span(t))
        ),
        None => format!(r#"<td class="{class}"><span class="empty">{none}</span></td>"#),
    };
    let rows: String = snap
        .slices
        .iter()
        .map(|s: &SliceSnap| {
            format!(
                r#"<tr data-template="{0}"><td>{0}</td><td class="state state-{1}">{1}</td>{2}{3}</tr>"#,
                esc(&s.template),
                esc(&s.state),
                cell("active", &s.active, "no slice now"),
                cell("next", &s.next, "none planned")
            )
        })
        .collect();
    format!(
        "<table><thead><tr><th>Template</th><th>State</th><th>Now</th><th>Next</th></tr></thead><tbody>{rows}</tbody></table>"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hex colour's hue in degrees; None for a grey.
    fn hue(hex: &str) -> Option<f64> {
        let c = |i: usize| f64::from(u8::from_str_radix(&hex[i..i + 2], 16).unwrap()) / 255.0;
        let (r, g, b) = (c(1), c(3), c(5));
        let (max, min) = (r.max(g).max(b), r.min(g).min(b));
        if max - min < 0.08 {
            return None;
        }
        let h = if max == r {
            60.0 * ((g - b) / (max - min)).rem_euclid(6.0)
        } else if max == g {
            60.0 * ((b - r) / (max - min) + 2.0)
        } else {
            60.0 * ((r - g) / (max - min) + 4.0)
        };
        Some(h)
    }

    /// Healthy workers are drawn in calm colours: no red, orange or amber
    /// (hues up to 65 degrees and from 330), the colours of errors and
    /// warnings; the script's palette is this one, in this order.
    #[test]
    fn sharers_colours_are_never_those_of_errors_and_the_script_agrees() {
        for c in PALETTE {
            if let Some(h) = hue(c) {
                assert!((65.0..330.0).contains(&h), "{c}: hue {h:.0}");
            }
        }
        assert!(
            hue("#d64550").is_some_and(|h| !(65.0..330.0).contains(&h)),
            "the check sees red"
        );
        assert!(
            hue("#d9822b").is_some_and(|h| !(65.0..330.0).contains(&h)),
            "and amber"
        );
        let page = include_str!("page.html");
        let js = page
            .split("const palette = [")
            .nth(1)
            .unwrap()
            .split(']')
            .next()
            .unwrap();
        let js: Vec<&str> = js.split(',').map(|s| s.trim().trim_matches('"')).collect();
        assert_eq!(js, PALETTE);
    }

    #[test]
    fn a_machine_name_is_one_path_segment_in_a_link() {
        assert_eq!(path_segment("majin"), "majin");
        assert_eq!(path_segment("a b/c?\"\u{e9}"), "a%20b%2Fc%3F%22%C3%A9");
    }

    #[test]
    fn placeholders_are_filled_once_and_values_never_expand() {
        let snap = PageSnapshot {
            machine: "{{GPUS}}<b>".into(),
            time_zone: "UTC".into(),
            ..Default::default()
        };
        let out = page("<h1>{{MACHINE}}</h1>{{NOPE}}{{GPUS", &snap, "10:00:00");
        assert_eq!(out, "<h1>{{GPUS}}&lt;b&gt;</h1>{{NOPE}}{{GPUS");
    }

    #[test]
    fn sharers_get_the_scripts_colours() {
        // The script's hash: h = h * 31 + code point, unsigned 32-bit.
        let h = "listen"
            .chars()
            .fold(0u64, |h, c| (h * 31 + c as u64) % (1 << 32));
        assert_eq!(colours(&["listen"])[0], PALETTE[(h % 12) as usize]);
        // Two names that hash alike still differ.
        let c = colours(&["a", "m"]);
        assert_ne!(c[0], c[1]);
    }
}
