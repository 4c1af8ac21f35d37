//! A VM worker's domain XML, made from the one it was submitted with (or the
//! existing domain's definition): its own name, no UUID (libvirt makes a new
//! one, so it never clashes with the domain it was copied from), its GPUs as
//! PCI hostdevs and the SMBIOS OEM strings that tell the guest its GPU memory.
//! Pure string work on byte ranges found by a real XML parser, so everything
//! else in the document is kept exactly as written.

use crate::error::{Error, Result};

/// The worker's domain name: reconciliation finds its VM by this name.
pub fn domain_name(worker: &str) -> String {
    format!("astraeus-{worker}")
}

/// Marks a domain as ours, naming its worker: a domain someone else named
/// `astraeus-…` is never mistaken for a worker's.
pub const NAMESPACE: &str = "https://astraeusd.org/xmlns/worker/1";

/// The worker a domain belongs to, read from the mark in its XML.
pub fn worker_of(xml: &str) -> Option<String> {
    let doc = roxmltree::Document::parse(xml).ok()?;
    let metadata = doc
        .root_element()
        .children()
        .find(|n| n.has_tag_name("metadata"))?;
    let mark = metadata
        .children()
        .find(|n| n.tag_name().namespace() == Some(NAMESPACE))?;
    let worker = mark.text()?.trim().to_string();
    (doc.root_element()
        .children()
        .find(|n| n.has_tag_name("name"))
        .and_then(|n| n.text())
        == Some(domain_name(&worker).as_str()))
    .then_some(worker)
}

/// Checks that `xml` is a well-formed `<domain>` document (at submit time).
pub fn check(xml: &str, field: &str) -> Result<()> {
    let doc = roxmltree::Document::parse(xml)
        .map_err(|e| Error::field(field, format!("not well-formed XML: {e}")))?;
    if doc.root_element().tag_name().name() != "domain" {
        return Err(Error::field(
            field,
            format!(
                "a libvirt <domain> document, not <{}>",
                doc.root_element().tag_name().name()
            ),
        ));
    }
    Ok(())
}

/// A PCI address as NVML writes it (`00000000:65:00.0`) or lspci (`0000:65:00.0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u8,
    pub slot: u8,
    pub function: u8,
}

impl PciAddress {
    pub fn parse(text: &str) -> Option<PciAddress> {
        let (rest, function) = text.trim().rsplit_once('.')?;
        let mut parts = rest.rsplitn(3, ':');
        let slot = u8::from_str_radix(parts.next()?, 16).ok()?;
        let bus = u8::from_str_radix(parts.next()?, 16).ok()?;
        let domain = match parts.next() {
            Some(d) => u32::from_str_radix(d, 16).ok()?,
            None => 0,
        };
        let function = u8::from_str_radix(function, 16).ok()?;
        (slot < 32 && function < 8).then_some(PciAddress {
            domain,
            bus,
            slot,
            function,
        })
    }

    fn hostdev(&self) -> String {
        format!(
            "<hostdev mode='subsystem' type='pci' managed='yes'><source>\
             <address domain='0x{:04x}' bus='0x{:02x}' slot='0x{:02x}' function='0x{:x}'/>\
             </source></hostdev>",
            self.domain, self.bus, self.slot, self.function
        )
    }
}

/// Whether the domain XML passes any of `devices` through: a PCI
/// `<hostdev>`, or an `<interface type='hostdev'>` (a network function
/// passed through: its host address is a PCI address just the same).
/// Err (saying why) when that cannot be told: the XML does not parse, or
/// such a device's address is missing or not a number. The interlock
/// takes such a domain as a holder: it fails closed.
pub fn passes_through(xml: &str, devices: &[PciAddress]) -> Result<bool, String> {
    Ok(passed_through(xml)?.iter().any(|found| {
        devices
            .iter()
            .any(|d| *found == (d.domain, d.bus as u32, d.slot as u32, d.function as u32))
    }))
}

