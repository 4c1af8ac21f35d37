//! `astraeusctl notify`: a desktop user's agent (the user unit
//! astraeus-notify.service runs it). It follows the daemon's signals and
//! raises freedesktop notifications (org.freedesktop.Notifications on the
//! session bus) about the user's own workers: placed after waiting, failed
//! (with the reason), a new warning (beyond its share, an over-promised or
//! unhealthy GPU), stopped by someone else; and a template's slice starting
//! for its user. Each is said once, when it happens (never per refresh),
//! and at most [`BURST`] a minute: past that, one line says how many more.
//!
//! An agent of the user's rather than the daemon's own doing: the system
//! daemon has no session bus to reach and must not wait on a user's
//! notification server, and a user's workers may live on the system's
//! daemon, on the user's session daemon, or both. Without --session or
//! --bus-address it follows both, each while its daemon runs, and waits
//! for one that is not running yet.

use super::events::worker_property;
use super::Client;
use astraeusd::bus::BASE_PATH;
use astraeusd::wire::{EndedRow, WorkerRow};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use zbus::OwnedVariant as OwnedValue;

/// Notifications a minute at most, from all buses together.
pub const BURST: usize = 5;
/// How often a bus with no daemon is asked again.
const RETRY: Duration = Duration::from_secs(2);

/// Sends notifications, rate-limited.
pub struct Notifier {
    session: zbus::Connection,
    rate: Rate,
}

/// At most [`BURST`] in any minute.
#[derive(Default)]
pub struct Rate {
    sent: std::collections::VecDeque<Instant>,
    held_back: usize,
}

impl Rate {
    /// Whether one may go at `now`: Some(how many were held back since
    /// the last that went), or None (held back, and counted).
    pub fn admit(&mut self, now: Instant) -> Option<usize> {
        while self
            .sent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(60))
        {
            self.sent.pop_front();
        }
        if self.sent.len() >= BURST {
            self.held_back += 1;
            return None;
        }
        self.sent.push_back(now);
        Some(std::mem::take(&mut self.held_back))
    }
}

impl Notifier {
    pub async fn new(patience: Duration) -> Result<Notifier, String> {
        let session = tokio::time::timeout(patience, zbus::Connection::session())
            .await
            .map_err(|_| "NoReply: the session bus did not answer".to_string())?
            .map_err(|e| format!("Unreachable: no session bus to raise notifications on ({e})"))?;
        Ok(Notifier {
            session,
            rate: Rate::default(),
        })
    }

    /// Raises one notification, unless [`BURST`] went out in the last
    /// minute: then it is counted, and said with the next one that may go.
    pub async fn raise(&mut self, summary: &str, body: &str) {
        let body = match self.rate.admit(Instant::now()) {
            None => return,
            Some(0) => body.to_string(),
            Some(n) => format!("{body}\n(and {n} more since; see astraeusctl events)"),
        };
        if let Err(e) = notification(&self.session, summary, &body).await {
            eprintln!("astraeusctl: a notification was not shown ({e})");
        }
    }
}

/// `astraeusctl notify`: one follower per bus it is told of (both, by
/// default), sharing one notifier and its rate.
pub async fn notify_all(
    session: bool,
    address: Option<&str>,
    patience: std::time::Duration,
) -> Result<(), String> {
    let buses: Vec<&str> = match address {
        Some(_) => vec!["the bus at --bus-address"],
        None if session => vec!["the session bus"],
        None => vec!["the session bus", "the system bus"],
    };
    let out = tokio::sync::Mutex::new(Notifier::new(patience).await?);
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let name = astraeusd::auth::user_name_or_uid(uid);
    let mut followers = Vec::new();
    for label in buses {
        let builder = match (address, label) {
            (Some(a), _) => zbus::connection::Builder::address(a),
            (None, "the session bus") => zbus::connection::Builder::session(),
            (None, _) => zbus::connection::Builder::system(),
        };
        let Ok(Ok(conn)) =
            tokio::time::timeout(patience, builder.method_timeout(patience).build()).await
        else {
            // No such bus here (no session bus, no system bus).
            continue;
        };
        let c = Client { conn, patience };
        followers.push(follow(c, label, (uid, name.clone()), &out));
    }
    // Each follows its bus for as long as this runs.
    let mut followers = followers.into_iter();
    match (followers.next(), followers.next()) {
        (Some(a), Some(b)) => {
            futures_util::future::join(a, b).await;
        }
        (Some(a), None) => a.await,
        _ => return Err("Unreachable: neither the session bus nor the system bus answers".into()),
    }
    Ok(())
}

