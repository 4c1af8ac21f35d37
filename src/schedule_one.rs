//! PURE: scheduled actions as OpenNebula users write them, read into our
//! JSON dialect (`schedule::parse_actions`), so that what `onevm show`
//! prints can be pasted as it is:
//!
//! - SCHED_ACTION text: one or more `SCHED_ACTION = [ KEY = "value", … ]`
//!   blocks, keys in any case and order, values quoted or bare, pairs split
//!   by commas or new lines, `#` comments and blank lines between;
//! - `onevm sched-update`'s form: one action's bare `KEY = "value"` lines
//!   (`ACTION="resume"` / `TIME="…"`, as OpenNebula's docs show it);
//! - JSON with OpenNebula's key names and string values: a list of such
//!   objects, or `{"SCHED_ACTION": …}` (one object or a list) as
//!   `onevm show --json` nests it.
//!
//! The keys OpenNebula keeps for its own bookkeeping (`ID`, `PARENT_ID`,
//! `TYPE`, `DONE`, `MESSAGE`, `WARNING`, an empty `ARGS`) are passed over.
//! Errors name the block (its number and line) and the field as written.

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::json_fields::clip;

/// Keys that become ours (lower-cased).
const OURS: [&str; 6] = ["ACTION", "TIME", "REPEAT", "DAYS", "END_TYPE", "END_VALUE"];
/// Keys `onevm show` prints that say what OpenNebula did, not what to do.
const BOOKKEEPING: [&str; 6] = ["ID", "PARENT_ID", "TYPE", "DONE", "MESSAGE", "WARNING"];
/// Keys whose value is a number in our dialect.
const NUMBERS: [&str; 3] = ["REPEAT", "END_TYPE", "END_VALUE"];

/// A schedule as given, and how to name its actions in errors.
#[derive(Debug)]
pub struct Read {
    /// In our dialect.
    pub json: String,
    /// Per action, how the input named it ("SCHED_ACTION 2 (line 5)");
    /// None when the input was ours already.
    names: Option<Vec<String>>,
}

impl Read {
    /// `result`, its error (from `schedule::parse_actions` or
    /// `check_offsets`, naming `actions[i].field`) said in the input's terms.
    pub fn explain<T>(&self, result: Result<T>) -> Result<T> {
        let Some(names) = &self.names else {
            return result;
        };
        result.map_err(|e| match e {
            Error::InvalidRequest(m) => Error::InvalidRequest(renamed(&m, names)),
            other => other,
        })
    }
}

/// `actions[i].field: …` as `NAME, FIELD: …`.
fn renamed(message: &str, names: &[String]) -> String {
    let Some(rest) = message.strip_prefix("actions[") else {
        return message.to_string();
    };
    let Some((index, rest)) = rest.split_once(']') else {
        return message.to_string();
    };
    let Some(name) = index.parse::<usize>().ok().and_then(|i| names.get(i)) else {
        return message.to_string();
    };
    match rest.strip_prefix('.').and_then(|r| r.split_once(": ")) {
        Some((field, why)) => format!("{name}, {}: {why}", field.to_uppercase()),
        None => format!("{name}{rest}"),
    }
}

/// Reads `input` in whichever dialect it is written: ours is passed on as
/// it is (parse_actions judges it); OpenNebula's is translated, or refused
/// naming the block and field.
pub fn read(input: &str) -> Result<Read> {
    let ours = || Read {
        json: input.to_string(),
        names: None,
    };
    let trimmed = input.trim_start();
    if trimmed.starts_with(['[', '{']) {
        let Ok(value) = serde_json::from_str::<Value>(input) else {
            return Ok(ours());
        };
        return match one_json(&value) {
            Some(items) => translated(items),
            None => Ok(ours()),
        };
    }
    let first = first_word(input).to_ascii_uppercase();
    if OURS.contains(&first.as_str()) || BOOKKEEPING.contains(&first.as_str()) || first == "ARGS" {
        return translated(bare_block(input)?);
    }
    if first != "SCHED_ACTION" {
        return Ok(ours());
    }
    translated(blocks(input)?)
}

