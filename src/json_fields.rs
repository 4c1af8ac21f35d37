//! PURE: the one reader of JSON documents people write (worker specs,
//! templates, scheduled actions). Every error names the field's path
//! (`run.container.image`, `workload.model`) and what would be accepted, and
//! never echoes more than a short clip of what was given.
//!
//! Paths are dotted; the document itself is the empty path `""`, shown in
//! errors by the label its reader gives ([`document`]).

use crate::error::{Error, Result};
use serde_json::{Map, Value};

/// Longest string accepted anywhere in a document.
pub const MAX_STRING: usize = 128 * 1024;
/// Longest list (and most environment variables) accepted.
pub const MAX_LIST: usize = 256;

/// `path.key`, or `key` at the document's root.
pub fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// A document's text as JSON, refused before parsing when larger than
/// `max_bytes`; `label` names it in errors (`request: not valid JSON (…)`).
pub fn parse_text(text: &str, label: &str, max_bytes: usize) -> Result<Value> {
    if text.len() > max_bytes {
        return Err(Error::InvalidRequest(format!(
            "{label}: {} bytes is too large; at most {max_bytes} are accepted",
            text.len()
        )));
    }
    let value = serde_json::from_str(text)
        .map_err(|e| Error::InvalidRequest(format!("{label}: not valid JSON ({e})")))?;
    if let Some(path) = duplicate_key(text) {
        return Err(Error::field(
            &path,
            "given twice in one object; each field once (JSON readers disagree on which one counts)",
        ));
    }
    Ok(value)
}

/// The path of the first key an object of `text` (valid JSON) names twice.
/// serde_json keeps the last of them: `"image":"a", "image":"b"` would run
/// `b` while whoever reads the text sees `a`.
fn duplicate_key(text: &str) -> Option<String> {
    use serde::de::DeserializeSeed;
    let found = std::cell::RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(text);
    let _ = Keys {
        path: String::new(),
        found: &found,
    }
    .deserialize(&mut de);
    found.into_inner()
}

/// Walks a document for [`duplicate_key`], keeping nothing but keys.
struct Keys<'a> {
    path: String,
    found: &'a std::cell::RefCell<Option<String>>,
}

impl<'de> serde::de::DeserializeSeed<'de> for Keys<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Keys<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut a: A,
    ) -> std::result::Result<(), A::Error> {
        let mut i = 0;
        loop {
            let item = Keys {
                path: format!("{}[{i}]", self.path),
                found: self.found,
            };
            if a.next_element_seed(item)?.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut a: A,
    ) -> std::result::Result<(), A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = a.next_key::<std::borrow::Cow<'de, str>>()? {
            // A caller's key reaches the error only when short and printable.
            let shown = if key.len() > 64 || key.chars().any(crate::text::unseen) {
                "(a field name)"
            } else {
                &key
            };
            let path = join(&self.path, shown);
            if !seen.insert(key.clone()) {
                *self.found.borrow_mut() = Some(path);
                return Err(serde::de::Error::custom("duplicate key"));
            }
            a.next_value_seed(Keys {
                path,
                found: self.found,
            })?;
        }
        Ok(())
    }
}

/// The document's root: an object with only `allowed` keys; `label` names
/// it in errors (`request: expected a JSON object`).
pub fn document<'a>(v: &'a Value, label: &str, allowed: &[&str]) -> Result<&'a Map<String, Value>> {
    let m = v
        .as_object()
        .ok_or_else(|| Error::field(label, "expected a JSON object"))?;
    known_keys(m, "", allowed)?;
    Ok(m)
}

/// An object at `path` with only `allowed` keys.
pub fn object<'a>(v: &'a Value, path: &str, allowed: &[&str]) -> Result<&'a Map<String, Value>> {
    let m = v
        .as_object()
        .ok_or_else(|| Error::field(path, "expected a JSON object"))?;
    known_keys(m, path, allowed)?;
    Ok(m)
}

fn known_keys(m: &Map<String, Value>, path: &str, allowed: &[&str]) -> Result<()> {
    if let Some(unknown) = m.keys().find(|k| !allowed.contains(&k.as_str())) {
        // A caller's key reaches the error only when it is short and printable.
        let key = if unknown.len() > 64 || unknown.chars().any(crate::text::unseen) {
            "(a field name)"
        } else {
            unknown
        };
        return Err(Error::field(
            &join(path, key),
            format!("unknown field; accepted here: {}", allowed.join(", ")),
        ));
    }
    Ok(())
}

pub fn required<'a>(m: &'a Map<String, Value>, path: &str, key: &str) -> Result<&'a Value> {
    m.get(key)
        .ok_or_else(|| Error::field(&join(path, key), "required"))
}

