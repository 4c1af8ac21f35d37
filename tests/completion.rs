//! Completion as a shell user meets it: the registration astraeusctl prints
//! (`source <(COMPLETE=bash astraeusctl)`, what the package installs),
//! sourced in a real bash, zsh and fish, completes the names only the
//! daemon knows — workers, templates, GPUs — from the daemon on the bus
//! the words name.

mod common;
use common::*;
use std::process::Command;

/// Seen failing before: nothing but file names was offered (the completion
/// scripts were static). Every shell the README names, the same lines.
#[test]
fn each_shell_completes_the_daemons_workers_templates_and_gpus() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let _d = start_majin(&bus, dir.path(), TEST_DRIVER, &[]);
    let a = &bus.address;
    for (name, gb) in [("listen", "2.2"), ("voice", "4.2"), ("llama", "0.5")] {
        assert!(manager(a, None, "SubmitWorker", &["s", &shared_spec(name, gb)]).ok);
    }
    define_template(a, "research");
    let lines = [
        "stop ",
        "stop l",
        "status vo",
        "show ",
        "sharers ",
        "template resume ",
        "schedule show r",
    ];
    let sorted = |v: &Vec<String>| {
        let mut v = v.clone();
        v.sort();
        v
    };
    for shell in ["bash", "zsh", "fish"] {
        let got = completions_in(shell, a, &lines);
        if got.is_empty() {
            continue; // the shell is missing and not required
        }
        assert_eq!(
            sorted(&got[0]),
            ["listen", "llama", "voice"],
            "{shell}: {got:?}"
        );
        assert_eq!(sorted(&got[1]), ["listen", "llama"], "{shell}: {got:?}");
        assert_eq!(got[2], ["voice"], "{shell}: {got:?}");
        assert!(got[3].contains(&"listen".to_string()), "{shell}: {got:?}");
        assert_eq!(got[4], ["0"], "{shell}: {got:?}");
        assert_eq!(got[5], ["research"], "{shell}: {got:?}");
        assert_eq!(got[6], ["research"], "{shell}: {got:?}");
    }
    // A bus with no daemon: nothing, at once, and no error on the line.
    let empty = Bus::session();
    let started = std::time::Instant::now();
    let got = completions_in("bash", &empty.address, &["stop "]);
    assert!(got[0].is_empty(), "{got:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

/// bash's, zsh's or fish's completion of each line (its last word being
/// completed), the names offered (options left out), one list per line:
/// each shell runs the registration astraeusctl prints for it (README:
/// `source <(COMPLETE=bash astraeusctl)`, what the package installs). zsh's completion system only runs inside a widget: its display calls
/// (`compdef`, `_describe`) are replaced by ones that print what they are
/// given, and the registered function runs with `words`/`CURRENT` as the
/// widget would set them. fish completes a command line with `complete -C`.
fn completions_in(shell: &str, address: &str, lines: &[&str]) -> Vec<Vec<String>> {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_astraeusctl"))
        .parent()
        .unwrap();
    let mut script = match shell {
        "bash" => String::from(
            "source <(COMPLETE=bash astraeusctl)\n\
             complete_line() {\n\
               read -ra COMP_WORDS <<< \"$1\"\n\
               [[ $1 == *' ' ]] && COMP_WORDS+=('')\n\
               COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); COMP_LINE=$1; COMP_POINT=${#1}; COMP_TYPE=9\n\
               _clap_complete_astraeusctl astraeusctl \"${COMP_WORDS[COMP_CWORD]}\" \"${COMP_WORDS[COMP_CWORD-1]}\"\n\
               printf '%s\\n' \"${COMPREPLY[@]}\"; echo '--'\n\
             }\n",
        ),
        "zsh" => String::from(
            "compdef() { : }\n\
             _describe() { print -l -- \"${(@P)${@[-1]}}\" }\n\
             eval \"$(COMPLETE=zsh astraeusctl)\"\n\
             complete_line() {\n\
               local -a words; words=(${(z)1}); [[ $1 == *' ' ]] && words+=('')\n\
               local CURRENT=${#words}\n\
               _clap_dynamic_completer_astraeusctl; print -- '--'\n\
             }\n",
        ),
        "fish" => String::from(
            "COMPLETE=fish astraeusctl | source\n\
             function complete_line; complete -C \"$argv[1]\"; printf '%s\\n' --; end\n",
        ),
        other => panic!("{other}"),
    };
    for line in lines {
        script += &format!("complete_line 'astraeusctl --bus-address {address} {line}'\n");
    }
    let o = Command::new(shell)
        .args(["-c", &script])
        .env(
            "PATH",
            format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
        )
        .output();
    let Ok(o) = o else {
        require_component(false, shell);
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{shell}: {text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    text.split("--\n")
        .take(lines.len())
        .map(|b| {
            b.lines()
                .filter(|l| !l.is_empty())
                // fish and zsh show a value's help after a tab or a colon.
                .map(|l| l.split(['\t', ':']).next().unwrap().to_string())
                .filter(|w| !w.starts_with('-'))
                .collect()
        })
        .collect()
}
