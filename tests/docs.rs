//! Every example in README.md, CONTRIBUTING.md and docs/*.md runs here, so
//! the docs cannot drift from the product.
//!
//! - A ```` ```console ```` block is run: each `$ ` line is a command (bash;
//!   a line ending in `\` continues it), the lines after it are its exact
//!   output (stdout and stderr together; a line `...` stands for any number
//!   of lines). A file's blocks run in order against one real daemon on a
//!   private bus (reached as the system bus: `DBUS_SYSTEM_BUS_ADDRESS`) with
//!   the built-in simulated machine `majin`, libvirt's test driver and the
//!   zone UTC, in a directory holding the files of `tests/docs/`.
//! - A ```` ```sh ```` block shows commands a private bus cannot run
//!   (packages, systemd, a GPU): a comment in it names what runs them
//!   (`covered by PATH`), and PATH must exist.
//! - No other block may hold `$ ` commands.

mod common;
use common::*;
use std::path::{Path, PathBuf};

struct Block {
    lang: String,
    line: usize,
    text: String,
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, l) in markdown.lines().enumerate() {
        if let Some(fence) = l.trim_start().strip_prefix("```") {
            match open.take() {
                Some(b) => out.push(b),
                None => {
                    open = Some(Block {
                        lang: fence.trim().to_string(),
                        line: i + 1,
                        text: String::new(),
                    })
                }
            }
        } else if let Some(b) = &mut open {
            b.text.push_str(l);
            b.text.push('\n');
        }
    }
    out
}

/// (command, expected output lines) pairs of a console block.
fn examples(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut continued = false;
    for l in text.lines() {
        if continued {
            let (cmd, _) = out.last_mut().unwrap();
            cmd.push('\n');
            cmd.push_str(l);
            continued = l.ends_with('\\');
        } else if let Some(cmd) = l.strip_prefix("$ ") {
            out.push((cmd.to_string(), Vec::new()));
            continued = cmd.ends_with('\\');
        } else if let Some((_, want)) = out.last_mut() {
            want.push(l.trim_end().to_string());
        }
    }
    out
}

/// Whether `got` matches `want`, where a `...` line in `want` matches any
/// number of lines.
fn matches(want: &[String], got: &[String]) -> bool {
    match want.split_first() {
        None => got.is_empty(),
        Some((w, rest)) if w == "..." => (0..=got.len()).any(|k| matches(rest, &got[k..])),
        Some((w, rest)) => got.first() == Some(w) && matches(rest, &got[1..]),
    }
}

fn docs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    more.sort();
    files.extend(more);
    files
}

const DOC_CONFIG: &str = "[inventory]\nrefresh_seconds = 0.2\n\
    [schedule]\ntime_zone = \"UTC\"\nhandoff_buffer_seconds = 0\n\
    [runtime]\nlibvirt_uri = \"test:///default\"\n";

/// Runs one file's console blocks against a fresh daemon; the failures.
fn run_file(path: &Path, blocks: &[Block]) -> Vec<String> {
    let dir = open_tempdir();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/docs");
    for e in std::fs::read_dir(&fixtures).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), work.join(e.file_name())).unwrap();
    }
    let bus = Bus::session();
    let _d = start_majin(&bus, dir.path(), DOC_CONFIG, &[]);
    let bin = Path::new(env!("CARGO_BIN_EXE_astraeusctl"))
        .parent()
        .unwrap();
    let search_path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut failures = Vec::new();
    for b in blocks.iter().filter(|b| b.lang == "console") {
        for (cmd, want) in examples(&b.text) {
            let out = std::process::Command::new("bash")
                .args(["-c", &format!("{cmd}\n"), "doc"])
                .current_dir(&work)
                .env("PATH", &search_path)
                .env("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)
                .env("TZ", "UTC")
                .env("NO_COLOR", "1")
                .env("COLUMNS", "100")
                .output()
                .unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let got: Vec<String> = text.lines().map(|l| l.trim_end().to_string()).collect();
            let want: Vec<String> = want
                .into_iter()
                .rev()
                .skip_while(String::is_empty)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            if !matches(&want, &got) {
                failures.push(format!(
                    "{}:{}: `{cmd}`\n--- the docs say\n{}\n--- it printed\n{}",
                    path_name(path),
                    b.line,
                    want.join("\n"),
                    got.join("\n")
                ));
            }
        }
    }
    failures
}

fn path_name(p: &Path) -> String {
    p.strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap_or(p)
        .display()
        .to_string()
}

