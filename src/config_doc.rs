//! PURE: the configuration reference, from the one commented example that
//! ships as /etc/astraeus/node.toml (`packaging/node.toml`): the man page
//! node.toml(5) and the table in docs/operations.md are both made here, so
//! neither can drift from the file an operator edits.
//!
//! The example's shape: `[section]` lines; `# comment` lines describing the
//! key that follows; each key as `key = default` or, when it has no default
//! value, commented out as `# key = example`.

/// The example config, as shipped.
pub const EXAMPLE: &str = include_str!("../packaging/node.toml");

/// One documented key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    pub section: String,
    pub name: String,
    /// `2` or `"astraeus"`; for a key with no default, the example value.
    pub value: String,
    /// Whether `value` is the default (false: unset by default, an example).
    pub default: bool,
    pub about: String,
}

/// The keys of the example, in its order.
pub fn keys(example: &str) -> Vec<Key> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut about: Vec<&str> = Vec::new();
    // Keys in a row share the comment above the first of them.
    let mut shared = String::new();
    for line in example.lines() {
        let l = line.trim();
        if let Some(s) = l.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            section = s.to_string();
            about.clear();
        } else if l.is_empty() {
            about.clear();
            shared.clear();
        } else if let Some((name, value, default)) = key_line(l) {
            if !about.is_empty() {
                shared = about.join(" ");
            }
            out.push(Key {
                section: section.clone(),
                name,
                value,
                default,
                about: shared.clone(),
            });
            about.clear();
        } else if let Some(c) = l.strip_prefix('#') {
            about.push(c.trim());
        }
    }
    out
}

/// `key = value` (a default) or `# key = value` (an example).
fn key_line(l: &str) -> Option<(String, String, bool)> {
    let (text, default) = match l.strip_prefix("# ") {
        Some(t) => (t, false),
        None => (l, true),
    };
    let (name, value) = text.split_once(" = ")?;
    let plain = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'_' || b.is_ascii_digit());
    plain.then(|| (name.to_string(), value.trim().to_string(), default))
}

/// The reference as a Markdown table, one row per key.
pub fn markdown(example: &str) -> String {
    let mut out = String::from("| key | default | what it does |\n|---|---|---|\n");
    for k in keys(example) {
        let name = if k.section.is_empty() {
            k.name.clone()
        } else {
            format!("{}.{}", k.section, k.name)
        };
        let value = if k.default {
            format!("`{}`", k.value)
        } else {
            format!("unset (e.g. `{}`)", k.value)
        };
        out.push_str(&format!(
            "| `{name}` | {value} | {} |\n",
            k.about.replace('|', "\\|").replace('<', "&lt;")
        ));
    }
    out
}

/// node.toml(5), in roff.
pub fn man(example: &str, version: &str) -> String {
    let esc = |t: &str| t.replace('\\', "\\\\").replace('-', "\\-");
    let mut out = format!(
        ".TH NODE.TOML 5 \"\" \"astraeusd {version}\" \"File Formats\"\n\
         .SH NAME\nnode.toml \\- configuration of astraeusd\n\
         .SH SYNOPSIS\n/etc/astraeus/node.toml\n\
         .SH DESCRIPTION\nA TOML file; every key is optional and an unknown key is an error \
         naming it. astraeusd reads it at start (\\fB\\-\\-config\\fR names another \
         file).\n"
    );
    let mut section = None;
    for k in keys(example) {
        if section.as_deref() != Some(k.section.as_str()) {
            let title = if k.section.is_empty() {
                "TOP LEVEL".to_string()
            } else {
                format!("[{}]", k.section.to_uppercase())
            };
            out.push_str(&format!(".SH {}\n", esc(&title)));
            section = Some(k.section.clone());
        }
        let value = if k.default {
            format!("(default {})", k.value)
        } else {
            format!("(unset by default; e.g. {})", k.value)
        };
        out.push_str(&format!(
            ".TP\n\\fB{}\\fR {}\n{}\n",
            esc(&k.name),
            esc(&value),
            esc(&k.about)
        ));
    }
    out.push_str(
        ".SH FILES\n/etc/astraeus/node.toml\n\
         .SH SEE ALSO\n\\fBastraeusd\\fR(8), \\fBastraeusctl\\fR(1)\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// node.toml(5) says what each key does on its own (two quotas once
    /// shared one sentence); keys that only travel together may share it.
    #[test]
    fn every_key_has_a_description_of_its_own() {
        const TOGETHER: &[&str] = &["unit_default_cpu_cores", "unit_default_memory_gb"];
        let keys = keys(EXAMPLE);
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                let together =
                    TOGETHER.contains(&a.name.as_str()) && TOGETHER.contains(&b.name.as_str());
                assert!(
                    a.about != b.about || together,
                    "{}.{} and {}.{} share one description: {}",
                    a.section,
                    a.name,
                    b.section,
                    b.name,
                    a.about
                );
            }
        }
    }

    #[test]
    fn every_key_of_the_example_is_documented_and_parses_as_config() {
        let keys = keys(EXAMPLE);
        assert!(keys.len() >= 24, "{}", keys.len());
        let drain = keys
            .iter()
            .find(|k| k.name == "drain_after_seconds")
            .unwrap();
        assert_eq!(
            (drain.section.as_str(), drain.value.as_str(), drain.default),
            ("placement", "600", true)
        );
        assert!(drain.about.starts_with("A request for a whole GPU"));
        for k in &keys {
            assert!(
                !k.about.is_empty(),
                "{}.{} has no description",
                k.section,
                k.name
            );
        }
        // Each key, with its value, is accepted by the real config parser.
        for k in &keys {
            let text = if k.section.is_empty() {
                format!("{} = {}\n", k.name, k.value)
            } else {
                format!("[{}]\n{} = {}\n", k.section, k.name, k.value)
            };
            toml::from_str::<crate::config::Config>(&text)
                .unwrap_or_else(|e| panic!("{}.{}: {e}", k.section, k.name));
        }
        assert!(markdown(EXAMPLE).contains("| `placement.drain_after_seconds` | `600` |"));
        assert!(man(EXAMPLE, "0.1.0").contains(".SH [PLACEMENT]\n.TP\n\\fBdrain_after_seconds\\fR"));
    }
}
