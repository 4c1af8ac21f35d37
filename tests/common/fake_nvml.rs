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
        let dir = std::env::temp_dir().join(format!("astraeus-fake-nvml-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("min")).unwrap();
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake_nvml/fake_nvml.c");
        for (out, extra) in [
            ("libnvidia-ml.so.1", None),
            ("min/libnvidia-ml.so.1", Some("-DOMIT_OPTIONAL")),
        ] {
            let st = Command::new("gcc")
                .args(["-shared", "-fPIC", "-o"])
                .arg(dir.join(out))
                .args(extra)
                .arg(src)
                .status()
                .expect("gcc runs");
            assert!(st.success(), "building the fake NVML library");
        }
        dir
    });
    if minimal {
        dir.join("min/libnvidia-ml.so.1")
    } else {
        dir.join("libnvidia-ml.so.1")
    }
}
