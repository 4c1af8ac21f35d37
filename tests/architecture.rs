//! The house rules of src/, checked on the source itself so that they hold
//! as the code grows (docs/architecture.md explains them):
//! - no import circle among src/ files (a directory module's mod.rs and its
//!   own files are one room: they implement one type together);
//! - the pure cores import nothing that does I/O or that adapts (store,
//!   runtime, bus, web, service, node, inventory, command, views);
//! - no file over ~900 lines but the pure cores named here, each one
//!   cohesive concern.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// Pure cores: no I/O, no clock (but `time::EpochMs::now`), no adaptors.
const PURE: &[&str] = &[
    "access.rs",
    "domain_xml.rs",
    "error.rs",
    "json_fields.rs",
    "machine.rs",
    "placement.rs",
    "quantity.rs",
    "report.rs",
    "request.rs",
    "rotation.rs",
    "schedule.rs",
    "schedule_form.rs",
    "schedule_one.rs",
    "slicing/handoff.rs",
    "slicing/meter.rs",
    "slicing/mod.rs",
    "slicing/template.rs",
    "text.rs",
    "time.rs",
    "usage.rs",
];

/// What a pure core may not import.
const IMPURE: &[&str] = &[
    "store",
    "runtime",
    "bus",
    "web",
    "service",
    "node",
    "inventory",
    "command",
    "views",
];

/// Files allowed past the size limit: pure cores whose size is one concern
/// (most of each is its tests).
const LARGE_PURE: &[&str] = &[
    "report.rs",
    "rotation.rs",
    "schedule.rs",
    "schedule_form.rs",
    "slicing/handoff.rs",
    "slicing/template.rs",
];
const MAX_LINES: usize = 900;

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn rel(p: &Path) -> String {
    p.strip_prefix(SRC).unwrap().to_string_lossy().into_owned()
}

/// Code without comments (line comments and doc comments).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path from `crate::` or `super::` in the code, expanded over
/// `{a, b::c}` groups, as segments.
fn paths(code: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for root in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(i) = rest.find(root) {
            let before = rest[..i].chars().last();
            rest = &rest[i + root.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            expand(root.trim_end_matches("::"), rest, Vec::new(), &mut out);
        }
    }
    out
}