/// The `<name>` of a domain document.
pub fn name_of(xml: &str) -> Option<String> {
    let doc = roxmltree::Document::parse(xml).ok()?;
    let name = doc
        .root_element()
        .children()
        .find(|n| n.has_tag_name("name"))?;
    Some(name.text()?.trim().to_string())
}

/// A domain's disk a guest can write: its source (file or device) and
/// whether libvirt discards what is written at power-off (`<transient/>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WritableDisk {
    pub source: String,
    pub file: bool,
    pub transient: bool,
}

/// The disks a guest can write (not CD-ROMs, floppies, read-only or
/// shareable disks), in document order.
pub fn writable_disks(xml: &str) -> Result<Vec<WritableDisk>> {
    let doc = roxmltree::Document::parse(xml)
        .map_err(|e| Error::field("vm", format!("the domain's XML could not be parsed: {e}")))?;
    Ok(writable_disk_nodes(&doc)
        .into_iter()
        .map(|(d, source, file)| WritableDisk {
            source,
            file,
            transient: d.children().any(|n| n.has_tag_name("transient")),
        })
        .collect())
}

fn writable_disk_nodes<'a, 'i>(
    doc: &'a roxmltree::Document<'i>,
) -> Vec<(roxmltree::Node<'a, 'i>, String, bool)> {
    doc.descendants()
        .filter(|n| n.has_tag_name("disk"))
        .filter(|d| d.attribute("device").unwrap_or("disk") == "disk")
        .filter(|d| {
            !d.children()
                .any(|n| n.has_tag_name("readonly") || n.has_tag_name("shareable"))
        })
        .filter_map(|d| {
            let s = d.children().find(|s| s.has_tag_name("source"))?;
            match (s.attribute("file"), s.attribute("dev")) {
                (Some(f), _) => Some((d, f.to_string(), true)),
                (None, Some(dev)) => Some((d, dev.to_string(), false)),
                _ => None,
            }
        })
        .collect()
}

/// The domain with `<transient/>` in each writable file disk that lacks it:
/// libvirt then starts the VM on an overlay it drops at power-off, so each
/// start sees the disks as they were defined. A writable disk that is not a
/// file (a block device, a network volume) cannot be made so: refused,
/// naming it.
pub fn with_transient_disks(xml: &str) -> Result<String> {
    let doc = roxmltree::Document::parse(xml)
        .map_err(|e| Error::field("vm", format!("the domain's XML could not be parsed: {e}")))?;
    let mut inserts = Vec::new();
    for (d, source, file) in writable_disk_nodes(&doc) {
        if !file {
            return Err(not_discardable(&source));
        }
        if d.children().any(|n| n.has_tag_name("transient")) {
            continue;
        }
        let end = d.range().end;
        let text = &xml[d.range()];
        // `<disk …/>` has no source; a disk found here has a closing tag.
        let close = text.rfind("</").map(|i| d.range().start + i).unwrap_or(end);
        inserts.push(close);
    }
    let mut out = xml.to_string();
    for at in inserts.into_iter().rev() {
        out.insert_str(at, "<transient/>");
    }
    Ok(out)
}

/// Every writable disk of an existing domain is discarded at power-off;
/// else why not, and what to do.
pub fn check_transient(xml: &str) -> Result<()> {
    for d in writable_disks(xml)? {
        if !d.file {
            return Err(not_discardable(&d.source));
        }
        if !d.transient {
            return Err(Error::field(
                "stateless",
                format!(
                    "disk {} of the domain keeps what a slice writes: add <transient/> to its \
                     <disk> (libvirt then discards the slice's writes at power-off), or set \
                     \"stateless\": false to keep them",
                    crate::json_fields::clip(&d.source)
                ),
            ));
        }
    }
    Ok(())
}

