//! A private podman for tests (its own storage, runc, a busybox image
//! imported from a tarball built here, a CDI spec, its API socket):
//! included by the tests that run container workers on real podman.

use super::common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub const UUID: &str = "GPU-5c0a7d3e-4060-4b1e-9f00-000000000000";

pub fn available() -> bool {
    let ok = Command::new("podman")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    require_component(ok, "podman")
}

/// A private podman: its own storage, runc, a busybox image, and its API
/// socket. Tests take turns (`_turn`): podman instances on one host share
/// more than their roots (locks, runc's state), and parallel runs flaked.
pub struct Podman {
    pub dir: PathBuf,
    pub service: Child,
    cdi: PathBuf,
    _turn: Option<std::sync::MutexGuard<'static, ()>>,
}

static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Podman {
    pub fn start(dir: &Path) -> Podman {
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let dir = dir.join("podman");
        std::fs::create_dir_all(dir.join("rootfs/bin")).unwrap();
        std::fs::write(
            dir.join("containers.conf"),
            format!(
                "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n\
                 [engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n\
                 tmp_dir = \"{}\"\n",
                dir.join("tmp").display()
            ),
        )
        .unwrap();
        std::fs::copy("/bin/busybox", dir.join("rootfs/bin/busybox"))
            .expect("busybox-static installed");
        let list = Command::new("/bin/busybox").arg("--list").output().unwrap();
        for applet in String::from_utf8_lossy(&list.stdout).lines() {
            if applet != "busybox" {
                let _ = std::os::unix::fs::symlink("busybox", dir.join("rootfs/bin").join(applet));
            }
        }
        let st = Command::new("tar")
            .args(["-C"])
            .arg(dir.join("rootfs"))
            .args(["-cf"])
            .arg(dir.join("rootfs.tar"))
            .arg(".")
            .status()
            .unwrap();
        assert!(st.success());
        let p = Podman::bare(&dir);
        let out = p
            .cmd()
            .args([
                "import",
                "--change",
                "ENV PATH=/bin",
                "--change",
                "CMD [\"/bin/sh\"]",
            ])
            .arg(dir.join("rootfs.tar"))
            .arg("localhost/bb")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "import: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let service = p.serve();
        // CDI specs are read only from /etc/cdi and /var/run/cdi. One shared
        // file, never removed while tests run: two files defining the same
        // device make CDI refuse it as a conflict, and a test that removed
        // the file would take the device from the others.
        std::fs::create_dir_all("/etc/cdi").unwrap();
        for old in std::fs::read_dir("/etc/cdi").unwrap().flatten() {
            let name = old.file_name().to_string_lossy().into_owned();
            if name.starts_with("astraeus-test-") {
                let _ = std::fs::remove_file(old.path()); // left by an older run
            }
        }
        let cdi = PathBuf::from("/etc/cdi/astraeus-test.yaml");
        let tmp = dir.join("cdi.yaml");
        std::fs::write(
            &tmp,
            format!(
                "cdiVersion: \"0.5.0\"\nkind: nvidia.com/gpu\ndevices:\n- name: {UUID}\n  containerEdits:\n    env: [\"SEEN_CDI={UUID}\"]\n"
            ),
        )
        .unwrap();
        // Same content each time, replaced atomically: readers never see it half-written.
        std::fs::copy(&tmp, cdi.with_extension("tmp")).unwrap();
        std::fs::rename(cdi.with_extension("tmp"), &cdi).unwrap();
        Podman {
            dir,
            service,
            cdi,
            _turn: Some(turn),
        }
    }

    /// `podman system service` on this podman's socket.
    pub fn serve(&self) -> Child {
        let sock = self.dir.join("podman.sock");
        let _ = std::fs::remove_file(&sock);
        let child = self
            .cmd()
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", sock.display()))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("service.log")).unwrap())
            .spawn()
            .unwrap();
        // Answering, not only bound: the socket file appears before the
        // service accepts, and a launch sent then would fail the worker.
        eventually("podman answers on its socket", || pinged(&sock));
        child
    }

    pub fn bare(dir: &Path) -> Podman {
        Podman {
            dir: dir.to_path_buf(),
            service: Command::new("true").spawn().unwrap(),
            cdi: PathBuf::new(),
            _turn: None,
        }
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .arg("--root")
            .arg(self.dir.join("root"))
            .arg("--runroot")
            .arg(self.dir.join("runroot"));
        c
    }

    pub fn run(&self, args: &[&str]) -> String {
        let o = self.cmd().args(args).output().unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("podman.sock")
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        if !self.cdi.as_os_str().is_empty() {
            let _ = self.cmd().args(["rm", "-af", "-t", "0"]).output();
        }
        let _ = self.service.kill();
        let _ = self.service.wait();
    }
}
