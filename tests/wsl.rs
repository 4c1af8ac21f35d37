//! WSL shown, not claimed (#51, item 6): the daemon as WSL2 runs it, its
//! GPU device and NVML where WSL puts them, in a private mount namespace
//! (tests/wsl.sh; root, as CI has), reading two GPUs through the fake NVML.

mod common;
#[path = "common/fake_nvml.rs"]
mod fake_nvml;

/// docs/sharing.md's WSL steps, followed as a user in no group: with
/// nothing configured, /dev/dxg makes it a WSL2 host and /usr/lib/wsl/lib's
/// NVML is loaded (listing no processes); the user's container worker runs
/// through their rootless podman on the CDI device WSL has
/// (`nvidia.com/gpu=all`), its memory taken on every GPU, its share in its
/// environment. Seen failing with the WSL search path removed from
/// inventory/nvml.rs, with the owner's containers refused (access.rs), and
/// with the per-UUID CDI device kept on WSL (config.rs `for_wsl`).
#[test]
fn the_daemon_finds_wsl_and_its_nvml_without_configuration() {
    let dir = common::open_tempdir();
    let fx = dir.path().join("gpus.txt");
    let gpu = |i: usize| {
        format!(
            "gpu uuid=GPU-wsl-{i} name=NVIDIA_GeForce_RTX_4060 total={} used=0 reserved=0 \
             bus=00000000:0{i}:00.0 power=60000 energy=1000 util=3 procs=notsup\n",
            8u64 << 30
        )
    };
    std::fs::write(&fx, gpu(0) + &gpu(1)).unwrap();
    let lib = fake_nvml::fake_lib(false);
    common::run_in_private_mounts(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/wsl.sh"),
        &[
            env!("CARGO_BIN_EXE_astraeusd"),
            env!("CARGO_BIN_EXE_astraeusctl"),
            lib.to_str().unwrap(),
            fx.to_str().unwrap(),
            concat!(env!("CARGO_MANIFEST_DIR"), "/docs/sharing.md"),
        ],
        "wsl: ok",
    );
}
