//! The journal fields and the message catalog as an operator queries them,
//! against a real systemd-journald: tests/journal.sh does the work inside a
//! private mount namespace (it needs root, as CI has).

mod common;

#[test]
fn journalctl_finds_each_event_by_its_fields_and_explains_it() {
    common::run_in_private_mounts(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/journal.sh"),
        &[
            env!("CARGO_BIN_EXE_astraeusd"),
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/packaging/catalog/astraeusd.catalog"
            ),
        ],
        "journal: OK",
    );
}
