//! A time-slicing template: the workload it serves, the user of its slices,
//! its persistent VM, the baseboard it owns and its two disks (seed 003, §4).
//!
//! Parsed from JSON by hand, like [`crate::request`], so every error names
//! its field path and what would be accepted. The checks that need facts
//! from outside (the domain XML of an existing domain, the filesystem the
//! weights live on, the other templates) are separate pure functions: the
//! caller gathers the facts and calls them.

use std::collections::BTreeSet;

use crate::json_fields::{document, object, parse_text, required, short, string};
use serde_json::{json, Map, Value};

use crate::domain_xml::{self, PciAddress};
use crate::error::{Error, Result};
use crate::request::{validate_name, VmSource};

/// Largest template definition accepted (a domain XML is most of it).
pub const MAX_TEMPLATE_BYTES: usize = 256 * 1024;
/// Most PCI devices one baseboard lists (8 GPUs and their NVSwitches fit).
pub const MAX_BASEBOARD: usize = 64;
/// Longest graceful power-off a template may ask for before it is forced.
pub const MAX_STOP_TIMEOUT_SECONDS: u64 = 3600;
/// Most start retries a template may ask for.
pub const MAX_START_RETRIES: u32 = 10;
/// The config key that lets weights live on a networked filesystem.
pub const ALLOW_NETWORKED_WEIGHTS: &str = "slicing.allow_networked_weights";
const MAX_PATH: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    pub name: String,
    pub workload: Workload,
    pub user: User,
    pub vm: VmSource,
    /// The PCI devices passed whole to the VM; empty only where no device
    /// can be passed (tests): such templates still take turns.
    pub baseboard: Vec<PciAddress>,
    /// Absent for a diskless VM (tests); then nothing is checked.
    pub os_disk: Option<String>,
    /// Absent for a diskless VM (tests); then nothing is checked.
    pub weights_disk: Option<String>,
    pub readiness: Readiness,
    /// Overrides the config's graceful power-off timeout.
    pub stop_timeout_seconds: Option<u64>,
    /// Overrides the config's number of start retries.
    pub start_retries: Option<u32>,
    /// Each slice boots from the same clean disks: what a guest writes to
    /// its writable disks is discarded at power-off (libvirt's transient
    /// disks), so no tenant's state reaches the next slice (seed 003).
    /// The default for a template created now; one stored before this
    /// field existed is not (its VM was defined with persistent disks).
    pub stateless: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub model: String,
    /// Free text: the runtime and its configuration, as the owner writes it.
    pub runtime: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UserKind {
    /// The customer's own staff.
    Internal,
    /// The customer's partners or their own customers.
    External,
}

impl UserKind {
    pub fn as_str(self) -> &'static str {
        match self {
            UserKind::Internal => "internal",
            UserKind::External => "external",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub kind: UserKind,
    pub name: String,
}

/// When a started VM counts as ready to serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// libvirt's STARTED event (the default).
    Started,
    /// A TCP connect to this port succeeds: on `host` when given, else on
    /// the guest's addresses as libvirt knows them (DHCP lease, guest agent,
    /// ARP), for guests whose address is set inside them.
    Tcp { host: Option<String>, port: u16 },
    /// A GET of this URL answers 2xx.
    Http(String),
    /// The QEMU guest agent answers (libvirt's virDomainGetTime).
    Agent,
}

impl Template {
    /// A template a person creates now: stateless unless it says not.
    pub fn parse(text: &str) -> Result<Template> {
        let value = parse_text(text, "template", MAX_TEMPLATE_BYTES)?;
        Template::from_value_or(&value, true)
    }

    /// A template as the ledger stored it: one stored before `stateless`
    /// existed keeps the persistent disks its VM was defined with.
    pub fn parse_stored(text: &str) -> Result<Template> {
        let value = parse_text(text, "template", MAX_TEMPLATE_BYTES)?;
        Template::from_value_or(&value, false)
    }