fn not_discardable(source: &str) -> Error {
    Error::field(
        "stateless",
        format!(
            "disk {} of the domain is not a file: libvirt discards a slice's writes only on \
             file disks; make it a file disk, attach it <readonly/>, or set \"stateless\": false",
            crate::json_fields::clip(source)
        ),
    )
}

/// Whether `existing` (a domain's definition, as libvirt writes it back) is
/// the VM `xml` describes, as far as a template goes: the same name, the
/// same devices passed through and the same disks. A template removed and
/// created again from the same file takes the domain it defined then
/// (RemoveTemplate keeps it; libvirt refuses to define it twice).
pub fn same_vm(existing: &str, xml: &str) -> bool {
    let disks = |x: &str| -> Option<std::collections::BTreeSet<String>> {
        let doc = roxmltree::Document::parse(x).ok()?;
        Some(
            doc.descendants()
                .filter(|n| n.has_tag_name("disk"))
                .filter_map(|d| d.children().find(|s| s.has_tag_name("source")))
                .filter_map(|s| s.attribute("file").or_else(|| s.attribute("dev")))
                .map(str::to_string)
                .collect(),
        )
    };
    let devices = |x: &str| -> Option<std::collections::BTreeSet<(u32, u32, u32, u32)>> {
        Some(passed_through(x).ok()?.into_iter().collect())
    };
    name_of(existing).is_some()
        && name_of(existing) == name_of(xml)
        && devices(existing).is_some()
        && devices(existing) == devices(xml)
        && disks(existing) == disks(xml)
}

/// The (domain, bus, slot, function) of every PCI device a domain passes
/// through; Err (saying why) when that cannot be told.
fn passed_through(xml: &str) -> Result<Vec<(u32, u32, u32, u32)>, String> {
    let doc =
        roxmltree::Document::parse(xml).map_err(|e| format!("its XML could not be parsed: {e}"))?;
    // libvirt leaves out a zero domain; the others it always writes.
    let num = |a: roxmltree::Node<'_, '_>, key: &str| -> Result<u32, String> {
        let Some(v) = a.attribute(key) else {
            return if key == "domain" {
                Ok(0)
            } else {
                Err(format!("a PCI hostdev's address has no {key}"))
            };
        };
        match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
            Some(hex) => u32::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        }
        .ok_or_else(|| {
            format!(
                "a PCI hostdev's address has {key}={:?}, not a number",
                crate::json_fields::clip(v)
            )
        })
    };
    let passed = |n: &roxmltree::Node<'_, '_>| {
        (n.has_tag_name("hostdev") && n.attribute("type") == Some("pci"))
            || (n.has_tag_name("interface") && n.attribute("type") == Some("hostdev"))
    };
    let mut out = Vec::new();
    for hostdev in doc.descendants().filter(passed) {
        let address = hostdev
            .children()
            .find(|n| n.has_tag_name("source"))
            .and_then(|s| s.children().find(|n| n.has_tag_name("address")))
            .ok_or("a PCI hostdev has no source address")?;
        out.push((
            num(address, "domain")?,
            num(address, "bus")?,
            num(address, "slot")?,
            num(address, "function")?,
        ));
    }
    Ok(out)
}

/// The unix socket path on the host of the domain's virtio channel whose
/// target is named `target` (libvirt fills the path in when the XML leaves
/// it out, so the live XML is the one to read).
pub fn channel_path(xml: &str, target: &str) -> Option<String> {
    let doc = roxmltree::Document::parse(xml).ok()?;
    doc.descendants()
        .filter(|n| n.has_tag_name("channel") && n.attribute("type") == Some("unix"))
        .find(|c| {
            c.children()
                .any(|t| t.has_tag_name("target") && t.attribute("name") == Some(target))
        })?
        .children()
        .find(|n| n.has_tag_name("source"))?
        .attribute("path")
        .map(str::to_string)
}

