//! The subcommands' man pages stand alone, as man(1) shows them: a SYNOPSIS
//! that names what each option takes, the version in the footer, EXIT
//! STATUS and EXAMPLES on every page, examples that parse as written, and
//! no warning from groff.

#[path = "../examples/gen-docs/man.rs"]
mod man;

use astraeusd::cli::CtlArgs;
use clap::{CommandFactory, Parser};
use std::process::Command;

fn pages() -> Vec<(String, String)> {
    let mut root = CtlArgs::command().disable_help_subcommand(true);
    root.build();
    man::subcommand_pages(&root, env!("CARGO_PKG_VERSION"))
}

/// One page through `man -l`, as a reader sees it: (text, groff's warnings).
fn shown(dir: &std::path::Path, file: &str, roff: &str) -> (String, String) {
    let path = dir.join(file);
    std::fs::write(&path, roff).unwrap();
    let o = Command::new("man")
        .args(["--warnings", "-l"])
        .arg(&path)
        .env("MANWIDTH", "100")
        .env("MAN_KEEP_FORMATTING", "0")
        .env("LANG", "C.UTF-8")
        .output()
        .expect("man-db installed (apt-get install man-db)");
    // What a terminal shows: bold and underline by overstrike undone.
    let mut text = String::new();
    for c in String::from_utf8_lossy(&o.stdout).chars() {
        if c == '\u{8}' {
            text.pop();
        } else {
            text.push(c);
        }
    }
    (text, String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn every_subcommand_page_stands_alone() {
    let dir = tempfile::tempdir().unwrap();
    let pages = pages();
    assert!(pages.len() >= 20, "{} pages", pages.len());
    for (file, roff) in &pages {
        let (text, warnings) = shown(dir.path(), file, roff);
        assert!(warnings.trim().is_empty(), "{file}: {warnings}");
        let plain: String = text.replace("\u{2010}\n", "").replace('\u{2010}', "-");
        for section in ["SYNOPSIS", "EXIT STATUS", "EXAMPLES", "SEE ALSO"] {
            assert!(
                plain.lines().any(|l| l == section),
                "{file}: no {section}:\n{plain}"
            );
        }
        let footer = plain.lines().rev().find(|l| !l.trim().is_empty()).unwrap();
        assert!(
            footer.contains(&format!("astraeusctl {}", env!("CARGO_PKG_VERSION"))),
            "{file}: footer {footer:?}"
        );
        let examples = plain.split("\nEXAMPLES\n").nth(1).unwrap();
        assert!(
            examples.contains("astraeusctl") || examples.contains("systemctl"),
            "{file}: no example:\n{examples}"
        );
        // Every option that takes a value shows it, as --help does.
        let synopsis: String = plain
            .split("\nSYNOPSIS\n")
            .nth(1)
            .unwrap()
            .split("\n\n")
            .next()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        for (option, value) in [
            ("--bus-address", "ADDR"),
            ("--timeout", "SECONDS"),
            ("--color", "WHEN"),
        ] {
            assert!(
                synopsis.contains(&format!("[{option} {value}]")),
                "{file}: {synopsis}"
            );
        }
    }
}

/// Each page has its examples, each names a page that exists, and every
/// astraeusctl line among them parses as written.
#[test]
fn the_examples_cover_every_page_and_parse() {
    let files: Vec<String> = pages().into_iter().map(|(f, _)| f).collect();
    for f in &files {
        let path = f.trim_start_matches("astraeusctl-").trim_end_matches(".1");
        assert!(
            man::EXAMPLES
                .iter()
                .any(|(p, e)| *p == path && !e.is_empty()),
            "no examples for {f}"
        );
    }
    for (path, examples) in man::EXAMPLES {
        assert!(
            files.contains(&format!("astraeusctl-{path}.1")),
            "examples for no page: {path}"
        );
        for (line, _) in *examples {
            for part in line.split('|').map(str::trim) {
                if !part.starts_with("astraeusctl ") {
                    continue;
                }
                let words: Vec<&str> = part.split_whitespace().collect();
                if let Err(e) = CtlArgs::try_parse_from(&words) {
                    panic!("{path}: `{part}` does not parse: {e}");
                }
            }
        }
    }
}

/// Every help, the top one and each subcommand's (nested ones too), fits
/// a terminal of 80 columns (tmux's default pane; #67): clap wraps to the
/// width COLUMNS gives, words whole. Seen failing before: 3 to 15 lines
/// over 80 on every page, broken mid-word by the terminal.
#[test]
fn every_help_fits_80_columns() {
    fn paths(cmd: &clap::Command, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        out.push(prefix.clone());
        for sub in cmd.get_subcommands() {
            let mut p = prefix.clone();
            p.push(sub.get_name().to_string());
            paths(sub, p, out);
        }
    }
    let mut root = CtlArgs::command().disable_help_subcommand(true);
    root.build();
    let mut all = Vec::new();
    paths(&root, Vec::new(), &mut all);
    assert!(all.len() > 16, "{all:?}");
    for path in all {
        for flag in ["-h", "--help"] {
            let o = Command::new(env!("CARGO_BIN_EXE_astraeusctl"))
                .args(&path)
                .arg(flag)
                .env("COLUMNS", "80")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&o.stdout);
            assert!(
                o.status.success() && text.lines().count() > 3,
                "{path:?}: {text}"
            );
            for line in text.lines() {
                assert!(
                    line.chars().count() <= 80,
                    "astraeusctl {} {flag}: a line of {} columns:\n{line}",
                    path.join(" "),
                    line.chars().count()
                );
            }
        }
    }
}
