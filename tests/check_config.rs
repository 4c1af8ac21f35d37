//! `astraeusd --check-config` (as `nginx -t`): the file a start would read,
//! checked as a start checks it; and start-up errors in plain words (#54).

use std::process::Command;

fn check(config: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.toml");
    std::fs::write(&path, config).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_astraeusd"))
        .args(["--check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).replace(path.to_str().unwrap(), "FILE");
    (o.status.code(), text(&o.stdout), text(&o.stderr))
}

/// Fine: 0 and "ok". A value out of range: 1, the key, its line and what
/// would be accepted. A parse error: its line. Seen failing before: the
/// flag did not exist (a usage error, 2).
#[test]
fn check_config_says_ok_or_the_key_and_its_line() {
    let (code, out, _) = check("[inventory]\nrefresh_seconds = 2\n");
    assert_eq!((code, out.as_str()), (Some(0), "FILE: ok\n"));
    let (code, _, err) = check("machine = \"majin\"\n[inventory]\nrefresh_seconds = 0\n");
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(
        err,
        "astraeusd: config FILE, line 3 (`refresh_seconds = 0`): inventory.refresh_seconds: \
         a number of seconds from 0.1 to 3600\n"
    );
    let (code, _, err) = check("[http]\nlisten = \"nowhere\"\n");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("line 2 (`listen = \"nowhere\"`): http.listen: an address and port"),
        "{err}"
    );
    let (code, _, err) = check("[inventory]\nrefreshh = 1\n");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("config FILE, line 2 (`refreshh = 1`)"),
        "{err}"
    );
    assert!(!err.contains("InvalidRequest"), "plain words: {err}");
}

/// A daemon that cannot start says why without the D-Bus error's kind.
#[test]
fn start_up_errors_are_in_plain_words() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.toml");
    std::fs::write(&path, "[inventory]\nrefresh_seconds = 0\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_astraeusd"))
        .args([
            "--sim",
            "--bus-address",
            "unix:path=/nonexistent",
            "--config",
        ])
        .arg(&path)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env_remove("NOTIFY_SOCKET")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("cannot start: inventory.refresh_seconds: a number of seconds"),
        "{err}"
    );
    assert!(!err.contains("InvalidRequest"), "{err}");
}
