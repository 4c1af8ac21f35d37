//! The ledger under faults, on a small ext4 image the test loop-mounts in a
//! private mount namespace (errors=remount-ro): first filled to the last byte,
//! then forced read-only by a filesystem error while the daemon runs (ext4's
//! trigger_fs_error — what a failing disk does). The daemon refuses new work
//! with a clear error, keeps serving reads and loses nothing it acknowledged;
//! it takes work again when space returns, and — since a filesystem that went
//! read-only on an error needs fsck and a new mount — after a restart on the
//! repaired filesystem. Needs root (mount namespaces, loop devices).

mod common;
use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The daemon in its namespace; killed when dropped (a failed assertion too).
struct Guard(Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the daemon in its own mount namespace with its state on `image`,
/// configured by `dir/node.toml`.
fn daemon_on(image: &Path, bus: &Bus, dir: &Path) -> Guard {
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let script = format!(
        "mount -o loop,errors=remount-ro '{image}' '{state}' && exec '{bin}' --bus-address '{addr}' \
         --sim '{sim}' --state-dir '{state}' --config '{config}'",
        image = image.display(),
        state = state.display(),
        bin = env!("CARGO_BIN_EXE_astraeusd"),
        addr = bus.address,
        sim = dir.join("majin.toml").display(),
        config = dir.join("node.toml").display(),
    );
    let child = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("daemon.log")).unwrap())
        .spawn()
        .unwrap();
    eventually("the daemon owns its name", || {
        busctl(&bus.address, &["status", "org.astraeus.Node1"]).ok
    });
    Guard(child)
}
/// Runs a command inside the daemon's mount namespace.
fn inside(pid: u32, script: &str) -> Out {
    let o = Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-m", "sh", "-c", script])
        .output()
        .unwrap();
    out(o)
}

fn submit(a: &str, name: &str) -> Out {
    manager(a, None, "SubmitWorker", &["s", &shared_spec(name, "0.5")])
}

fn listed(a: &str) -> String {
    manager(a, None, "ListWorkers", &[]).stdout
}

fn sh(script: &str) -> Out {
    let o = Command::new("sh").args(["-c", script]).output().unwrap();
    out(o)
}

/// An ext4 image of `size` (mkfs.ext4 `mkfs_args`), the simulated machine
/// and node.toml (`config`) in a new directory; None when the test cannot
/// run here (root, loop devices and mkfs.ext4).
fn image_and_config(
    size: &str,
    mkfs_args: &str,
    config: &str,
) -> Option<(tempfile::TempDir, std::path::PathBuf)> {
    let present = is_root() && sh("command -v mkfs.ext4 && test -e /dev/loop-control").ok;
    if !require_component(present, "root, loop devices and mkfs.ext4") {
        return None;
    }
    let dir = open_tempdir();
    let image = dir.path().join("ledger.img");
    let made = sh(&format!(
        "truncate -s {size} '{0}' && mkfs.ext4 -q -F {mkfs_args} '{0}'",
        image.display()
    ));
    assert!(made.ok, "{}", made.stderr);
    std::fs::write(
        dir.path().join("majin.toml"),
        MAJIN_TOML.replace("total_gb = 8", "total_gb = 80"),
    )
    .unwrap();
    std::fs::write(dir.path().join("node.toml"), config).unwrap();
    Some((dir, image))
}

#[test]
fn a_full_then_failed_read_only_ledger_refuses_work_keeps_reads_and_loses_nothing() {
    // No floor of free space (8 MiB is under any): the disk itself refuses.
    let Some((dir, image)) = image_and_config("8M", "", "[history]\nmin_free_mb = 0\n") else {
        return;
    };
    let bus = Bus::session();
    let d = daemon_on(&image, &bus, dir.path());
    let (a, pid, state) = (&bus.address, d.0.id(), dir.path().join("state"));
    let mut acked = Vec::new();
    for i in 0..5 {
        let name = format!("before-{i}");
        assert!(submit(a, &name).ok);
        acked.push(name);
    }

    // Full to the last byte: once SQLite's WAL has no reusable room left,
    // writes fail, and each failure is a clear refusal.
    inside(
        pid,
        &format!(
            "dd if=/dev/zero of='{}/fill' bs=4k 2>/dev/null; sync",
            state.display()
        ),
    );
    let mut refusal = None;
    for i in 0..400 {
        let name = format!("full-{i}");
        let o = submit(a, &name);
        if o.ok {
            acked.push(name);
        } else {
            refusal = Some(o.stderr);
            break;
        }
    }
    let refusal = refusal.expect("a full disk must refuse new work");
    assert!(
        refusal.contains("ledger: its disk is full, so new work is refused"),
        "{refusal}"
    );
    // Reads go on.
    let list = listed(a);
    for name in &acked {
        assert!(list.contains(name.as_str()), "{name} missing from {list}");
    }
    assert!(manager(a, None, "GetWorker", &["s", "before-0"]).ok);
    // Room again: work is taken.
    inside(pid, &format!("rm '{}/fill'", state.display()));
    let o = submit(a, "after-room");
    assert!(o.ok, "{}", o.stderr);
    acked.push("after-room".into());

    // A filesystem error turns it read-only under the daemon.
    let failed = inside(
        pid,
        &format!(
            "dev=$(basename $(findmnt -no SOURCE '{}')); echo test > /sys/fs/ext4/$dev/trigger_fs_error",
            state.display()
        ),
    );
    assert!(failed.ok, "{}", failed.stderr);
    let o = submit(a, "while-ro");
    assert!(!o.ok);
    assert!(
        o.stderr
            .contains("new work is refused until it can be written again"),
        "{}",
        o.stderr
    );
    assert!(listed(a).contains("after-room"), "reads go on");
    drop(d);

    // Repaired (fsck) and mounted again: nothing acknowledged was lost, and a
    // restarted daemon takes work.
    let fsck = sh(&format!(
        "e2fsck -fy '{}' >/dev/null 2>&1; true",
        image.display()
    ));
    assert!(fsck.ok);
    let _d = daemon_on(&image, &bus, dir.path());
    let list = listed(a);
    for name in &acked {
        assert!(
            list.contains(name.as_str()),
            "acknowledged {name} lost: {list}"
        );
    }
    assert!(!list.contains("while-ro"));
    let o = submit(a, "after-repair");
    assert!(o.ok, "{}", o.stderr);
}

