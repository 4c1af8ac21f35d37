//! The session daemon's home, and a desktop user's day with it (#51),
//! under a real systemd user manager, with the user units as installed:
//! tests/session_home.sh does the work inside a private mount namespace (it
//! needs root, as CI has).

mod common;

/// The ledger lives in ~/.local/state/astraeus on every systemd; an older
/// build's in ~/.config/astraeus (where systemd 252, this machine's, maps a
/// user unit's StateDirectory=) is carried over once with its log, every
/// row kept; /etc/astraeus/node.toml is never read by a session daemon.
/// Then as a desktop user meets it (item 7): the notification unit as
/// installed, dunst on Xvfb, `astraeusctl --session` submits, the worker
/// is in the ledger's one home, and its placement after waiting is shown.
/// Seen failing before: the unit's daemon opened the old ledger in place,
/// and served its page on the address the system's file named; and with
/// the notification unit not started.
#[test]
fn a_session_daemon_keeps_its_ledger_in_one_home_and_reads_no_system_config() {
    let dir = common::open_tempdir();
    let sim = dir.path().join("majin.toml");
    std::fs::write(&sim, common::MAJIN_TOML).unwrap();
    common::run_in_private_mounts(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/session_home.sh"),
        &[
            env!("CARGO_BIN_EXE_astraeusd"),
            env!("CARGO_BIN_EXE_astraeusctl"),
            sim.to_str().unwrap(),
        ],
        "session home: ok",
    );
}