    /// The spec to store: the person's, with `stateless` said outright, so
    /// that a restart reads what was decided at its creation.
    pub fn stored_spec(&self, text: &str) -> String {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(mut m)) => {
                m.entry("stateless").or_insert(json!(self.stateless));
                Value::Object(m).to_string()
            }
            _ => self.to_value().to_string(),
        }
    }

    /// Parses and validates; with `domain_xml`, also checks the XML against
    /// the baseboard and the weights disk (for an existing domain the caller
    /// calls [`Template::check_domain`] with its XML).
    pub fn from_value(value: &Value) -> Result<Template> {
        Template::from_value_or(value, true)
    }

    /// [`Template::from_value`], with `stateless` as given when the
    /// document does not say.
    fn from_value_or(value: &Value, stateless_default: bool) -> Result<Template> {
        let top = document(
            value,
            "template",
            &[
                "name",
                "workload",
                "user",
                "vm",
                "baseboard",
                "os_disk",
                "weights_disk",
                "readiness",
                "stop_timeout_seconds",
                "start_retries",
                "stateless",
            ],
        )?;
        let name = string(required(top, "", "name")?, "name")?;
        validate_name("name", &name)?;

        let w = object(
            required(top, "", "workload")?,
            "workload",
            &["model", "runtime"],
        )?;
        let workload = Workload {
            model: short(required(w, "workload", "model")?, "workload.model")?,
            runtime: string(required(w, "workload", "runtime")?, "workload.runtime")?,
        };

        let u = object(required(top, "", "user")?, "user", &["kind", "name"])?;
        let kind = match required(u, "user", "kind")?.as_str() {
            Some("internal") => UserKind::Internal,
            Some("external") => UserKind::External,
            _ => {
                return Err(Error::field(
                    "user.kind",
                    "\"internal\" (the customer's staff) or \"external\" (partners, customers)",
                ))
            }
        };
        let user = User {
            kind,
            name: short(required(u, "user", "name")?, "user.name")?,
        };

        let vm = parse_vm(required(top, "", "vm")?)?;
        let baseboard = parse_baseboard(required(top, "", "baseboard")?)?;
        let os_disk = top.get("os_disk").map(|v| path(v, "os_disk")).transpose()?;
        let weights_disk = top
            .get("weights_disk")
            .map(|v| path(v, "weights_disk"))
            .transpose()?;
        if os_disk.is_some() && os_disk == weights_disk {
            return Err(Error::field(
                "weights_disk",
                "must be a disk of its own, not the os_disk",
            ));
        }
        let readiness = match top.get("readiness") {
            None => Readiness::Started,
            Some(v) => parse_readiness(v)?,
        };
        let stop_timeout_seconds = match top.get("stop_timeout_seconds") {
            None => None,
            Some(v) => match v.as_u64() {
                Some(s) if (1..=MAX_STOP_TIMEOUT_SECONDS).contains(&s) => Some(s),
                _ => {
                    return Err(Error::field(
                        "stop_timeout_seconds",
                        format!("a whole number of seconds from 1 to {MAX_STOP_TIMEOUT_SECONDS}"),
                    ))
                }
            },
        };
        let start_retries = match top.get("start_retries") {
            None => None,
            Some(v) => match v.as_u64() {
                Some(n) if n <= u64::from(MAX_START_RETRIES) => Some(n as u32),
                _ => {
                    return Err(Error::field(
                        "start_retries",
                        format!("a whole number from 0 to {MAX_START_RETRIES}"),
                    ))
                }
            },
        };
        let stateless = match top.get("stateless") {
            None => stateless_default,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(Error::field(
                    "stateless",
                    "true (each slice boots from clean disks: what its guest writes is \
                     discarded at power-off) or false (the disks keep it)",
                ))
            }
        };
        let template = Template {
            name,
            workload,
            user,
            vm,
            baseboard,
            os_disk,
            weights_disk,
            readiness,
            stop_timeout_seconds,
            start_retries,
            stateless,
        };
        if let VmSource::DomainXml(xml) = &template.vm {
            template.check_domain(xml)?;
        }
        Ok(template)
    }

    /// The definition as JSON, in the shape [`Template::from_value`] reads.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("name".into(), json!(self.name));
        m.insert(
            "workload".into(),
            json!({"model": self.workload.model, "runtime": self.workload.runtime}),
        );
        m.insert(
            "user".into(),
            json!({"kind": self.user.kind.as_str(), "name": self.user.name}),
        );
        m.insert(
            "vm".into(),
            match &self.vm {
                VmSource::Domain(d) => json!({ "domain": d }),
                VmSource::DomainXml(x) => json!({ "domain_xml": x }),
            },
        );
        let devices: Vec<String> = self.baseboard.iter().map(pci_text).collect();
        m.insert("baseboard".into(), json!(devices));
        if let Some(p) = &self.os_disk {
            m.insert("os_disk".into(), json!(p));
        }
        if let Some(p) = &self.weights_disk {
            m.insert("weights_disk".into(), json!(p));
        }
        match &self.readiness {
            Readiness::Started => {}
            Readiness::Tcp { host: None, port } => {
                m.insert("readiness".into(), json!({ "tcp": port }));
            }
            Readiness::Tcp {
                host: Some(host),
                port,
            } => {
                m.insert(
                    "readiness".into(),
                    json!({ "tcp": format!("{host}:{port}") }),
                );
            }
            Readiness::Http(url) => {
                m.insert("readiness".into(), json!({ "http": url }));
            }
            Readiness::Agent => {
                m.insert("readiness".into(), json!({ "agent": true }));
            }
        }
        if let Some(s) = self.stop_timeout_seconds {
            m.insert("stop_timeout_seconds".into(), json!(s));
        }
        if let Some(n) = self.start_retries {
            m.insert("start_retries".into(), json!(n));
        }
        m.insert("stateless".into(), json!(self.stateless));
        Value::Object(m)
    }

    /// Checks the VM's domain XML (the template's own, or an existing
    /// domain's as libvirt gives it): every baseboard device is a PCI hostdev
    /// and the weights disk is attached read-only.
    pub fn check_domain(&self, xml: &str) -> Result<()> {
        check_hostdevs(&self.baseboard, xml)?;
        if let Some(weights) = &self.weights_disk {
            check_weights_readonly(weights, xml)?;
        }
        if let Some(os) = &self.os_disk {
            check_os_disk(os, xml)?;
        }
        Ok(())
    }

    /// The files it names exist (off the loop: the daemon's own view of
    /// the host, as libvirt's will be when it boots the VM).
    pub fn check_files(&self) -> Result<()> {
        if let Some(os) = &self.os_disk {
            match std::fs::metadata(os) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Error::field(
                        "os_disk",
                        format!("{os} does not exist: the VM's OS disk, made before the template"),
                    ))
                }
                Err(e) => return Err(Error::field("os_disk", format!("{os}: {e}"))),
            }
        }
        Ok(())
    }

    /// Whether both own the same baseboard (and so take turns on it).
    pub fn same_baseboard(&self, other: &Template) -> bool {
        device_set(&self.baseboard) == device_set(&other.baseboard)
    }
}