/// The first word that is not in a comment.
fn first_word(input: &str) -> &str {
    input
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .next()
                .unwrap_or("")
        })
        .unwrap_or("")
}

/// One action as written: its name for errors and its (KEY, value) pairs.
type Block = (String, Vec<(String, String)>);

/// OpenNebula's JSON: `{"SCHED_ACTION": object or list}`, or a list of
/// objects whose keys are upper-case. None: not OpenNebula's.
fn one_json(value: &Value) -> Option<Vec<Block>> {
    let list: Vec<&Value> = match value {
        Value::Object(m) => {
            let (_, inner) = m
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("SCHED_ACTION"))?;
            match inner {
                Value::Array(items) => items.iter().collect(),
                one => vec![one],
            }
        }
        Value::Array(items)
            if items.iter().any(|i| {
                i.as_object()
                    .is_some_and(|m| m.keys().any(|k| k.chars().any(|c| c.is_ascii_uppercase())))
            }) =>
        {
            items.iter().collect()
        }
        _ => return None,
    };
    Some(
        list.iter()
            .enumerate()
            .map(|(i, item)| {
                let pairs = match item {
                    Value::Object(m) => m
                        .iter()
                        .map(|(k, v)| {
                            let text = match v {
                                Value::String(s) => s.clone(),
                                other => other.to_string(),
                            };
                            (k.clone(), text)
                        })
                        .collect(),
                    // Said as not an object by parse_actions.
                    _ => vec![(String::from("\u{0}"), item.to_string())],
                };
                (format!("SCHED_ACTION[{i}]"), pairs)
            })
            .collect(),
    )
}

/// The blocks of SCHED_ACTION text, each named by its number and line.
fn blocks(input: &str) -> Result<Vec<Block>> {
    let mut p = Text {
        chars: input.chars().collect(),
        at: 0,
        line: 1,
    };
    let mut out = Vec::new();
    loop {
        p.skip_space_and_comments();
        if p.done() {
            break;
        }
        let line = p.line;
        let name = p.word();
        let here = format!("line {line}");
        if !name.eq_ignore_ascii_case("SCHED_ACTION") {
            return Err(Error::field(
                "actions",
                format!(
                    "{here}: only SCHED_ACTION = [ … ] blocks (and # comments) are read; got {}",
                    if name.is_empty() {
                        format!("{:?}", p.peek().unwrap_or(' '))
                    } else {
                        clip(&name).to_string()
                    }
                ),
            ));
        }
        let label = format!("SCHED_ACTION {} (line {line})", out.len() + 1);
        p.skip_blank();
        p.expect('=', &label, "after SCHED_ACTION")?;
        p.skip_blank();
        p.expect('[', &label, "to open the block")?;
        let pairs = pairs(&mut p, &label, true)?;
        out.push((label, pairs));
    }
    Ok(out)
}

/// `onevm sched-update`'s form, the one OpenNebula's docs show most: one
/// action's bare `KEY = "value"` lines, no SCHED_ACTION = [ … ] around them.
fn bare_block(input: &str) -> Result<Vec<Block>> {
    let mut p = Text {
        chars: input.chars().collect(),
        at: 0,
        line: 1,
    };
    let label = "the action (onevm sched-update's KEY = \"value\" lines)".to_string();
    let pairs = pairs(&mut p, &label, false)?;
    Ok(vec![(label, pairs)])
}

/// `KEY = "value"` pairs up to a `]` (`closed`: a block's) or the end.
fn pairs(p: &mut Text, label: &str, closed: bool) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    loop {
        p.skip_separators();
        match p.peek() {
            None if closed => {
                return Err(Error::field(
                    label,
                    "the block is not closed: end it with ]",
                ))
            }
            None => break,
            Some(']') if closed => {
                p.at += 1;
                break;
            }
            _ => {}
        }
        let key = p.word();
        if key.is_empty() {
            let expected = if closed { "pair or ]" } else { "pair" };
            return Err(Error::field(
                label,
                format!(
                    "line {}: a KEY = \"value\" {expected} was expected; got {:?}",
                    p.line,
                    p.peek().unwrap_or(' ')
                ),
            ));
        }
        p.skip_blank();
        p.expect('=', &format!("{label}, {}", clip(&key)), "after the key")?;
        p.skip_blank();
        let value = p.value(&format!("{label}, {}", clip(&key)))?;
        pairs.push((key, value));
    }
    Ok(pairs)
}

