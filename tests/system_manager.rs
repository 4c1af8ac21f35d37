//! Unit workers under a real systemd system manager: tests/system_manager.sh
//! boots systemd as PID 1 of a private PID and mount namespace, the host's /
//! read-only in there (it needs root, as CI has).

mod common;

#[test]
fn unit_workers_under_a_real_system_manager() {
    assert!(
        common::is_root(),
        "this test boots systemd in a private namespace: run the suite as root (as CI does)"
    );
    let member = "astraeus-test-a";
    common::ensure_user(member);
    let dir = common::open_tempdir();
    let sim = dir.path().join("majin.toml");
    std::fs::write(&sim, common::MAJIN_TOML).unwrap();
    let out = std::process::Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/system_manager.sh"
        ))
        .args([
            env!("CARGO_BIN_EXE_astraeusd"),
            env!("CARGO_BIN_EXE_astraeusctl"),
            common::policy_file().to_str().unwrap(),
            member,
            sim.to_str().unwrap(),
            concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/astraeusd.service"),
        ])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("system manager: OK"),
        "{text}"
    );
}