/// `0000:41:00.0`, the lspci form, for messages and JSON.
pub fn pci_text(a: &PciAddress) -> String {
    format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        a.domain, a.bus, a.slot, a.function
    )
}

/// A template owns a baseboard: one with none is refused unless
/// `[slicing] allow_no_baseboard` (trials, libvirt's test driver).
pub fn check_has_baseboard(t: &Template, allowed: bool) -> Result<()> {
    if t.baseboard.is_empty() && !allowed {
        return Err(Error::field(
            "baseboard",
            format!(
                "template {}: an empty list; the whole GPU baseboard is passed through to each \
                 template's VM (seed 003: \"The whole baseboard is passed through to a single \
                 VM (full PCI passthrough) rather than being partitioned\"): list its PCI \
                 devices (\"0000:41:00.0\", …), or set [slicing] allow_no_baseboard = true in \
                 node.toml to try rotation without one",
                t.name
            ),
        ));
    }
    Ok(())
}

/// (a) Every baseboard device is passed to the domain as a PCI hostdev.
pub fn check_hostdevs(baseboard: &[PciAddress], xml: &str) -> Result<()> {
    let doc = parse_domain(xml)?;
    // The host side is `<hostdev type='pci'><source><address …/>`; the
    // `<address>` right under `<hostdev>` is the guest's slot, not ours.
    let passed: Vec<PciAddress> = doc
        .descendants()
        .filter(|n| n.has_tag_name("hostdev") && n.attribute("type") == Some("pci"))
        .filter_map(|h| h.children().find(|n| n.has_tag_name("source")))
        .filter_map(|s| s.children().find(|n| n.has_tag_name("address")))
        .filter_map(|a| {
            Some(PciAddress {
                domain: xml_number(a.attribute("domain").unwrap_or("0"))?,
                bus: u8::try_from(xml_number(a.attribute("bus")?)?).ok()?,
                slot: u8::try_from(xml_number(a.attribute("slot")?)?).ok()?,
                function: u8::try_from(xml_number(a.attribute("function")?)?).ok()?,
            })
        })
        .collect();
    for (i, device) in baseboard.iter().enumerate() {
        if !passed.contains(device) {
            return Err(Error::field(
                &format!("baseboard[{i}]"),
                format!(
                    "{} is not passed to the domain; add <hostdev mode='subsystem' \
                     type='pci' managed='yes'><source><address domain='0x{:04x}' \
                     bus='0x{:02x}' slot='0x{:02x}' function='0x{:x}'/></source></hostdev>",
                    pci_text(device),
                    device.domain,
                    device.bus,
                    device.slot,
                    device.function
                ),
            ));
        }
    }
    Ok(())
}