/// The worker's domain: `source` renamed, its UUID dropped, hostdevs for
/// `gpus` and OEM strings with `gpu_memory_gb` added.
pub fn worker_domain(
    source: &str,
    worker: &str,
    gpus: &[PciAddress],
    gpu_memory_gb: &str,
) -> Result<String> {
    let field = "run.vm.domain_xml";
    check(source, field)?;
    let doc = roxmltree::Document::parse(source).expect("checked above");
    let root = doc.root_element();
    let child = |name: &str| root.children().find(|n| n.has_tag_name(name));
    let mut edits: Vec<Edit> = Vec::new();

    let name = format!("<name>{}</name>", domain_name(worker));
    match child("name") {
        Some(n) => edits.push((n.range(), name)),
        None => edits.push((open_end(source, &root), name)),
    }
    if let Some(u) = child("uuid") {
        edits.push((u.range(), String::new()));
    }
    let mark = format!("<astraeus:worker xmlns:astraeus='{NAMESPACE}'>{worker}</astraeus:worker>");
    match child("metadata") {
        Some(m) => edits.push(append_into(source, &m, mark)),
        None => edits.push(append_into(
            source,
            &root,
            format!("<metadata>{mark}</metadata>"),
        )),
    }

    let hostdevs: String = gpus.iter().map(PciAddress::hostdev).collect();
    match child("devices") {
        Some(d) => edits.push(append_into(source, &d, hostdevs)),
        None => edits.push(append_into(
            source,
            &root,
            format!("<devices>{hostdevs}</devices>"),
        )),
    }

    let strings = format!(
        "<entry>ASTRAEUS_GPU_MEMORY_GB={gpu_memory_gb}</entry>\
         <entry>io.systemd.credential:astraeus.gpu_memory_gb={gpu_memory_gb}</entry>"
    );
    let smbios = root
        .children()
        .find(|n| n.has_tag_name("sysinfo") && n.attribute("type") == Some("smbios"));
    match smbios {
        Some(s) => match s.children().find(|n| n.has_tag_name("oemStrings")) {
            Some(o) => edits.push(append_into(source, &o, strings)),
            None => edits.push(append_into(
                source,
                &s,
                format!("<oemStrings>{strings}</oemStrings>"),
            )),
        },
        None => edits.push(append_into(
            source,
            &root,
            format!("<sysinfo type='smbios'><oemStrings>{strings}</oemStrings></sysinfo>"),
        )),
    }
    // The guest sees the sysinfo only with <smbios mode='sysinfo'/> in <os>.
    if let Some(os) = child("os") {
        if !os.children().any(|n| n.has_tag_name("smbios")) {
            edits.push(append_into(source, &os, "<smbios mode='sysinfo'/>".into()));
        }
    } else {
        return Err(Error::field(field, "the domain has no <os> element"));
    }

    // Apply back to front so earlier ranges stay valid.
    edits.sort_by_key(|(r, _)| std::cmp::Reverse((r.start, r.end)));
    let mut out = source.to_string();
    for (range, text) in edits {
        out.replace_range(range, &text);
    }
    Ok(out)
}

/// The edit that appends `text` inside the element, just before `</x>`; a
/// self-closing `<x/>` is rewritten open (`<x>text</x>`).
fn append_into(source: &str, node: &roxmltree::Node, text: String) -> Edit {
    let r = node.range();
    let element = &source[r.clone()];
    if element.ends_with("/>") && !element.contains("</") {
        let name = node.tag_name().name();
        return ((r.end - 2)..r.end, format!(">{text}</{name}>"));
    }
    let at = r.start + element.rfind("</").expect("an element with content closes");
    (at..at, text)
}

type Edit = (std::ops::Range<usize>, String);

/// An empty range just after the element's opening tag.
fn open_end(source: &str, node: &roxmltree::Node) -> std::ops::Range<usize> {
    let r = node.range();
    let at = r.start + source[r.clone()].find('>').expect("a tag ends") + 1;
    at..at
}

#[cfg(test)]
mod tests {
    use super::{passes_through, PciAddress};

