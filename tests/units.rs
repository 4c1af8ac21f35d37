//! Unit workers on a real systemd user manager: tests/units.sh does the work
//! inside a private mount namespace (it needs root, as CI has).

mod common;

#[test]
fn unit_workers_on_a_real_user_manager() {
    assert!(
        common::is_root(),
        "this test mounts in a private namespace: run the suite as root (as CI does)"
    );
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "bash"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/units.sh"))
        .arg(env!("CARGO_BIN_EXE_astraeusd"))
        .arg(env!("CARGO_BIN_EXE_astraeusctl"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("units: OK"), "{text}");
}