/// (b) The weights disk is a disk of the domain (source file or dev) and
/// every such disk carries `<readonly/>`: weights are staged once and must
/// never be written by a guest.
/// The template's `os_disk` is a disk of its domain (its source file or
/// device), so that what the template says is what the VM boots.
pub fn check_os_disk(os_disk: &str, xml: &str) -> Result<()> {
    let doc = parse_domain(xml)?;
    let attached = doc
        .descendants()
        .filter(|n| n.has_tag_name("disk"))
        .any(|d| {
            d.children().any(|s| {
                s.has_tag_name("source")
                    && (s.attribute("file") == Some(os_disk) || s.attribute("dev") == Some(os_disk))
            })
        });
    if !attached {
        return Err(Error::field(
            "os_disk",
            format!(
                "{os_disk} is not a disk of the domain: name the disk its <source file='…'/> \
                 boots from"
            ),
        ));
    }
    Ok(())
}

pub fn check_weights_readonly(weights_disk: &str, xml: &str) -> Result<()> {
    let doc = parse_domain(xml)?;
    let disks: Vec<_> = doc
        .descendants()
        .filter(|n| n.has_tag_name("disk"))
        .filter(|d| {
            d.children().any(|s| {
                s.has_tag_name("source")
                    && (s.attribute("file") == Some(weights_disk)
                        || s.attribute("dev") == Some(weights_disk))
            })
        })
        .collect();
    if disks.is_empty() {
        return Err(Error::field(
            "weights_disk",
            format!(
                "{weights_disk} is not a disk of the domain; attach it read-only \
                 (<disk><source file='{weights_disk}'/><readonly/></disk>)"
            ),
        ));
    }
    if !disks
        .iter()
        .all(|d| d.children().any(|n| n.has_tag_name("readonly")))
    {
        return Err(Error::field(
            "weights_disk",
            "must be attached read-only in the domain (<readonly/>)",
        ));
    }
    Ok(())
}

/// Filesystem types (as /proc/self/mountinfo names them) whose data lives
/// across a network or on storage shared between hosts.
const NETWORKED_FS: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "ceph",
    "glusterfs",
    "9p",
    "lustre",
    "gpfs",
    "beegfs",
    "ocfs2",
    "gfs2",
    "afs",
    "coda",
    "orangefs",
    "pvfs2",
    "davfs",
    "sshfs",
];

/// FUSE filesystems are `fuse.<subtype>`; these subtypes are networked.
const NETWORKED_FUSE: &[&str] = &[
    "sshfs",
    "glusterfs",
    "ceph",
    "ceph-fuse",
    "cephfs",
    "s3fs",
    "rclone",
    "juicefs",
    "mfs",
    "moosefs",
    "lizardfs",
    "davfs2",
    "gcsfuse",
    "goofys",
    "beegfs",
];

/// (c) Whether a filesystem type is networked (NFS, CIFS, Ceph, …).
pub fn is_networked_fs(fs_type: &str) -> bool {
    let t = fs_type.trim().to_ascii_lowercase();
    if NETWORKED_FS.contains(&t.as_str()) {
        return true;
    }
    t.strip_prefix("fuse.")
        .or_else(|| t.strip_prefix("fuseblk."))
        .is_some_and(|sub| NETWORKED_FUSE.contains(&sub))
}

/// (c) The weights must be host-local, judged by the filesystem type of the
/// path they live on (the caller looks it up): each slice reloads them, and
/// that load must be a local read (seed §4). `allow_networked` is the
/// config's [`ALLOW_NETWORKED_WEIGHTS`].
pub fn check_weights_local(weights_disk: &str, fs_type: &str, allow_networked: bool) -> Result<()> {
    if allow_networked || !is_networked_fs(fs_type) {
        return Ok(());
    }
    Err(Error::field(
        "weights_disk",
        format!(
            "{weights_disk} is on a networked filesystem ({fs_type}); weights belong on \
             host-local storage so that each slice reloads them locally — move them, or set \
             {ALLOW_NETWORKED_WEIGHTS} = true in the config"
        ),
    ))
}