    fn hostdev(address: &str) -> String {
        format!(
            "<domain><devices><hostdev mode='subsystem' type='pci' managed='yes'>\
             <source><address {address}/></source></hostdev></devices></domain>"
        )
    }

    fn board() -> Vec<PciAddress> {
        ["0000:41:00.0", "0000:42:00.1"]
            .iter()
            .map(|a| PciAddress::parse(a).unwrap())
            .collect()
    }

    #[test]
    fn a_pci_hostdev_on_the_baseboard_passes_it_through_in_hex_or_decimal() {
        let hex = hostdev("domain='0x0000' bus='0x41' slot='0x00' function='0x0'");
        assert_eq!(passes_through(&hex, &board()), Ok(true));
        let decimal = hostdev("domain='0' bus='66' slot='0' function='1'");
        assert_eq!(passes_through(&decimal, &board()), Ok(true));
        // libvirt leaves out a zero domain.
        let no_domain = hostdev("bus='0x42' slot='0x00' function='0x1'");
        assert_eq!(passes_through(&no_domain, &board()), Ok(true));
    }

    /// #63: a network function passed through as `<interface
    /// type='hostdev'>` holds its PCI device as a hostdev does (a foreign
    /// domain passing the baseboard so was not seen by the interlock).
    #[test]
    fn an_interface_of_type_hostdev_passes_its_device_through() {
        let xml = "<domain><devices><interface type='hostdev' managed='yes'><source>\
            <address type='pci' domain='0x0000' bus='0x41' slot='0x00' function='0x0'/>\
            </source><mac address='52:54:00:6d:90:02'/></interface></devices></domain>";
        assert_eq!(passes_through(xml, &board()), Ok(true));
        let other = xml.replace("0x41", "0x43");
        assert_eq!(passes_through(&other, &board()), Ok(false));
        let bridge = "<domain><devices><interface type='bridge'><source bridge='br0'/>\
            </interface></devices></domain>";
        assert_eq!(passes_through(bridge, &board()), Ok(false));
        let unreadable = "<domain><devices><interface type='hostdev'><source/>\
            </interface></devices></domain>";
        assert!(
            passes_through(unreadable, &board()).is_err(),
            "fails closed"
        );
    }

    #[test]
    fn other_devices_and_other_kinds_of_hostdev_pass_nothing_through() {
        let other = hostdev("domain='0x0000' bus='0x43' slot='0x00' function='0x0'");
        assert_eq!(passes_through(&other, &board()), Ok(false));
        let usb = "<domain><devices><hostdev mode='subsystem' type='usb'>            <source><vendor id='0x1234'/><product id='0xbeef'/></source></hostdev>            </devices></domain>";
        assert_eq!(passes_through(usb, &board()), Ok(false));
        let none = "<domain><devices><disk type='file'/></devices></domain>";
        assert_eq!(passes_through(none, &board()), Ok(false));
        assert_eq!(passes_through(none, &[]), Ok(false));
    }

    /// What cannot be read is not taken for "passes nothing": the
    /// interlock counts such a domain as a holder.
    #[test]
    fn a_domain_that_cannot_be_read_is_an_error_not_a_no() {
        let e = passes_through("<domain><devices><hostdev", &board()).unwrap_err();
        assert!(e.starts_with("its XML could not be parsed"), "{e}");
        let e = passes_through(
            &hostdev("domain='0x0000' bus='0x4g' slot='0x00' function='0x0'"),
            &board(),
        )
        .unwrap_err();
        assert!(e.contains("bus=\"0x4g\", not a number"), "{e}");
        let e = passes_through(&hostdev("domain='0' slot='0' function='0'"), &board()).unwrap_err();
        assert!(e.contains("has no bus"), "{e}");
        let bare = "<domain><devices><hostdev mode='subsystem' type='pci'/></devices></domain>";
        let e = passes_through(bare, &board()).unwrap_err();
        assert!(e.contains("no source address"), "{e}");
    }