/// Blocks into our JSON, each key checked; names kept for errors.
fn translated(blocks: Vec<Block>) -> Result<Read> {
    let mut list = Vec::with_capacity(blocks.len());
    let mut names = Vec::with_capacity(blocks.len());
    for (name, pairs) in blocks {
        let mut action = Map::new();
        let mut seen: Vec<String> = Vec::new();
        for (key, value) in pairs {
            let upper = key.to_ascii_uppercase();
            if key == "\u{0}" {
                return Err(Error::field(
                    &name,
                    format!(
                        r#"an object like {{"ACTION":"poweroff","TIME":"+3600"}}; got {}"#,
                        clip(&value)
                    ),
                ));
            }
            let at = format!("{name}, {}", clip(&key));
            if seen.contains(&upper) {
                return Err(Error::field(&at, "given twice in one block"));
            }
            seen.push(upper.clone());
            if BOOKKEEPING.contains(&upper.as_str()) {
                continue; // what OpenNebula did with it, not what to do
            }
            if upper == "ARGS" {
                if value.is_empty() {
                    continue;
                }
                return Err(Error::field(
                    &at,
                    "resume, poweroff and poweroff-hard take no arguments; leave ARGS out",
                ));
            }
            if !OURS.contains(&upper.as_str()) {
                return Err(Error::field(
                    &at,
                    format!(
                        "unknown field; accepted fields are {} (and, passed over, {}, ARGS)",
                        OURS.join(", "),
                        BOOKKEEPING.join(", ")
                    ),
                ));
            }
            // OpenNebula writes "no value" as an empty string, and an
            // END_VALUE of -1 beside an END_TYPE that takes none.
            if value.is_empty() || (upper == "END_VALUE" && value == "-1") {
                continue;
            }
            action.insert(upper.to_ascii_lowercase(), ours(&upper, value));
        }
        list.push(Value::Object(action));
        names.push(name);
    }
    Ok(Read {
        json: Value::Array(list).to_string(),
        names: Some(names),
    })
}

/// A value in our dialect: whole numbers where ours takes numbers (and an
/// epoch TIME); anything else as text, for parse_actions to judge.
fn ours(key: &str, value: String) -> Value {
    let number = || value.parse::<i64>().ok().map(Value::from);
    match key {
        k if NUMBERS.contains(&k) => number().unwrap_or(Value::String(value)),
        "TIME" if !value.starts_with('+') => number().unwrap_or(Value::String(value)),
        _ => Value::String(value),
    }
}

/// A cursor over SCHED_ACTION text that counts lines.
struct Text {
    chars: Vec<char>,
    at: usize,
    line: usize,
}

impl Text {
    fn done(&self) -> bool {
        self.at >= self.chars.len()
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.at += 1;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    /// Spaces and tabs on this line.
    fn skip_blank(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t' | '\r')) {
            self.bump();
        }
    }

    fn skip_comment(&mut self) {
        if self.peek() == Some('#') {
            while !matches!(self.peek(), None | Some('\n')) {
                self.bump();
            }
        }
    }

    fn skip_space_and_comments(&mut self) {
        loop {
            match self.peek() {
                Some(c) if c.is_whitespace() => {
                    self.bump();
                }
                Some('#') => self.skip_comment(),
                _ => return,
            }
        }
    }

    /// Between pairs: white space, new lines, commas and comments.
    fn skip_separators(&mut self) {
        loop {
            match self.peek() {
                Some(c) if c.is_whitespace() || c == ',' => {
                    self.bump();
                }
                Some('#') => self.skip_comment(),
                _ => return,
            }
        }
    }