/// (d) `new` agrees with every other template about the baseboard: the same
/// devices (they take turns) or none in common (a second baseboard). A
/// template of the same name is the one being replaced and is skipped.
pub fn check_baseboard_agrees(new: &Template, others: &[Template]) -> Result<()> {
    let mine = device_set(&new.baseboard);
    for other in others.iter().filter(|o| o.name != new.name) {
        let theirs = device_set(&other.baseboard);
        if mine == theirs || mine.is_disjoint(&theirs) {
            continue;
        }
        let list = |set: &BTreeSet<(u32, u8, u8, u8)>| {
            set.iter()
                .map(|&(domain, bus, slot, function)| {
                    pci_text(&PciAddress {
                        domain,
                        bus,
                        slot,
                        function,
                    })
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(Error::field(
            "baseboard",
            format!(
                "templates {} and {} disagree about the baseboard ({} has {}; {} has {}); \
                 a baseboard passes whole: list the same devices, or none in common for a \
                 second baseboard",
                other.name,
                new.name,
                other.name,
                list(&theirs),
                new.name,
                list(&mine)
            ),
        ));
    }
    Ok(())
}

/// (d) for a whole set of templates (e.g. at start-up, from the ledger).
pub fn check_baseboards(templates: &[Template]) -> Result<()> {
    for (i, t) in templates.iter().enumerate() {
        check_baseboard_agrees(t, &templates[..i])?;
    }
    Ok(())
}

fn device_set(devices: &[PciAddress]) -> BTreeSet<(u32, u8, u8, u8)> {
    devices
        .iter()
        .map(|a| (a.domain, a.bus, a.slot, a.function))
        .collect()
}

fn parse_domain(xml: &str) -> Result<roxmltree::Document<'_>> {
    domain_xml::check(xml, "vm.domain_xml")?;
    Ok(roxmltree::Document::parse(xml).expect("checked above"))
}

/// libvirt writes address parts as `0x41` (hex) or `65` (decimal).
fn xml_number(text: &str) -> Option<u32> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

fn parse_vm(v: &Value) -> Result<VmSource> {
    let m = object(v, "vm", &["domain", "domain_xml"])?;
    match (m.get("domain"), m.get("domain_xml")) {
        (Some(d), None) => {
            let d = string(d, "vm.domain")?;
            validate_name("vm.domain", &d)?;
            Ok(VmSource::Domain(d))
        }
        (None, Some(x)) => {
            let x = string(x, "vm.domain_xml")?;
            domain_xml::check(&x, "vm.domain_xml")?;
            Ok(VmSource::DomainXml(x))
        }
        _ => Err(Error::field(
            "vm",
            "exactly one of domain (an existing domain's name) or domain_xml",
        )),
    }
}

fn parse_baseboard(v: &Value) -> Result<Vec<PciAddress>> {
    let items = v
        .as_array()
        .ok_or_else(|| Error::field("baseboard", "a JSON array of PCI addresses"))?;
    if items.len() > MAX_BASEBOARD {
        return Err(Error::field(
            "baseboard",
            format!("at most {MAX_BASEBOARD} devices"),
        ));
    }
    let mut out: Vec<PciAddress> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("baseboard[{i}]");
        let device = item
            .as_str()
            .and_then(PciAddress::parse)
            .ok_or_else(|| Error::field(&path, "a PCI address such as 0000:41:00.0"))?;
        if out.contains(&device) {
            return Err(Error::field(
                &path,
                format!("{} is listed twice", pci_text(&device)),
            ));
        }
        out.push(device);
    }
    Ok(out)
}

fn parse_readiness(v: &Value) -> Result<Readiness> {
    let m = object(v, "readiness", &["tcp", "http", "agent"])?;
    if m.len() != 1 {
        return Err(Error::field(
            "readiness",
            "exactly one of tcp (a port, or host:port), http (a URL) or agent (true); \
             leave it out to count libvirt's STARTED as ready",
        ));
    }
    let (kind, body) = m.iter().next().expect("one entry");
    match kind.as_str() {
        "tcp" => parse_tcp(body),
        "http" => {
            let url = string(body, "readiness.http")?;
            let ok = url.len() <= 2048
                && url
                    .strip_prefix("http://")
                    .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
                && !url.chars().any(|c| c.is_whitespace() || c.is_control());
            if !ok {
                return Err(Error::field(
                    "readiness.http",
                    "a URL such as http://10.0.0.5:8000/health",
                ));
            }
            Ok(Readiness::Http(url))
        }
        "agent" => match body.as_bool() {
            Some(true) => Ok(Readiness::Agent),
            _ => Err(Error::field(
                "readiness.agent",
                "true (the QEMU guest agent answers); leave readiness out to count \
                 libvirt's STARTED as ready",
            )),
        },
        _ => unreachable!("object() admits only known keys"),
    }
}

/// `8000` (the guest's own addresses) or `"10.0.0.5:8000"` / `"[fd00::5]:8000"`.
fn parse_tcp(body: &Value) -> Result<Readiness> {
    let wrong = || {
        Error::field(
            "readiness.tcp",
            "a port from 1 to 65535 (on the guest's addresses as libvirt knows them), \
             or host:port such as \"10.0.0.5:8000\"",
        )
    };
    let port = |p: Option<u64>| {
        p.and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p > 0)
            .ok_or_else(wrong)
    };
    if let Some(text) = body.as_str() {
        let (host, p) = text.rsplit_once(':').ok_or_else(wrong)?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let ok_host = !bare.is_empty()
            && host.len() <= 253
            && (host.starts_with('[') == host.ends_with(']'))
            && (bare.contains(':') == host.starts_with('['))
            && bare
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-:".contains(c));
        if !ok_host {
            return Err(wrong());
        }
        return Ok(Readiness::Tcp {
            host: Some(host.to_string()),
            port: port(p.parse().ok())?,
        });
    }
    Ok(Readiness::Tcp {
        host: None,
        port: port(body.as_u64())?,
    })
}

