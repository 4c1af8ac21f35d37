//! GPU locks any user can take on every distribution (#51, item 3): the
//! package's lock directory, on a /run as upstream systemd makes it.
//! tests/lock_dir.sh does the work in a private mount namespace (root, as
//! CI has), with the daemon reading GPUs through the fake NVML.

mod common;
#[path = "common/fake_nvml.rs"]
mod fake_nvml;

/// With /run/lock 0755 root, a user's daemon says the real error and what
/// to run; the package's tmpfiles.d line makes /run/astraeus-locks, where
/// the user's daemon then manages its GPUs and the system daemon takes its
/// locks too. Seen failing before: the daemon used /run/lock only, and
/// managed no GPU with the lock directory made.
#[test]
fn any_users_daemon_takes_its_gpu_locks_where_the_package_makes_room() {
    let user = "astraeus-locker";
    common::ensure_user(user);
    let dir = common::open_tempdir();
    let fx = dir.path().join("gpus.txt");
    let gpu = |i: usize, uuid: &str, gib: u64| {
        format!(
            "gpu uuid={uuid} name=NVIDIA_GPU total={} used=0 reserved=0 bus=00000000:0{i}:00.0 \
             power=60000 energy=1000 util=3\n",
            gib << 30
        )
    };
    std::fs::write(&fx, gpu(0, "GPU-4060", 8) + &gpu(1, "GPU-L4", 24)).unwrap();
    let lib = fake_nvml::fake_lib(false);
    common::run_in_private_mounts(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/lock_dir.sh"),
        &[
            env!("CARGO_BIN_EXE_astraeusd"),
            lib.to_str().unwrap(),
            fx.to_str().unwrap(),
            concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/astraeusd.tmpfiles"),
            user,
        ],
        "lock directory: ok",
    );
}
