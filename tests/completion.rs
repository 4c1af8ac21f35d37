//! Completion as a bash user meets it: the registration astraeusctl prints
//! (`source <(COMPLETE=bash astraeusctl)`, what the package installs),
//! sourced in a real bash, completes the names only the daemon knows —
//! workers, templates, GPUs — from the daemon on the bus the words name.

mod common;
use common::*;
use std::process::Command;

/// bash's completion of each line (its last word being completed), as
/// the registration's function answers it: one block per line.
fn completions(address: &str, lines: &[&str]) -> Vec<Vec<String>> {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_astraeusctl"))
        .parent()
        .unwrap();
    let mut script = String::from(
        "source <(COMPLETE=bash astraeusctl)\n\
         complete_line() {\n\
           read -ra COMP_WORDS <<< \"$1\"\n\
           [[ $1 == *' ' ]] && COMP_WORDS+=('')\n\
           COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); COMP_LINE=$1; COMP_POINT=${#1}; COMP_TYPE=9\n\
           _clap_complete_astraeusctl astraeusctl \"${COMP_WORDS[COMP_CWORD]}\" \"${COMP_WORDS[COMP_CWORD-1]}\"\n\
           printf '%s\\n' \"${COMPREPLY[@]}\"; echo '--'\n\
         }\n",
    );
    for line in lines {
        script += &format!("complete_line 'astraeusctl --bus-address {address} {line}'\n");
    }
    let o = Command::new("bash")
        .args(["-c", &script])
        .env(
            "PATH",
            format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    text.split("--\n")
        .take(lines.len())
        .map(|b| {
            b.lines()
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect()
        })
        .collect()
}

/// Seen failing before: nothing but file names was offered (the completion
/// scripts were static).
#[test]
fn bash_completes_the_daemons_workers_templates_and_gpus() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let _d = start_majin(&bus, dir.path(), TEST_DRIVER, &[]);
    let a = &bus.address;
    for (name, gb) in [("listen", "2.2"), ("voice", "4.2"), ("llama", "0.5")] {
        assert!(manager(a, None, "SubmitWorker", &["s", &shared_spec(name, gb)]).ok);
    }
    define_template(a, "research");
    let got = completions(
        a,
        &[
            "stop ",
            "stop l",
            "status vo",
            "show ",
            "sharers ",
            "template resume ",
            "schedule show r",
        ],
    );
    // The names offered (with an empty word, bash is offered the options too).
    let got: Vec<Vec<String>> = got
        .into_iter()
        .map(|b| b.into_iter().filter(|w| !w.starts_with('-')).collect())
        .collect();
    let sorted = |v: &Vec<String>| {
        let mut v = v.clone();
        v.sort();
        v
    };
    assert_eq!(sorted(&got[0]), ["listen", "llama", "voice"], "{got:?}");
    assert_eq!(sorted(&got[1]), ["listen", "llama"], "{got:?}");
    assert_eq!(got[2], ["voice"], "{got:?}");
    assert!(got[3].contains(&"listen".to_string()), "{got:?}");
    assert_eq!(got[4], ["0"], "{got:?}");
    assert_eq!(got[5], ["research"], "{got:?}");
    assert_eq!(got[6], ["research"], "{got:?}");
    // A bus with no daemon: nothing, at once, and no error on the line.
    let empty = Bus::session();
    let started = std::time::Instant::now();
    let got = completions(&empty.address, &["stop "]);
    assert!(got[0].iter().all(|w| w.starts_with('-')), "{got:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}
