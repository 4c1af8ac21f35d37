use super::*;

const XML: &str = "<domain type='kvm'><name>llama</name><os><type>hvm</type></os><devices>\
        <disk type='file' device='disk'><source file='/srv/os/llama.qcow2'/><target dev='vda'/></disk>\
        <disk type='file' device='disk'><source file='/nvme/llama.img'/><target dev='vdb'/><readonly/></disk>\
        <hostdev mode='subsystem' type='pci' managed='yes'><source>\
        <address domain='0x0000' bus='0x41' slot='0x00' function='0x0'/></source>\
        <address type='pci' domain='0x0000' bus='0x07' slot='0x00' function='0x0'/></hostdev>\
        <hostdev mode='subsystem' type='pci' managed='yes'><source>\
        <address domain='0' bus='66' slot='0' function='0'/></source></hostdev>\
        </devices></domain>";

fn spec(edit: impl FnOnce(&mut Value)) -> Value {
    let mut v = json!({
        "name": "llama",
        "workload": {"model": "Llama-3.1-70B", "runtime": "vllm --tp 8"},
        "user": {"kind": "internal", "name": "research"},
        "vm": {"domain_xml": XML},
        "baseboard": ["0000:41:00.0", "0000:42:00.0"],
        "os_disk": "/srv/os/llama.qcow2",
        "weights_disk": "/nvme/llama.img",
        "readiness": {"tcp": 8000},
        "stop_timeout_seconds": 60,
        "start_retries": 2
    });
    edit(&mut v);
    v
}

fn err(v: Value) -> String {
    match Template::from_value(&v) {
        Err(Error::InvalidRequest(m)) => m,
        other => panic!("expected InvalidRequest, got {other:?}"),
    }
}

fn pci(bus: u8) -> PciAddress {
    PciAddress {
        domain: 0,
        bus,
        slot: 0,
        function: 0,
    }
}

fn board(name: &str, buses: &[u8]) -> Template {
    let mut t = Template::from_value(&spec(|v| {
        v["vm"] = json!({"domain": "d"});
    }))
    .unwrap();
    t.name = name.into();
    t.baseboard = buses.iter().map(|b| pci(*b)).collect();
    t
}

#[test]
fn a_full_template_parses_and_round_trips() {
    let t = Template::from_value(&spec(|_| {})).unwrap();
    assert_eq!(t.baseboard, [pci(0x41), pci(0x42)]);
    assert_eq!(t.user.kind, UserKind::Internal);
    assert_eq!(
        t.readiness,
        Readiness::Tcp {
            host: None,
            port: 8000
        }
    );
    assert_eq!(t.start_retries, Some(2));
    assert_eq!(Template::from_value(&t.to_value()).unwrap(), t);
    let bare = Template::from_value(&spec(|v| {
        let m = v.as_object_mut().unwrap();
        for k in [
            "os_disk",
            "weights_disk",
            "readiness",
            "stop_timeout_seconds",
            "start_retries",
        ] {
            m.remove(k);
        }
        m.insert("baseboard".into(), json!([]));
    }))
    .unwrap();
    assert_eq!(bare.readiness, Readiness::Started);
    assert_eq!(Template::from_value(&bare.to_value()).unwrap(), bare);
}