    /// A name: letters, digits and `_`.
    fn word(&mut self) -> String {
        let mut w = String::new();
        while let Some(c) = self
            .peek()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        {
            w.push(c);
            self.bump();
        }
        w
    }

    fn expect(&mut self, want: char, at: &str, role: &str) -> Result<()> {
        if self.peek() == Some(want) {
            self.bump();
            return Ok(());
        }
        Err(Error::field(
            at,
            format!(
                "line {}: {want:?} was expected {role}; got {}",
                self.line,
                match self.peek() {
                    Some(c) => format!("{c:?}"),
                    None => "the end".into(),
                }
            ),
        ))
    }

    /// A value: "quoted" (with \" and \\ escapes), or bare up to a comma,
    /// a `]` or the end of the line.
    fn value(&mut self, at: &str) -> Result<String> {
        let mut v = String::new();
        if self.peek() == Some('"') {
            let line = self.line;
            self.bump();
            loop {
                match self.bump() {
                    None => {
                        return Err(Error::field(
                            at,
                            format!("line {line}: the quoted value is not closed with \""),
                        ))
                    }
                    Some('"') => return Ok(v),
                    Some('\\') => match self.bump() {
                        Some(c) => v.push(c),
                        None => continue,
                    },
                    Some(c) => v.push(c),
                }
            }
        }
        while let Some(c) = self.peek().filter(|c| !matches!(c, ',' | ']' | '\n' | '#')) {
            v.push(c);
            self.bump();
        }
        Ok(v.trim().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ours(input: &str) -> Value {
        serde_json::from_str(&read(input).unwrap().json).unwrap()
    }

    /// `onevm sched-update`'s form (OpenNebula's docs): one action's bare
    /// KEY="value" lines, comments and blank lines between.
    #[test]
    fn onevm_sched_update_lines_read_as_one_action() {
        let pasted = "# onevm sched-update 42 0\nACTION=\"resume\"\nTIME=\"1767254400\"\n\
                      REPEAT=\"0\"\nDAYS=\"1,5\"\nEND_TYPE=\"1\"\nEND_VALUE=\"5\"\n";
        assert_eq!(
            ours(pasted),
            json!([{"action": "resume", "time": 1767254400, "repeat": 0, "days": "1,5",
                    "end_type": 1, "end_value": 5}])
        );
        assert_eq!(
            ours("time = \"+3600\"\naction = poweroff"),
            json!([{"action": "poweroff", "time": "+3600"}])
        );
        // Refused as the form it is, naming the field as written.
        let e = read("ACTION=\"resume\"\nCOLOR=\"red\"").unwrap_err();
        assert!(
            e.message().starts_with(
                "the action (onevm sched-update's KEY = \"value\" lines), COLOR: unknown field"
            ),
            "{e}"
        );
        let e = read("ACTION=\"resume\"\n]").unwrap_err();
        assert!(
            e.message().contains("a KEY = \"value\" pair was expected"),
            "{e}"
        );
    }

    #[test]
    fn what_onevm_show_prints_reads_as_ours() {
        let pasted = r#"
# the customer's slice, from `onevm show 42`
SCHED_ACTION=[
  ACTION="resume",
  DAYS="1,3,5",
  END_TYPE="0",
  ID="0",
  PARENT_ID="42",
  REPEAT="0",
  TIME="1893488400",
  TYPE="VM" ]

SCHED_ACTION = [ TIME = "1893517200", ACTION = "poweroff", REPEAT = "0",
                 DAYS = "1,3,5", END_TYPE = "0", END_VALUE = "", ID = "1" ]
"#;
        assert_eq!(
            ours(pasted),
            json!([
                {"action":"resume","days":"1,3,5","end_type":0,"repeat":0,"time":1893488400},
                {"action":"poweroff","days":"1,3,5","end_type":0,"repeat":0,"time":1893517200}
            ])
        );
    }

    #[test]
    fn bare_values_lower_case_keys_and_relative_times() {
        assert_eq!(
            ours("sched_action=[action=poweroff, time=+3600]"),
            json!([{"action":"poweroff","time":"+3600"}])
        );
        // A one-shot action as OpenNebula 6 prints it: -1 for "none".
        assert_eq!(
            ours(
                r#"SCHED_ACTION=[ACTION="resume",END_TYPE="-1",END_VALUE="-1",REPEAT="-1",TIME="1893488400"]"#
            ),
            json!([{"action":"resume","end_type":-1,"repeat":-1,"time":1893488400}])
        );
    }

    #[test]
    fn open_nebulas_json_reads_as_ours() {
        let nested = r#"{"SCHED_ACTION":{"ACTION":"resume","TIME":"1893488400","REPEAT":"3","DAYS":"12","END_TYPE":"1","END_VALUE":"4"}}"#;
        assert_eq!(
            ours(nested),
            json!([{"action":"resume","time":1893488400,"repeat":3,"days":"12","end_type":1,"end_value":4}])
        );
        let listed = r#"[{"ACTION":"poweroff","TIME":"+60"},{"ACTION":"resume","TIME":"+120"}]"#;
        assert_eq!(
            ours(listed),
            json!([{"action":"poweroff","time":"+60"},{"action":"resume","time":"+120"}])
        );
    }

    #[test]
    fn our_own_dialect_passes_through_untouched() {
        let input = r#"[{"action":"resume","time":"+60"}]"#;
        let r = read(input).unwrap();
        assert_eq!(r.json, input);
        assert!(r.names.is_none());
        // Not JSON and not SCHED_ACTION: left for parse_actions to refuse.
        assert_eq!(read("nonsense").unwrap().json, "nonsense");
    }

    #[test]
    fn errors_name_the_block_its_line_and_the_field() {
        let e = |input: &str| read(input).unwrap_err().message().to_string();
        assert_eq!(
            e("SCHED_ACTION=[ACTION=\"resume\"]\nSCHED_ACTION=[ACTION=\"resume\", COLOUR=\"red\"]"),
            "SCHED_ACTION 2 (line 2), COLOUR: unknown field; accepted fields are ACTION, TIME, \
             REPEAT, DAYS, END_TYPE, END_VALUE (and, passed over, ID, PARENT_ID, TYPE, DONE, \
             MESSAGE, WARNING, ARGS)"
        );
        assert!(e("SCHED_ACTION=[ACTION=\"resume\", ACTION=\"poweroff\"]")
            .starts_with("SCHED_ACTION 1 (line 1), ACTION: given twice"));
        assert!(e("SCHED_ACTION=[ACTION=\"resume\"\n").contains("not closed"));
        assert!(e("SCHED_ACTION=[TIME=\"12]").contains("line 1: the quoted value is not closed"));
        assert!(e("SCHED_ACTION=[ACTION=\"x\"]\nNAME=\"vm\"")
            .starts_with("actions: line 2: only SCHED_ACTION"));
        assert!(e("SCHED_ACTION=[ARGS=\"a\"]").contains("take no arguments"));
        // Errors parse_actions finds, said in the input's terms.
        let r = read("\n\nSCHED_ACTION=[ACTION=\"resume\", TIME=\"+60\", REPEAT=\"9\"]").unwrap();
        let said = r
            .explain(crate::schedule::parse_actions(
                &r.json,
                jiff::Timestamp::UNIX_EPOCH,
            ))
            .unwrap_err();
        assert!(
            said.message()
                .starts_with("SCHED_ACTION 1 (line 3), REPEAT: one of -1"),
            "{said}"
        );
    }

    #[test]
    fn any_text_is_read_or_refused_never_a_panic() {
        for input in [
            "SCHED_ACTION",
            "SCHED_ACTION=",
            "SCHED_ACTION=[",
            "SCHED_ACTION=[=]",
            "SCHED_ACTION=[A=\"\\",
            "# only a comment",
            "SCHED_ACTION=[]]",
            "{\"SCHED_ACTION\":[1,2]}",
        ] {
            let _ = read(input).map(|r| r.json);
        }
    }
}