pub fn string(v: &Value, path: &str) -> Result<String> {
    match v {
        Value::String(s) if s.len() > MAX_STRING => Err(Error::field(
            path,
            format!("too long; at most {MAX_STRING} bytes"),
        )),
        Value::String(s) if s.contains('\0') => {
            Err(Error::field(path, "must not contain a NUL character"))
        }
        Value::String(s) => Ok(s.clone()),
        _ => Err(Error::field(path, "expected a string")),
    }
}

/// A name-like string (vendor, model, user): short, printable, not blank.
pub fn short(v: &Value, path: &str) -> Result<String> {
    let s = string(v, path)?;
    if s.trim().is_empty() || s.len() > 128 || s.chars().any(crate::text::hidden) {
        return Err(Error::field(path, "1 to 128 printable characters"));
    }
    Ok(s)
}

pub fn boolean(v: &Value, path: &str) -> Result<bool> {
    v.as_bool()
        .ok_or_else(|| Error::field(path, "expected true or false"))
}

pub fn uint(v: &Value, path: &str) -> Result<u64> {
    v.as_u64()
        .ok_or_else(|| Error::field(path, "expected a whole number, 0 or more"))
}

pub fn list<'a>(v: &'a Value, path: &str) -> Result<&'a Vec<Value>> {
    let items = v
        .as_array()
        .ok_or_else(|| Error::field(path, "expected a JSON array"))?;
    if items.len() > MAX_LIST {
        return Err(Error::field(
            path,
            format!("{} elements is too many; at most {MAX_LIST}", items.len()),
        ));
    }
    Ok(items)
}

/// A list of strings; absent is empty.
pub fn strings(v: Option<&Value>, path: &str) -> Result<Vec<String>> {
    match v {
        None => Ok(Vec::new()),
        Some(v) => list(v, path)?
            .iter()
            .enumerate()
            .map(|(i, s)| string(s, &format!("{path}[{i}]")))
            .collect(),
    }
}

/// A caller's text shortened for an error message, so that an error never
/// echoes a whole document back.
pub fn clip(text: &str) -> String {
    const MAX_CHARS: usize = 40;
    if text.chars().count() <= MAX_CHARS {
        text.to_string()
    } else {
        let mut short: String = text.chars().take(MAX_CHARS).collect();
        short.push('…');
        short
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_key_given_twice_is_refused_naming_it() {
        let refused = |text: &str| {
            parse_text(text, "request", 1 << 20)
                .unwrap_err()
                .to_string()
        };
        let e = refused(r#"{"run":{"container":{"image":"localhost/bb","image":"x"}}}"#);
        assert!(e.contains("run.container.image: given twice"), "{e}");
        let e = refused(r#"{"actions":[{"time":1},{"time":2,"time":3}]}"#);
        assert!(e.contains("actions[1].time: given twice"), "{e}");
        // Told apart after their escapes are read: the same key.
        let e = refused(r#"{"name":"a","n\u0061me":"b"}"#);
        assert!(e.contains("name: given twice"), "{e}");
        // A hostile key is not echoed.
        let e = refused(r#"{"a\u202eb":1,"a\u202eb":2}"#);
        assert!(e.contains("(a field name): given twice"), "{e}");
        assert!(!e.contains('\u{202e}'), "{e}");
        // The same key in different objects, numbers of any form: accepted.
        let ok = r#"{"a":{"x":1.25},"b":{"x":[{"x":1e3}]},"x":-0}"#;
        assert!(parse_text(ok, "request", 1 << 20).is_ok());
    }

    #[test]
    fn errors_name_the_path_and_what_is_accepted() {
        let v = json!({"a": 1, "zz": 2});
        let e = document(&v, "request", &["a"]).unwrap_err();
        assert_eq!(e.message(), "zz: unknown field; accepted here: a");
        let e = object(&v, "run.unit", &["a"]).unwrap_err();
        assert_eq!(e.message(), "run.unit.zz: unknown field; accepted here: a");
        let e = document(&json!([]), "template", &[]).unwrap_err();
        assert_eq!(e.message(), "template: expected a JSON object");
        let m = v.as_object().unwrap();
        assert_eq!(required(m, "", "b").unwrap_err().message(), "b: required");
        assert_eq!(
            required(m, "x", "b").unwrap_err().message(),
            "x.b: required"
        );
        // A hostile key is not echoed.
        let long = json!({ "k".repeat(100): 1 });
        let e = object(&long, "p", &["a"]).unwrap_err();
        assert!(e.message().starts_with("p.(a field name): unknown field"));
        assert!(short(&json!("   "), "user.name").is_err());
        assert_eq!(clip(&"x".repeat(50)).chars().count(), 41);
    }
}