#[test]
fn field_errors_name_their_path() {
    assert_eq!(
        err(spec(|v| v["user"]["kind"] = json!("guest"))),
        "user.kind: \"internal\" (the customer's staff) or \"external\" (partners, customers)"
    );
    assert_eq!(
        err(spec(|v| v["baseboard"] = json!(["0000:41:00.0", "nvidia0"]))),
        "baseboard[1]: a PCI address such as 0000:41:00.0"
    );
    assert_eq!(
        err(spec(|v| v["baseboard"] = json!(["41:00.0", "0000:41:00.0"]))),
        "baseboard[1]: 0000:41:00.0 is listed twice"
    );
    assert_eq!(
        err(spec(|v| v["weights_disk"] = json!("nvme/llama.img"))),
        "weights_disk: an absolute, normalised path such as /var/lib/astraeus/weights/llama.img"
    );
    assert_eq!(
        err(spec(|v| v["weights_disk"] = json!("/srv/os/llama.qcow2"))),
        "weights_disk: must be a disk of its own, not the os_disk"
    );
    assert_eq!(
        err(spec(|v| v["readiness"] = json!({"tcp": 0}))),
        "readiness.tcp: a port from 1 to 65535 (on the guest's addresses as libvirt \
             knows them), or host:port such as \"10.0.0.5:8000\""
    );
    for bad in [
        "10.0.0.5",
        "10.0.0.5:0",
        ":80",
        "fd00::5:80",
        "[fd00::5:80",
        "a b:1",
    ] {
        assert!(
            err(spec(|v| v["readiness"] = json!({ "tcp": bad })))
                .starts_with("readiness.tcp: a port"),
            "{bad}"
        );
    }
    for (good, host, port) in [
        ("10.0.0.5:8000", "10.0.0.5", 8000),
        ("[fd00::5]:80", "[fd00::5]", 80),
        ("guest.lan:22", "guest.lan", 22),
    ] {
        let t = Template::from_value(&spec(|v| v["readiness"] = json!({ "tcp": good }))).unwrap();
        let want = Readiness::Tcp {
            host: Some(host.into()),
            port,
        };
        assert_eq!(t.readiness, want);
        // It reads back as it was given.
        let again = Template::from_value(&t.to_value()).unwrap();
        assert_eq!(again.readiness, want);
    }
    assert_eq!(
        err(spec(|v| v["readiness"] = json!({"http": "ftp://x"}))),
        "readiness.http: a URL such as http://10.0.0.5:8000/health"
    );
    assert!(
        err(spec(|v| v["readiness"] = json!({"tcp": 1, "agent": true})))
            .starts_with("readiness: exactly one of tcp")
    );
    assert!(err(spec(|v| v["readiness"] = json!({"agent": false})))
        .starts_with("readiness.agent: true"));
    assert_eq!(
        err(spec(|v| v["start_retries"] = json!(11))),
        "start_retries: a whole number from 0 to 10"
    );
    assert_eq!(
        err(spec(|v| v["stop_timeout_seconds"] = json!(0))),
        "stop_timeout_seconds: a whole number of seconds from 1 to 3600"
    );
    assert_eq!(
        err(spec(|v| v["vm"] = json!({}))),
        "vm: exactly one of domain (an existing domain's name) or domain_xml"
    );
    assert!(err(spec(|v| v["vm"] = json!({"domain_xml": "<network/>"})))
        .starts_with("vm.domain_xml: a libvirt <domain> document"));
    assert!(err(spec(|v| v["workload"]["gpu"] = json!(1)))
        .starts_with("workload.gpu: unknown field; accepted here: model, runtime"));
    assert_eq!(
        err(spec(|v| {
            v.as_object_mut().unwrap().remove("user");
        })),
        "user: required"
    );
    assert!(err(json!([])).starts_with("template: expected a JSON object"));
}

#[test]
fn every_baseboard_device_must_be_a_hostdev() {
    // 0x42 = 66: decimal and hex addresses both count.
    check_hostdevs(&[pci(0x41), pci(0x42)], XML).unwrap();
    // The guest-side address (bus 0x07) is not a passed device.
    assert_eq!(
        check_hostdevs(&[pci(0x41), pci(0x07)], XML)
            .unwrap_err()
            .message(),
        "baseboard[1]: 0000:07:00.0 is not passed to the domain; add <hostdev \
             mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' \
             bus='0x07' slot='0x00' function='0x0'/></source></hostdev>"
    );
    assert!(err(spec(
        |v| v["baseboard"] = json!(["0000:41:00.0", "0000:43:00.1"])
    ))
    .starts_with("baseboard[1]: 0000:43:00.1 is not passed to the domain"));
}

