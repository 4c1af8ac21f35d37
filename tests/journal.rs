//! The journal fields and the message catalog as an operator queries them,
//! against a real systemd-journald: tests/journal.sh does the work inside a
//! private mount namespace (it needs root, as CI has).

mod common;

#[test]
fn journalctl_finds_each_event_by_its_fields_and_explains_it() {
    assert!(
        common::is_root(),
        "this test mounts in a private namespace: run the suite as root (as CI does)"
    );
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "bash"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/journal.sh"))
        .arg(env!("CARGO_BIN_EXE_astraeusd"))
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/packaging/catalog/astraeusd.catalog"
        ))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("journal: OK"),
        "{text}"
    );
}