/// A template and the name of its VM in libvirt.
#[derive(Clone, Debug)]
pub struct Defined {
    pub template: Template,
    pub domain: String,
}

impl Defined {
    /// A template from the ledger, with its VM's name (no libvirt call).
    pub fn restore(spec: &str) -> Result<Defined> {
        let t = Template::parse_stored(spec)?;
        let domain = match &t.vm {
            crate::request::VmSource::Domain(name) => name.clone(),
            crate::request::VmSource::DomainXml(xml) => roxmltree::Document::parse(xml)
                .ok()
                .and_then(|d| {
                    d.root_element()
                        .children()
                        .find(|n| n.has_tag_name("name"))
                        .and_then(|n| n.text())
                        .map(str::to_string)
                })
                .ok_or_else(|| Error::field("vm.domain_xml", "the domain has no <name>"))?,
        };
        Ok(Defined {
            template: t,
            domain,
        })
    }

    /// `name (internal|external)`: who its slices serve.
    pub fn user(&self) -> String {
        let u = &self.template.user;
        format!("{} ({})", u.name, u.kind.as_str())
    }

    /// The checks a new template passes against those already defined,
    /// before and after its VM is looked up in libvirt (another may have
    /// been defined meanwhile).
    pub fn check_new(t: &Template, others: &[&Defined], domain: Option<&str>) -> Result<()> {
        if others.iter().any(|o| o.template.name == t.name) {
            return Err(Error::Exists(format!(
                "a template named {} already exists",
                t.name
            )));
        }
        let templates: Vec<Template> = others.iter().map(|d| d.template.clone()).collect();
        check_baseboard_agrees(t, &templates)?;
        if let Some(domain) = domain {
            if others.iter().any(|d| d.domain == domain) {
                return Err(Error::Conflict(format!(
                    "domain {domain} already belongs to another template"
                )));
            }
        }
        Ok(())
    }
}

/// An absolute, normalised path: compared as written against the domain's
/// disk sources, so `/a//b` or `/a/./b` would never match.
fn path(v: &Value, field: &str) -> Result<String> {
    let p = string(v, field)?;
    let normal = p.len() > 1
        && p.len() <= MAX_PATH
        && p.starts_with('/')
        && !p.ends_with('/')
        && !p.chars().any(char::is_control)
        && p[1..]
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if !normal {
        return Err(Error::field(
            field,
            "an absolute, normalised path such as /var/lib/astraeus/weights/llama.img",
        ));
    }
    Ok(p)
}

#[cfg(test)]
mod tests;
