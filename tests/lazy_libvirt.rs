//! libvirt is loaded only where it is needed: the daemon does not link it
//! (its helper astraeus-libvirt does), a daemon that runs no VM or template
//! never maps it nor starts the helper, and on a host whose libvirt cannot be
//! loaded a VM worker fails saying what to install while everything else
//! goes on. (The packages' side — libvirt Recommended, not Depended on — is
//! checked by scripts/check-packages.)

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// The shared libraries a binary names (its ELF NEEDED entries).
fn needed(binary: &str) -> Vec<String> {
    let o = Command::new("readelf")
        .args(["-d", binary])
        .output()
        .expect("readelf (binutils)");
    assert!(o.status.success());
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split('[').nth(1)?.trim_end_matches(']').to_string()))
        .collect()
}

#[test]
fn only_the_helper_links_libvirt() {
    let daemon = needed(env!("CARGO_BIN_EXE_astraeusd"));
    let helper = needed(env!("CARGO_BIN_EXE_astraeus-libvirt"));
    assert!(
        daemon.iter().any(|l| l.starts_with("libc.so")),
        "the check reads NEEDED entries: {daemon:?}"
    );
    assert!(
        !daemon.iter().any(|l| l.starts_with("libvirt")),
        "astraeusd links libvirt: {daemon:?}"
    );
    assert!(
        helper.iter().any(|l| l == "libvirt.so.0"),
        "the helper links libvirt: {helper:?}"
    );
}

/// The daemon's children, by name.
fn children(pid: u32) -> Vec<String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid …; comm may hold spaces, so split after ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok());
        if ppid == Some(pid) {
            names.push(head.split_once('(').map_or("", |(_, c)| c).to_string());
        }
    }
    names
}

fn maps_libvirt(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .contains("libvirt")
}

fn config() -> &'static str {
    "[inventory]\nrefresh_seconds = 0.5\n[runtime]\nlibvirt_uri = \"test:///default\"\n"
}

#[test]
fn a_daemon_that_runs_no_vm_never_maps_libvirt() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = start_majin(&bus, dir.path(), config(), &[]);
    let a = &bus.address;
    let o = manager(a, None, "SubmitWorker", &["s", &shared_spec("small", "1")]);
    assert!(o.ok, "{}", o.stderr);
    eventually("small placed", || state(a, "small") == "s \"running\"\n");
    let pid = d.child.id();
    assert!(!maps_libvirt(pid), "the daemon mapped libvirt unasked");
    assert!(
        !children(pid)
            .iter()
            .any(|c| c.starts_with("astraeus-libvi")),
        "the helper started unasked: {:?}",
        children(pid)
    );
    // The first VM starts the helper, and still the daemon maps no libvirt.
    let o = manager(a, None, "StopWorker", &["s", "small"]);
    assert!(o.ok, "{}", o.stderr);
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &vm_spec("vm", 1, TEST_DOMAIN)],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("vm running", || state(a, "vm") == "s \"running\"\n");
    assert!(
        children(pid)
            .iter()
            .any(|c| c.starts_with("astraeus-libvi")),
        "no helper runs the VM: {:?}",
        children(pid)
    );
    assert!(!maps_libvirt(pid), "the daemon mapped libvirt itself");
}

#[test]
fn without_libvirt_a_vm_fails_naming_what_to_install_and_the_rest_goes_on() {
    let dir = open_tempdir();
    // A libvirt.so.0 the dynamic loader cannot load, found before the real
    // one: for the helper, this host has no usable libvirt.
    let broken = dir.path().join("lib");
    std::fs::create_dir(&broken).unwrap();
    std::fs::write(broken.join("libvirt.so.0"), "").unwrap();
    let bus = Bus::session();
    let path = broken.to_str().unwrap();
    let d = start_majin(&bus, dir.path(), config(), &[("LD_LIBRARY_PATH", path)]);
    let a = &bus.address;
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &vm_spec("vm", 1, TEST_DOMAIN)],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("vm ended", || gone(a, "vm"));
    let o = manager(a, None, "ListEnded", &["xu", "0", "10"]);
    assert!(o.ok, "{}", o.stderr);
    assert!(
        o.stdout.contains("libvirt is not available here")
            && o.stdout.contains("libvirt.so.0")
            && o.stdout
                .contains("install libvirt0 (Debian, Ubuntu) or libvirt-libs"),
        "{}",
        o.stdout
    );
    // Sharing by memory goes on, on the GPU the VM would have had.
    let o = manager(a, None, "SubmitWorker", &["s", &shared_spec("small", "1")]);
    assert!(o.ok, "{}", o.stderr);
    eventually("small placed", || state(a, "small") == "s \"running\"\n");
    assert!(!maps_libvirt(d.child.id()));
    assert!(Path::new(&d.log).exists());
}
