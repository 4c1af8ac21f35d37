//! The fake libnvidia-ml.so.1 (tests/fake_nvml/fake_nvml.c), built once per
//! test binary: the one stand-in for a GPU, so that the real nvml-wrapper
//! path runs. Included by the tests that read GPUs through NVML.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Builds the fake library (full, and without optional symbols) once per run.
pub fn fake_lib(minimal: bool) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        // In cargo's folder for tests' files (removed by `cargo clean`), one
        // folder per test binary, built again by each run: not a folder per
        // run left in /tmp.
        let exe = std::env::current_exe().unwrap();
        let stem = exe.file_stem().unwrap().to_string_lossy().into_owned();
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fake-nvml-{stem}"));
        std::fs::create_dir_all(dir.join("min")).unwrap();
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake_nvml/fake_nvml.c");
        for (out, extra) in [
            ("libnvidia-ml.so.1", None),
            ("min/libnvidia-ml.so.1", Some("-DOMIT_OPTIONAL")),
        ] {
            // Built beside and renamed over: a daemon of an earlier run that
            // still maps the old file keeps it whole.
            let part = dir.join(format!("{out}.{}", std::process::id()));
            let st = Command::new("gcc")
                .args(["-shared", "-fPIC", "-o"])
                .arg(&part)
                .args(extra)
                .arg(src)
                .status()
                .expect("gcc runs");
            assert!(st.success(), "building the fake NVML library");
            std::fs::rename(&part, dir.join(out)).unwrap();
        }
        dir
    });
    if minimal {
        dir.join("min/libnvidia-ml.so.1")
    } else {
        dir.join("libnvidia-ml.so.1")
    }
}

/// Writes the fixture of one 24 GB L4 named `uuid`, `used` bytes in use,
/// and `procs` (fixture `proc` lines); written then renamed, so the
/// library never reads half a file.
#[allow(dead_code)] // the container tests use it; other binaries include this file too
pub fn one_l4(fixture: &std::path::Path, uuid: &str, used: u64, procs: &str) {
    let text = format!(
        "gpu uuid={uuid} name=NVIDIA_L4 total={} used={used} reserved=0 \
         bus=00000000:01:00.0 power=60000 energy=1000 util=3\n{procs}",
        24u64 << 30
    );
    let tmp = fixture.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, fixture).unwrap();
}