/// The body's text as a server that reads markup in it shows it: `&`,
/// `<` and `>` as entities (the spec's body-markup is a subset of HTML: a
/// path or a command with `<b>` in it came out bold, #67).
pub fn escape_markup(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Whether the server reads markup in bodies (its body-markup capability):
/// then the body is escaped; one that does not shows it as it is. Asked at
/// each notification (a few a minute at most): the agent runs for months,
/// and the server behind the name may be replaced meanwhile.
async fn reads_markup(session: &zbus::Connection) -> bool {
    let asked = session
        .call_method(
            Some("org.freedesktop.Notifications"),
            "/org/freedesktop/Notifications",
            Some("org.freedesktop.Notifications"),
            "GetCapabilities",
            &(),
        )
        .await;
    asked
        .ok()
        .and_then(|m| m.body().deserialize::<Vec<String>>().ok())
        .is_some_and(|caps| caps.iter().any(|c| c == "body-markup"))
}

/// One notification on `session` (org.freedesktop.Notifications.Notify).
/// Text from the daemon is made printable first: it may name another
/// user's process or a caller's worker; the body is escaped for a server
/// that reads markup. From astraeusd (its desktop entry, the machine
/// page's), urgent when something failed or was killed.
pub async fn notification(
    session: &zbus::Connection,
    summary: &str,
    body: &str,
) -> Result<(), String> {
    let urgency: u8 = if summary.ends_with(" failed") || summary.ends_with(" was killed") {
        2
    } else {
        1
    };
    let mut hints: HashMap<&str, zbus::Variant<'_>> = HashMap::new();
    hints.insert("desktop-entry", zbus::Variant::from("astraeus-machine"));
    hints.insert("urgency", zbus::Variant::from(urgency));
    let summary = astraeusd::text::clipped(&astraeusd::text::printable(summary), 120);
    let mut body = astraeusd::text::clipped(&astraeusd::text::printable_lines(body), 1000);
    if reads_markup(session).await {
        body = escape_markup(&body);
    }
    session
        .call_method(
            Some("org.freedesktop.Notifications"),
            "/org/freedesktop/Notifications",
            Some("org.freedesktop.Notifications"),
            "Notify",
            &(
                "astraeusd",
                0u32,
                "utilities-system-monitor",
                summary.as_str(),
                body.as_str(),
                Vec::<&str>::new(),
                hints,
                -1i32,
            ),
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// What is known of one of the user's workers.
#[derive(Default)]
struct Seen {
    state: String,
    waited: bool,
    warnings: Vec<String>,
}

/// Follows one bus's daemon for as long as this runs: through its
/// restarts, and until it first appears. `me`: this user's uid and name.
pub async fn follow(c: Client, bus: &str, me: (u32, String), out: &tokio::sync::Mutex<Notifier>) {
    loop {
        match c.daemon_signals().await {
            Ok(signals) => {
                if let Err(e) = follow_daemon(&c, bus, &me, signals, out).await {
                    eprintln!("astraeusctl notify: {bus}: {e}");
                    tokio::time::sleep(RETRY).await;
                }
            }
            // No daemon there (yet): ask again.
            Err(_) => tokio::time::sleep(RETRY).await,
        }
    }
}

async fn follow_daemon(
    c: &Client,
    bus: &str,
    me: &(u32, String),
    mut signals: impl futures_util::Stream<Item = zbus::Result<zbus::Message>> + Unpin,
    out: &tokio::sync::Mutex<Notifier>,
) -> Result<(), String> {
    // Subscribed first, then what is there now: nothing falls between.
    let rows: Vec<WorkerRow> = c.call("ListWorkers", &()).await?;
    // Others' workers, so that their ends cost no question; one that comes
    // and goes before its owner can be read is neither, and asked about.
    let mut others: std::collections::HashSet<String> = rows
        .iter()
        .filter(|r| r.owner_uid != me.0)
        .map(|r| r.name.clone())
        .collect();
    let mut mine: HashMap<String, Seen> = rows
        .into_iter()
        .filter(|r| r.owner_uid == me.0)
        .map(|r| {
            let waited = r.state == "pending";
            let seen = Seen {
                state: r.state,
                waited,
                warnings: Vec::new(),
            };
            (r.name, seen)
        })
        .collect();
    for (name, seen) in mine.iter_mut() {
        seen.warnings = worker_property(c, &astraeusd::bus::worker_path(name), "Warnings")
            .await
            .unwrap_or_default();
    }
    // Said once following: a reader (a test, a journal) knows from here on
    // nothing is missed.
    crate::out_line(&format!("following the daemon on {bus}"));
    while let Some(msg) = signals.next().await {
        let Ok(msg) = msg else { continue };
        let header = msg.header();
        let member = header.member().map(|m| m.to_string()).unwrap_or_default();
        let path = header.path().map(|p| p.to_string()).unwrap_or_default();
        let body = msg.body();
        match member.as_str() {
            // The daemon went away: follow the next one.
            "NameOwnerChanged" => return Ok(()),
            "WorkerNew" => {
                let Ok((name, object)) = body.deserialize::<(String, zbus::OwnedObjectPath)>()
                else {
                    continue;
                };
                let owner: Option<u32> = worker_property(c, object.as_str(), "Owner").await;
                match owner {
                    Some(uid) if uid == me.0 => {}
                    Some(_) => {
                        others.insert(name);
                        continue;
                    }
                    // Gone already (a launch that failed at once).
                    None => continue,
                }
                let state: String = worker_property(c, object.as_str(), "State")
                    .await
                    .unwrap_or_default();
                let waited = state == "pending";
                mine.insert(
                    name,
                    Seen {
                        state,
                        waited,
                        warnings: Vec::new(),
                    },
                );
            }
            "WorkerRemoved" => {
                let Ok((name, _)) = body.deserialize::<(String, zbus::OwnedObjectPath)>() else {
                    continue;
                };
                if others.remove(&name) {
                    continue;
                }
                mine.remove(&name);
                if let Some((summary, text)) = ended(c, &name, me.0).await {
                    out.lock().await.raise(&summary, &text).await;
                }
            }
            "SliceStarted" => {
                let Ok((template, _, _)) = body.deserialize::<(String, i64, i64)>() else {
                    continue;
                };
                let path = format!(
                    "{BASE_PATH}/template/{}",
                    astraeusd::bus::escape_label(&template)
                );
                let user: Option<String> = c
                    .property(&path, "org.astraeus.Node1.Template", "User")
                    .await
                    .ok();
                // `name (internal|external)`: the name is this user's login.
                let named = user
                    .as_deref()
                    .and_then(|u| u.rsplit_once(" ("))
                    .map(|(n, _)| n);
                if named == Some(me.1.as_str()) {
                    out.lock()
                        .await
                        .raise(
                            &format!("Your time slice on {template} started"),
                            &format!("The GPU baseboard is yours now, on {bus}."),
                        )
                        .await;
                }
            }
            "PropertiesChanged" => {
                let Ok((iface, changed, invalidated)) =
                    body.deserialize::<(String, HashMap<String, OwnedValue>, Vec<String>)>()
                else {
                    continue;
                };
                if iface != "org.astraeus.Node1.Worker" {
                    continue;
                }
                let Some(name) = path
                    .strip_prefix(&format!("{BASE_PATH}/worker/"))
                    .and_then(astraeusd::bus::unescape_label)
                else {
                    continue;
                };
                let Some(seen) = mine.get_mut(&name) else {
                    continue;
                };
                let state = changed
                    .get("State")
                    .and_then(|v| v.try_clone().ok())
                    .and_then(|v| String::try_from(v).ok());
                if let Some(state) = state {
                    let placed = seen.waited
                        && seen.state == "pending"
                        && (state == "starting" || state == "running");
                    seen.state = state;
                    if placed {
                        seen.waited = false;
                        let gpus: String = worker_property(c, &path, "Gpus")
                            .await
                            .map(|g: Vec<(u32, String)>| {
                                g.iter()
                                    .map(|(i, _)| format!("GPU {i}"))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            })
                            .unwrap_or_default();
                        let on = if gpus.is_empty() {
                            String::new()
                        } else {
                            format!(" on {gpus}")
                        };
                        out.lock()
                            .await
                            .raise(
                                &format!("{name} is placed"),
                                &format!("After waiting, it has its share{on} ({bus})."),
                            )
                            .await;
                    }
                }
                if changed.contains_key("Warnings") || invalidated.iter().any(|p| p == "Warnings") {
                    let now: Vec<String> = worker_property(c, &path, "Warnings")
                        .await
                        .unwrap_or_default();
                    let new: Vec<&String> =
                        now.iter().filter(|w| !seen.warnings.contains(w)).collect();
                    if !new.is_empty() {
                        let text = new
                            .iter()
                            .map(|w| w.as_str())
                            .collect::<Vec<_>>()
                            .join("\n");
                        out.lock()
                            .await
                            .raise(&format!("{name}: a warning"), &text)
                            .await;
                    }
                    seen.warnings = now;
                }
            }
            _ => {}
        }
    }
    Err("Unreachable: the bus connection ended".into())
}

/// How one of the user's workers ended, when that is news: it failed, or
/// someone else stopped it (summary, body). Its own stop and its workload's
/// exit are not.
async fn ended(c: &Client, name: &str, me: u32) -> Option<(String, String)> {
    let since_ms = jiff::Timestamp::now().as_millisecond() - 120_000;
    let rows: Vec<EndedRow> = c.call("ListEndedMs", &(since_ms, 100u32)).await.ok()?;
    let row = rows
        .into_iter()
        .find(|r| r.name == name && r.owner_uid == me)?;
    news(name, &row.end_reason)
}

/// Whether an end is news to its owner, and how it is said: a failure, a
/// stop by someone else, a workload that exited with a status other than
/// 0 (137: killed). Its own stop and a clean exit are not.
fn news(name: &str, reason: &str) -> Option<(String, String)> {
    if reason.starts_with("failed") {
        // "failed: …", "failed to start: …": said as the daemon says it.
        return Some((format!("{name} failed"), format!("It {reason}.")));
    }
    if reason.starts_with("stopped by") {
        return Some((format!("{name} was stopped"), format!("It was {reason}.")));
    }
    let status = reason.strip_prefix("exited with status ")?;
    let code = status.split(|c: char| !c.is_ascii_digit()).next()?;
    match code {
        "0" | "" => None,
        "137" => Some((
            format!("{name} was killed"),
            format!("It {reason} (SIGKILL)."),
        )),
        _ => Some((
            format!("{name} exited with status {code}"),
            format!("It {reason}."),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::{news, Rate, BURST};

    /// A body's markup characters are shown as they are, not read as tags.
    #[test]
    fn a_bodys_markup_is_escaped() {
        assert_eq!(
            super::escape_markup("<b>BOLD</b> & <i>it</i>"),
            "&lt;b&gt;BOLD&lt;/b&gt; &amp; &lt;i&gt;it&lt;/i&gt;"
        );
    }

    /// An end that is news is said; its owner's own stop and a clean
    /// exit are not (#67: an exit with status 3 and a kill said nothing).
    #[test]
    fn an_exit_other_than_0_is_news_as_a_failure_is() {
        let said = |r: &str| news("box", r).map(|(s, _)| s);
        assert_eq!(
            said("exited with status 3").as_deref(),
            Some("box exited with status 3")
        );
        assert_eq!(
            said("exited with status 137").as_deref(),
            Some("box was killed")
        );
        assert_eq!(said("failed: podman: OOM").as_deref(), Some("box failed"));
        assert_eq!(said("stopped by uid 0").as_deref(), Some("box was stopped"));
        assert_eq!(said("exited with status 0"), None);
        assert_eq!(said("stopped"), None);
        assert_eq!(said("stopped; killed after 30 s"), None);
    }
    use std::time::{Duration, Instant};

    /// Five in a minute go; the rest are counted, and the next that may go
    /// says how many were held back; a minute after the first, room again.
    #[test]
    fn at_most_five_a_minute_and_the_rest_counted() {
        let mut rate = Rate::default();
        let t0 = Instant::now();
        for i in 0..BURST {
            assert_eq!(rate.admit(t0 + Duration::from_secs(i as u64)), Some(0));
        }
        assert_eq!(rate.admit(t0 + Duration::from_secs(10)), None);
        assert_eq!(rate.admit(t0 + Duration::from_secs(59)), None);
        assert_eq!(rate.admit(t0 + Duration::from_secs(60)), Some(2));
        assert_eq!(rate.admit(t0 + Duration::from_secs(60)), None);
        assert_eq!(rate.admit(t0 + Duration::from_secs(61)), Some(1));
    }
}