/// The os_disk is one of the domain's disks, and exists (seed 003's
/// OS disk: an os_disk naming nothing was taken, unchecked).
#[test]
fn the_os_disk_is_a_disk_of_the_domain_and_exists() {
    check_os_disk("/srv/os/llama.qcow2", XML).unwrap();
    assert_eq!(
        err(spec(|v| v["os_disk"] = json!("/srv/os/other.qcow2"))),
        "os_disk: /srv/os/other.qcow2 is not a disk of the domain: name the disk its \
             <source file='…'/> boots from"
    );
    let dir = tempfile::tempdir().unwrap();
    let os = dir.path().join("os.qcow2");
    let with = |p: &std::path::Path| {
        let xml = XML.replace("/srv/os/llama.qcow2", p.to_str().unwrap());
        let v = spec(|v| {
            v["os_disk"] = json!(p.to_str().unwrap());
            v["vm"] = json!({ "domain_xml": xml });
        });
        Template::from_value(&v).unwrap()
    };
    assert_eq!(
        with(&os).check_files().unwrap_err().message(),
        format!(
            "os_disk: {} does not exist: the VM's OS disk, made before the template",
            os.display()
        )
    );
    std::fs::write(&os, b"qcow").unwrap();
    with(&os).check_files().unwrap();
}

#[test]
fn the_weights_disk_must_be_attached_read_only() {
    check_weights_readonly("/nvme/llama.img", XML).unwrap();
    assert_eq!(
        check_weights_readonly("/srv/os/llama.qcow2", XML)
            .unwrap_err()
            .message(),
        "weights_disk: must be attached read-only in the domain (<readonly/>)"
    );
    assert_eq!(
        check_weights_readonly("/nvme/other.img", XML)
            .unwrap_err()
            .message(),
        "weights_disk: /nvme/other.img is not a disk of the domain; attach it read-only \
             (<disk><source file='/nvme/other.img'/><readonly/></disk>)"
    );
    let block = "<domain><name>b</name><devices><disk type='block'>\
            <source dev='/dev/nvme0n1p3'/><readonly/></disk></devices></domain>";
    check_weights_readonly("/dev/nvme0n1p3", block).unwrap();
    let writable = XML.replace("<readonly/>", "");
    assert_eq!(
        err(spec(|v| v["vm"] = json!({ "domain_xml": writable }))),
        "weights_disk: must be attached read-only in the domain (<readonly/>)"
    );
}

#[test]
fn networked_filesystems_are_recognised() {
    for fs in [
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "ceph",
        "fuse.sshfs",
        "glusterfs",
        "fuse.glusterfs",
        "9p",
        "lustre",
        "gpfs",
        "beegfs",
        "ocfs2",
        "gfs2",
        "fuse.s3fs",
        "NFS4",
    ] {
        assert!(is_networked_fs(fs), "{fs}");
    }
    for fs in [
        "ext4",
        "xfs",
        "btrfs",
        "zfs",
        "tmpfs",
        "overlay",
        "fuseblk",
        "fuse.ntfs-3g",
    ] {
        assert!(!is_networked_fs(fs), "{fs}");
    }
}

#[test]
fn weights_on_a_networked_filesystem_are_refused_unless_allowed() {
    check_weights_local("/nvme/llama.img", "xfs", false).unwrap();
    check_weights_local("/mnt/nfs/llama.img", "nfs4", true).unwrap();
    assert_eq!(
        check_weights_local("/mnt/nfs/llama.img", "nfs4", false)
            .unwrap_err()
            .message(),
        "weights_disk: /mnt/nfs/llama.img is on a networked filesystem (nfs4); weights \
             belong on host-local storage so that each slice reloads them locally — move \
             them, or set slicing.allow_networked_weights = true in the config"
    );
}

#[test]
fn templates_share_a_baseboard_whole_or_not_at_all() {
    let a = board("a", &[0x41, 0x42]);
    let b = board("b", &[0x42, 0x41]);
    let c = board("c", &[0x81, 0x82]);
    let d = board("d", &[0x42, 0x43]);
    check_baseboards(&[a.clone(), b.clone(), c.clone()]).unwrap();
    assert!(a.same_baseboard(&b) && !a.same_baseboard(&c));
    assert_eq!(
        check_baseboard_agrees(&d, &[a.clone(), c])
            .unwrap_err()
            .message(),
        "baseboard: templates a and d disagree about the baseboard (a has 0000:41:00.0, \
             0000:42:00.0; d has 0000:42:00.0, 0000:43:00.0); a baseboard passes whole: list \
             the same devices, or none in common for a second baseboard"
    );
    // Replacing a template by itself is no disagreement.
    let a2 = board("a", &[0x42, 0x43]);
    check_baseboard_agrees(&a2, &[a]).unwrap();
    // Empty baseboards (tests) agree with each other.
    check_baseboards(&[board("x", &[]), board("y", &[])]).unwrap();
}