/// A disk filled to the last byte by something else (or the floor reached)
/// never freezes the host: new submits are refused naming
/// history.min_free_mb, while stops still commit (the reserve beside the
/// ledger is given back), and so do the usage readings; a restart on the
/// full disk opens the ledger and stops more; once space returns, work is
/// taken and the reserve made again. Seen failing with the reserve never
/// given back (the stop: "its disk is full"), and with it given back whole
/// (the filler still running took it all, one run in two).
#[test]
fn a_disk_full_to_the_last_byte_still_takes_stops_readings_and_a_restart() {
    let config = "[history]\nmin_free_mb = 20\n[usage]\ninterval_seconds = 1\n";
    let Some((dir, image)) = image_and_config("48M", "-m 0", config) else {
        return;
    };
    let bus = Bus::session();
    let d = daemon_on(&image, &bus, dir.path());
    let (a, pid, state) = (&bus.address, d.0.id(), dir.path().join("state"));
    for i in 0..4 {
        assert!(submit(a, &format!("w{i}")).ok);
    }
    let reserve = format!("{}/ledger.db.reserve", state.display());
    assert!(
        inside(pid, &format!("test -s '{reserve}'")).ok,
        "the reserve is made"
    );

    // Full to the last byte: big blocks, then small ones. The daemon may
    // give a piece of its reserve back meanwhile (a reading a second hit
    // the full disk): that piece is filled too, until nothing is left.
    inside(
        pid,
        &format!(
            "dd if=/dev/zero of='{0}/fill' bs=1M 2>/dev/null; sync",
            state.display()
        ),
    );
    let mut avail = String::new();
    for piece in 0..20 {
        inside(
            pid,
            &format!(
                "dd if=/dev/zero of='{0}/fill-{piece}' bs=1k 2>/dev/null; sync",
                state.display()
            ),
        );
        avail = inside(
            pid,
            &format!("df -B1 --output=avail '{}' | tail -1", state.display()),
        )
        .stdout
        .trim()
        .to_string();
        if avail == "0" {
            break;
        }
    }
    assert_eq!(avail, "0", "full to the last byte");
    let o = submit(a, "refused");
    assert!(
        !o.ok
            && o.stderr
                .contains("under the 20 MB that history.min_free_mb keeps"),
        "{}",
        o.stderr
    );
    let o = manager(a, None, "StopWorker", &["s", "w0"]);
    assert!(o.ok, "a stop on a full disk: {}", o.stderr);
    assert!(
        inside(pid, &format!("test $(stat -c %s '{reserve}') -lt 8388608")).ok,
        "a piece given back"
    );
    // Readings go on committing (a usage interval a second).
    std::thread::sleep(std::time::Duration::from_secs(3));
    let log = std::fs::read_to_string(dir.path().join("daemon.log")).unwrap();
    assert!(
        !log.contains("recording GPU usage intervals failed"),
        "{log}"
    );
    drop(d);

    // A restart on the still-full disk opens the ledger and takes stops.
    let d = daemon_on(&image, &bus, dir.path());
    let (pid, list) = (d.0.id(), listed(a));
    assert!(!list.contains("'w0'") && list.contains("w1"), "{list}");
    let o = manager(a, None, "StopWorker", &["s", "w1"]);
    assert!(o.ok, "a stop after a restart on a full disk: {}", o.stderr);
    assert!(!submit(a, "still-refused").ok);

    // Room again: work is taken and the reserve made again.
    inside(pid, &format!("rm -f '{0}'/fill*", state.display()));
    let o = submit(a, "after-room");
    assert!(o.ok, "{}", o.stderr);
    assert!(
        inside(pid, &format!("test $(stat -c %s '{reserve}') -eq 8388608")).ok,
        "made again, whole"
    );
    let list = listed(a);
    for name in ["w2", "w3", "after-room"] {
        assert!(list.contains(name), "{name} missing from {list}");
    }
}