fn expand(root: &str, text: &str, prefix: Vec<String>, out: &mut Vec<(String, Vec<String>)>) {
    let mut segs = prefix;
    let mut t = text;
    loop {
        if let Some(inner) = t.strip_prefix('{') {
            // Split the group at its top-level commas.
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        expand(root, inner[start..i].trim(), segs.clone(), out);
                        return;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(root, inner[start..i].trim(), segs.clone(), out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            return;
        }
        let end = t
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(t.len());
        if end == 0 {
            break;
        }
        segs.push(t[..end].to_string());
        t = &t[end..];
        match t.strip_prefix("::") {
            Some(next) => t = next,
            None => break,
        }
    }
    out.push((root.to_string(), segs));
}

/// The file a module path lands in: the longest prefix that is a file.
fn resolve(base: &Path, segs: &[String]) -> Option<String> {
    for n in (1..=segs.len()).rev() {
        let mut p = base.to_path_buf();
        for s in &segs[..n] {
            p.push(s);
        }
        for candidate in [p.with_extension("rs"), p.join("mod.rs")] {
            if candidate.is_file() {
                return Some(rel(&candidate));
            }
        }
    }
    None
}

/// The directory a file's `super::` starts from.
fn super_dir(file: &Path) -> PathBuf {
    let dir = file.parent().unwrap();
    if file
        .file_name()
        .is_some_and(|n| n == "mod.rs" || n == "lib.rs")
    {
        dir.parent().unwrap().to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut all = Vec::new();
    files(Path::new(SRC), &mut all);
    let mut g = BTreeMap::new();
    for f in &all {
        let name = rel(f);
        if name.starts_with("bin/") || name == "main.rs" || name == "lib.rs" {
            continue;
        }
        let text = code(&std::fs::read_to_string(f).unwrap());
        let mut deps = BTreeSet::new();
        for (root, segs) in paths(&text) {
            let base = if root == "crate" {
                PathBuf::from(SRC)
            } else {
                super_dir(f)
            };
            // `super::Item` names the parent module's own file.
            let parent = || {
                let m = base.join("mod.rs");
                let f = base.with_extension("rs");
                [m, f].into_iter().find(|p| p.is_file()).map(|p| rel(&p))
            };
            let to = resolve(&base, &segs).or_else(|| (root == "super").then(parent).flatten());
            if let Some(to) = to {
                if to != name && to != "lib.rs" {
                    deps.insert(to);
                }
            }
        }
        g.insert(name, deps);
    }
    g
}

/// A directory module's mod.rs and its own files are one room.
fn same_room(a: &str, b: &str) -> bool {
    let dir = |f: &str| Path::new(f).parent().map(Path::to_path_buf);
    let is_mod = |f: &str| f.ends_with("mod.rs");
    (is_mod(a) && dir(b) == dir(a)) || (is_mod(b) && dir(a) == dir(b))
}

/// A circle in the graph, if there is one (edges within a room skipped).
fn find_circle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut circle = stack[i..].to_vec();
            circle.push(n.to_string());
            return Some(circle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_string());
        for d in g.get(n).into_iter().flatten() {
            if same_room(n, d) {
                continue;
            }
            if let Some(c) = visit(d, g, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|n| visit(n, g, &mut Vec::new(), &mut done))
}

#[test]
fn no_import_circle_among_src_files() {
    let g = graph();
    assert!(g.len() > 30, "read {} files", g.len());
    if let Some(circle) = find_circle(&g) {
        panic!("import circle: {}", circle.join(" -> "));
    }
}

#[test]
fn pure_cores_import_no_adaptor_and_no_io() {
    let g = graph();
    for pure in PURE {
        let deps = g.get(*pure).unwrap_or_else(|| panic!("{pure} is gone"));
        for d in deps {
            let top = d.split(['/', '.']).next().unwrap();
            assert!(
                !IMPURE.contains(&top),
                "{pure} imports {d}: pure cores take facts as arguments"
            );
        }
    }
}

/// Below the adaptors and the loop: what the adaptors and the loop are
/// built on, which must not reach back up into them (#52: `views.rs` and
/// `command.rs` read the bus's rows from `wire.rs`, not from `bus/`).
const BELOW_THE_LOOP: &[&str] = &[
    "wire.rs",
    "worker.rs",
    "views.rs",
    "command.rs",
    "machine.rs",
    "node/",
    "store/",
    "runtime/",
    "inventory/",
];

/// The one import that still runs up a layer (#52 allows one): the
/// adaptors' commands, which the loop defines.
const UP_A_LAYER: &[(&str, &str)] = &[("bus/", "command.rs")];

#[test]
fn nothing_below_the_loop_imports_the_loop_or_an_adaptor() {
    let g = graph();
    let under = |file: &str, prefixes: &[&str]| prefixes.iter().any(|p| file.starts_with(p));
    for (file, deps) in &g {
        if !under(file, BELOW_THE_LOOP) {
            continue;
        }
        for d in deps {
            assert!(
                !under(d, &["bus/", "web/", "service/"]),
                "{file} imports {d}: code below the loop takes what it needs as arguments"
            );
        }
    }
    // The domain's worker knows nothing of how the ledger stores it.
    assert!(
        !g["worker.rs"].iter().any(|d| d.starts_with("store/")),
        "{:?}",
        g["worker.rs"]
    );
    // And the exception is still what it says.
    for (from, to) in UP_A_LAYER {
        assert!(
            g.iter()
                .any(|(f, d)| f.starts_with(from) && d.contains(*to)),
            "{from} no longer imports {to}: drop the exception"
        );
    }
}

#[test]
fn the_checker_sees_what_it_checks() {
    // An independent look at the two rules' inputs: these edges exist.
    let g = graph();
    assert!(g["views.rs"].contains("wire.rs"), "{:?}", g["views.rs"]);
    assert!(g["bus/manager.rs"].contains("command.rs"));
    assert!(g["service/publish.rs"].contains("service/mod.rs"));
    assert!(g["slicing/template.rs"].contains("json_fields.rs"));
    // And a circle is found when there is one.
    let text = code("use crate::{a::b, c};\nlet x = super::d::E; // crate::z\n");
    let p: Vec<String> = paths(&text)
        .into_iter()
        .map(|(r, s)| format!("{r}::{}", s.join("::")))
        .collect();
    assert_eq!(p, ["crate::a::b", "crate::c", "super::d::E"]);
    let edges = |list: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in list {
            g.entry(a.to_string()).or_default().insert(b.to_string());
        }
        g
    };
    let circle = find_circle(&edges(&[
        ("a.rs", "b.rs"),
        ("b.rs", "c/x.rs"),
        ("c/x.rs", "a.rs"),
    ]));
    assert_eq!(circle.unwrap().len(), 4);
    // Within a room (a mod.rs and its own files) is not a circle.
    assert!(find_circle(&edges(&[("c/mod.rs", "c/x.rs"), ("c/x.rs", "c/mod.rs")])).is_none());
}

#[test]
fn no_file_is_too_long_but_a_cohesive_pure_core() {
    let mut all = Vec::new();
    files(Path::new(SRC), &mut all);
    for f in all {
        let name = rel(&f);
        let lines = std::fs::read_to_string(&f).unwrap().lines().count();
        if lines > MAX_LINES {
            assert!(
                LARGE_PURE.contains(&name.as_str()),
                "{name} has {lines} lines: split it into rooms (docs/architecture.md)"
            );
        }
    }
}

/// Time-slicing's loop reads typed events and writes the ledger through
/// the node (#52): libvirt's own codes stay in the runtime (and the helper
/// binary that links libvirt), and nothing outside node/ and store/ holds
/// the store to write it.
#[test]
fn libvirts_codes_and_the_store_stay_in_their_rooms() {
    let mut all = Vec::new();
    files(Path::new(SRC), &mut all);
    for p in &all {
        let name = rel(p);
        let text = code(&std::fs::read_to_string(p).unwrap());
        if !name.starts_with("runtime/") && !name.starts_with("bin/") {
            assert!(
                !text.contains("virt::sys") && !text.contains("VIR_DOMAIN_EVENT"),
                "{name} reads libvirt's event codes: map them in runtime/ (VmEvent)"
            );
        }
        // The node hands out the store only to read (`Node::store` is &Store).
        if !name.starts_with("node/") && !name.starts_with("store/") {
            assert!(
                !text.contains("store_mut"),
                "{name} writes the ledger past the node"
            );
        }
    }
}