#[test]
fn every_example_in_the_docs_runs_as_shown() {
    let mut failures = Vec::new();
    let mut ran = 0;
    for file in docs() {
        let text = std::fs::read_to_string(&file).unwrap();
        let bs = blocks(&text);
        for b in &bs {
            let has_commands = b.text.lines().any(|l| l.starts_with("$ "));
            match b.lang.as_str() {
                "console" => ran += examples(&b.text).len(),
                "sh" | "bash" | "shell" => {
                    // The first word after "covered by" (in any comment) is the path.
                    let covered: Vec<&str> = b
                        .text
                        .lines()
                        .filter_map(|l| l.split_once("covered by ").map(|(_, rest)| rest))
                        .filter_map(|rest| rest.split_whitespace().next())
                        .map(|p| p.trim_end_matches([')', ',', ';', '.', ':']))
                        .collect();
                    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
                    // The README's two commands: this file runs scripts/try
                    // (below) and .ci/run runs scripts/test.
                    let commands: Vec<&str> = b
                        .text
                        .lines()
                        .filter_map(|l| l.split_whitespace().next())
                        .filter(|w| !w.starts_with('#'))
                        .collect();
                    let the_two = !commands.is_empty()
                        && commands
                            .iter()
                            .all(|c| ["scripts/try", "scripts/test"].contains(c));
                    if !the_two
                        && (covered.is_empty()
                            || !covered.iter().all(|c| root.join(c.trim()).exists()))
                    {
                        failures.push(format!(
                            "{}:{}: a sh block must name the test that runs it (`# covered by tests/…`)",
                            path_name(&file),
                            b.line
                        ));
                    }
                }
                _ if has_commands => failures.push(format!(
                    "{}:{}: `$ ` commands outside a console block are never run",
                    path_name(&file),
                    b.line
                )),
                _ => {}
            }
        }
        if bs.iter().any(|b| b.lang == "console") {
            failures.extend(run_file(&file, &bs));
        }
    }
    // Pictures the docs show are there.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in docs() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (_, rest) in text.match_indices("](").map(|(i, _)| ((), &text[i + 2..])) {
            let target = rest.split(')').next().unwrap_or("");
            if target.ends_with(".png") {
                let base = file.parent().unwrap();
                if !base.join(target).exists() && !root.join(target).exists() {
                    failures.push(format!("{}: no picture {target}", path_name(&file)));
                }
            }
        }
    }
    assert!(ran >= 10, "only {ran} examples found");
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

#[test]
fn the_matcher_is_strict_but_for_ellipses() {
    let v = |s: &str| s.lines().map(str::to_string).collect::<Vec<_>>();
    assert!(matches(&v("a\nb"), &v("a\nb")));
    assert!(!matches(&v("a\nb"), &v("a\nc")));
    assert!(!matches(&v("a"), &v("a\nb")));
    assert!(matches(&v("a\n...\nd"), &v("a\nb\nc\nd")));
    assert!(matches(&v("a\n..."), &v("a")));
    let ex = examples("$ one \\\n  two\nout\n$ three\n");
    assert_eq!(
        ex[0],
        ("one \\\n  two".to_string(), vec!["out".to_string()])
    );
    assert_eq!(ex[1], ("three".to_string(), vec![]));
}

/// docs/operations.md's configuration table is the one node.toml(5) is made
/// from: generated from the example config that ships.
#[test]
fn the_config_reference_matches_the_shipped_example() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    let table = astraeusd::config_doc::markdown(astraeusd::config_doc::EXAMPLE);
    assert!(
        doc.contains(&table),
        "docs/operations.md's config table differs from packaging/node.toml: \
         paste `cargo run --example gen-docs -- --config-markdown` between its markers"
    );
}

/// The backup docs/operations.md gives: `sqlite3 … ".backup …"` of a live
/// daemon's ledger, restored while it is stopped, brings back its workers.
#[test]
fn the_documented_backup_restores_the_ledger() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = start_majin(&bus, dir.path(), DOC_CONFIG, &[]);
    let a = &bus.address;
    for (name, gb) in [("listen", "2.2"), ("voice", "4.2")] {
        assert!(manager(a, None, "SubmitWorker", &["s", &shared_spec(name, gb)]).ok);
    }
    let ledger = d.state.join("ledger.db");
    let copy = dir.path().join("astraeus-ledger.db");
    // The command as the docs give it, with these paths.
    let o = std::process::Command::new("sqlite3")
        .arg(&ledger)
        .arg(format!(".backup {}", copy.display()))
        .output()
        .expect("sqlite3 runs (.ci/run installs it)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Changes after the backup are not in it.
    assert!(manager(a, None, "StopWorker", &["s", "voice"]).ok);
    assert!(d.stop().success());
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", ledger.display()));
    }
    std::fs::copy(&copy, &ledger).unwrap();
    let _d = Daemon::start(&bus, dir.path(), &dir.path().join("majin.toml"), &[]);
    assert_eq!(state(a, "listen"), "s \"running\"\n");
    assert_eq!(
        state(a, "voice"),
        "s \"running\"\n",
        "the backup's state is back"
    );
}

/// The README's first command: `scripts/try` runs the daemon and prints how
/// to reach it; following what it prints works; Ctrl-C stops the daemon and
/// its bus.
#[test]
fn scripts_try_runs_the_daemon_the_tour_talks_to() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let root = env!("CARGO_MANIFEST_DIR");
    let bin = Path::new(env!("CARGO_BIN_EXE_astraeusd")).parent().unwrap();
    let mut child = Command::new(format!("{root}/scripts/try"))
        .env("ASTRAEUS_TRY_BIN", bin)
        .env("ASTRAEUS_TRY_PORT", free_port().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut address = None;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.trim().strip_prefix("export DBUS_SYSTEM_BUS_ADDRESS='") {
            address = rest.split('\'').next().map(str::to_string);
        }
        if line.starts_with("Ctrl-C stops it.") {
            break;
        }
    }
    let address = address.expect("scripts/try prints the bus address");
    // As its instructions say: the system bus address, and astraeusctl on PATH.
    let gpus = || {
        Command::new(bin.join("astraeusctl"))
            .arg("gpus")
            .env("DBUS_SYSTEM_BUS_ADDRESS", &address)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    eventually("the daemon answers", || {
        gpus().contains("0    NVIDIA GeForce RTX 4060  8 GB   7 GB     1 GB     free")
    });
    // Ctrl-C: the daemon stops, and so does the bus it made.
    unsafe {
        libc::kill(-(child.id() as i32), libc::SIGINT);
    }
    child.wait().unwrap();
    eventually("the bus is gone", || !busctl(&address, &["status"]).ok);
}