    #[test]
    fn a_channel_is_found_by_its_target_name() {
        let xml = "<domain><devices>\
            <channel type='pty'><target type='virtio' name='org.astraeus.gpu.0'/></channel>\
            <channel type='unix'><source mode='bind' path='/run/a.sock'/>\
            <target type='virtio' name='org.qemu.guest_agent.0'/></channel>\
            <channel type='unix'><source mode='bind' path='/run/gpu.sock'/>\
            <target type='virtio' name='org.astraeus.gpu.0'/></channel>\
            </devices></domain>";
        assert_eq!(
            channel_path(xml, "org.astraeus.gpu.0").as_deref(),
            Some("/run/gpu.sock")
        );
        assert_eq!(channel_path(xml, "org.example.none"), None);
        assert_eq!(channel_path("<not xml", "org.astraeus.gpu.0"), None);
    }

    use super::*;

    const SRC: &str = "<domain type='test'>\n  <name>base</name>\n  \
        <uuid>6695eb01-f6a4-8304-79aa-97f2502e193f</uuid>\n  <memory>8192</memory>\n  \
        <os><type>hvm</type></os>\n  <devices><disk type='file'/></devices>\n</domain>";

    fn gpu(bus: u8) -> PciAddress {
        PciAddress {
            domain: 0,
            bus,
            slot: 0,
            function: 0,
        }
    }

    #[test]
    fn pci_addresses_parse_in_nvml_and_lspci_forms() {
        assert_eq!(PciAddress::parse("00000000:65:00.0"), Some(gpu(0x65)));
        assert_eq!(PciAddress::parse("0000:65:00.0"), Some(gpu(0x65)));
        assert_eq!(PciAddress::parse("65:00.0"), Some(gpu(0x65)));
        assert_eq!(PciAddress::parse("65:40.0"), None);
        assert_eq!(PciAddress::parse("GPU-1"), None);
    }

