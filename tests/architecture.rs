//! The house rules of src/, checked on the source itself so that they hold
//! as the code grows (docs/architecture.md explains them):
//! - the layers docs/architecture.md draws (its ```layers block, read
//!   here: one list for the page and the check): every file in one layer,
//!   every import into a layer its own may use;
//! - no import circle among src/ files (a directory module's mod.rs and its
//!   own files are one room: they implement one type together);
//! - no file over 900 lines (tests in files of their own).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
const ARCHITECTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/architecture.md");
const MAX_LINES: usize = 900;

/// One layer of the house: the rooms in it (a folder ends in `/`) and the
/// layers below it that it may import.
#[derive(Debug)]
struct Layer {
    name: String,
    rooms: Vec<String>,
    may_import: Vec<String>,
}

/// The layers as docs/architecture.md draws them, top first. A line reads
/// `name: room room … -> layer layer …`.
fn layers(doc: &str) -> Vec<Layer> {
    let start = doc
        .find("```layers\n")
        .expect("docs/architecture.md has a ```layers block");
    let block = &doc[start + "```layers\n".len()..];
    let block = &block[..block.find("```").expect("the layers block ends")];
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (name, rest) = l.split_once(':').unwrap_or_else(|| panic!("no name: {l}"));
            let (rooms, below) = rest.split_once("->").unwrap_or((rest, ""));
            let words = |s: &str| s.split_whitespace().map(str::to_string).collect();
            Layer {
                name: name.trim().to_string(),
                rooms: words(rooms),
                may_import: words(below),
            }
        })
        .collect()
}

/// The layer a file is in: the layer of its longest matching room.
fn layer_of<'l>(layers: &'l [Layer], file: &str) -> Option<&'l Layer> {
    layers
        .iter()
        .flat_map(|l| l.rooms.iter().map(move |r| (l, r)))
        .filter(|(_, r)| {
            if r.ends_with('/') {
                file.starts_with(r.as_str())
            } else {
                file == r.as_str()
            }
        })
        .max_by_key(|(_, r)| r.len())
        .map(|(l, _)| l)
}

/// Every import that goes into a layer its file's layer may not use.
fn layer_breaks(layers: &[Layer], g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut out = Vec::new();
    for (file, deps) in g {
        let Some(from) = layer_of(layers, file) else {
            out.push(format!("{file} is in no layer"));
            continue;
        };
        for d in deps {
            let Some(to) = layer_of(layers, d) else {
                out.push(format!("{d} is in no layer"));
                continue;
            };
            if to.name != from.name && !from.may_import.contains(&to.name) {
                out.push(format!("{file} ({}) imports {d} ({})", from.name, to.name));
            }
        }
    }
    out
}

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
fn imports_follow_the_layers_the_docs_draw() {
    let doc = std::fs::read_to_string(ARCHITECTURE).unwrap();
    let layers = layers(&doc);
    assert!(layers.len() >= 5, "{layers:?}");
    // Every layer it may import is one drawn below it.
    for (i, l) in layers.iter().enumerate() {
        for below in &l.may_import {
            assert!(
                layers[i + 1..].iter().any(|b| &b.name == below),
                "layer {} may import {below}, which is not drawn below it",
                l.name
            );
        }
    }
    let breaks = layer_breaks(&layers, &graph());
    assert!(breaks.is_empty(), "{}", breaks.join("\n"));
}

#[test]
fn the_checker_sees_what_it_checks() {
    // An independent look at the two rules' inputs: these edges exist.
    let g = graph();
    assert!(g["views.rs"].contains("wire.rs"), "{:?}", g["views.rs"]);
    assert!(g["bus/manager.rs"].contains("command.rs"));
    assert!(g["service/publish.rs"].contains("service/mod.rs"));
    assert!(g["slicing/template/mod.rs"].contains("json_fields.rs"));
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
    // A probe import is caught: the engine taking a runtime's type.
    let doc = std::fs::read_to_string(ARCHITECTURE).unwrap();
    let layers = layers(&doc);
    let mut probe = graph();
    probe
        .get_mut("node/workloads.rs")
        .unwrap()
        .insert("runtime/podman.rs".into());
    assert_eq!(
        layer_breaks(&layers, &probe),
        ["node/workloads.rs (engine) imports runtime/podman.rs (backends)"]
    );
    assert_eq!(layer_of(&layers, "report/sweep.rs").unwrap().name, "pure");
    assert!(layer_of(&layers, "nowhere.rs").is_none());
    // Within a room (a mod.rs and its own files) is not a circle.
    assert!(find_circle(&edges(&[("c/mod.rs", "c/x.rs"), ("c/x.rs", "c/mod.rs")])).is_none());
}

#[test]
fn no_file_is_too_long() {
    let mut all = Vec::new();
    files(Path::new(SRC), &mut all);
    for f in all {
        let name = rel(&f);
        let lines = std::fs::read_to_string(&f).unwrap().lines().count();
        assert!(
            lines <= MAX_LINES,
            "{name} has {lines} lines: split it into rooms (docs/architecture.md)"
        );
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
