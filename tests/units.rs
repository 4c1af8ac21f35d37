//! Unit workers on a real systemd user manager: tests/units.sh does the work
//! inside a private mount namespace (it needs root, as CI has).

mod common;
#[path = "common/fake_nvml.rs"]
mod fake_nvml;

#[test]
fn unit_workers_on_a_real_user_manager() {
    let dir = common::open_tempdir();
    let sim = dir.path().join("majin.toml");
    std::fs::write(&sim, common::MAJIN_TOML).unwrap();
    common::run_in_private_mounts(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/units.sh"),
        &[
            env!("CARGO_BIN_EXE_astraeusd"),
            env!("CARGO_BIN_EXE_astraeusctl"),
            sim.to_str().unwrap(),
            fake_nvml::fake_lib(false).to_str().unwrap(),
            fake_nvml::fake_lib(true).to_str().unwrap(),
        ],
        "units: OK",
    );
}