    #[test]
    fn the_worker_domain_is_renamed_loses_its_uuid_and_gets_gpus_and_oem_strings() {
        let out = worker_domain(SRC, "listen", &[gpu(0x65), gpu(0xb3)], "80").unwrap();
        let doc = roxmltree::Document::parse(&out).unwrap();
        let root = doc.root_element();
        let text = |tag: &str| {
            root.descendants()
                .filter(|n| n.has_tag_name(tag))
                .map(|n| n.text().unwrap_or_default().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(text("name"), ["astraeus-listen"]);
        assert_eq!(worker_of(&out).as_deref(), Some("listen"));
        assert_eq!(worker_of(SRC), None);
        assert!(text("uuid").is_empty());
        assert_eq!(
            text("entry"),
            [
                "ASTRAEUS_GPU_MEMORY_GB=80",
                "io.systemd.credential:astraeus.gpu_memory_gb=80"
            ]
        );
        let buses: Vec<&str> = root
            .descendants()
            .filter(|n| n.has_tag_name("hostdev"))
            .filter_map(|h| h.descendants().find(|n| n.has_tag_name("address")))
            .filter_map(|a| a.attribute("bus"))
            .collect();
        assert_eq!(buses, ["0x65", "0xb3"]);
        let smbios = root
            .descendants()
            .find(|n| n.has_tag_name("smbios"))
            .unwrap();
        assert_eq!(smbios.parent().unwrap().tag_name().name(), "os");
        assert_eq!(smbios.attribute("mode"), Some("sysinfo"));
        // The rest is kept as written.
        assert!(out.contains("<memory>8192</memory>"));
        assert!(out.contains("<disk type='file'/>"));
    }

    #[test]
    fn existing_sysinfo_and_self_closing_devices_are_extended() {
        let src =
            "<domain type='kvm'><name>b</name><os><type>hvm</type><smbios mode='sysinfo'/></os>\
            <sysinfo type='smbios'><oemStrings><entry>keep</entry></oemStrings></sysinfo>\
            <devices/></domain>";
        let out = worker_domain(src, "w", &[gpu(1)], "7.5").unwrap();
        let doc = roxmltree::Document::parse(&out).unwrap();
        let entries: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("entry"))
            .filter_map(|n| n.text())
            .collect();
        assert_eq!(
            entries,
            [
                "keep",
                "ASTRAEUS_GPU_MEMORY_GB=7.5",
                "io.systemd.credential:astraeus.gpu_memory_gb=7.5"
            ]
        );
        assert_eq!(
            doc.descendants()
                .filter(|n| n.has_tag_name("smbios"))
                .count(),
            1
        );
        assert_eq!(
            doc.descendants()
                .filter(|n| n.has_tag_name("sysinfo"))
                .count(),
            1
        );
        assert_eq!(
            doc.descendants()
                .filter(|n| n.has_tag_name("hostdev"))
                .count(),
            1
        );
    }

    #[test]
    fn bad_documents_name_the_field() {
        assert_eq!(
            check("<domain><name>x</domain>", "run.vm.domain_xml")
                .unwrap_err()
                .message()
                .split(':')
                .next(),
            Some("run.vm.domain_xml")
        );
        assert!(check("<network/>", "f")
            .unwrap_err()
            .message()
            .contains("<network>"));
        assert!(
            worker_domain("<domain><name>x</name></domain>", "w", &[], "1")
                .unwrap_err()
                .message()
                .contains("<os>")
        );
    }

    /// Stateless templates: each writable file disk gains `<transient/>`
    /// and nothing else of the document changes; read-only, shareable,
    /// CD-ROM and already transient disks are left as they are; a writable
    /// block device is refused, naming it.
    #[test]
    fn writable_file_disks_become_transient_and_nothing_else_changes() {
        use super::{check_transient, with_transient_disks, writable_disks};
        let xml = "<domain><name>t</name><devices>\
            <disk type='file' device='disk'><source file='/v/os.qcow2'/><target dev='vda'/></disk>\
            <disk type='file'><source file='/v/w.img'/><readonly/><target dev='vdb'/></disk>\
            <disk type='file' device='cdrom'><source file='/v/i.iso'/><target dev='hdc'/></disk>\
            <disk type='file'><source file='/v/s.img'/><shareable/><target dev='vdc'/></disk>\
            <disk type='file'><source file='/v/t.img'/><transient/><target dev='vdd'/></disk>\
            <disk type='file'>\n  <source file='/v/data.img'/>\n  <target dev='vde'/>\n</disk>\
            </devices></domain>";
        assert!(check_transient(xml).is_err());
        let out = with_transient_disks(xml).unwrap();
        check_transient(&out).unwrap();
        let disks = writable_disks(&out).unwrap();
        let sources: Vec<&str> = disks.iter().map(|d| d.source.as_str()).collect();
        assert_eq!(sources, ["/v/os.qcow2", "/v/t.img", "/v/data.img"]);
        assert!(disks.iter().all(|d| d.transient && d.file));
        // Two inserted beside the one there; without them, the document as given.
        assert_eq!(out.matches("<transient/>").count(), 3);
        assert_eq!(
            out.replace("<transient/>", ""),
            xml.replace("<transient/>", "")
        );
        assert_eq!(with_transient_disks(&out).unwrap(), out, "twice is once");
        let block = "<domain><devices><disk type='block'><source dev='/dev/sdz'/>\
            <target dev='vda'/></disk></devices></domain>";
        let e = with_transient_disks(block).unwrap_err();
        assert!(
            e.message()
                .contains("disk /dev/sdz of the domain is not a file"),
            "{e:?}"
        );
        assert!(check_transient(block).is_err());
        // A domain without writable disks is stateless as it is.
        check_transient("<domain><devices/></domain>").unwrap();
    }
}
