//! The I/O side of time-slicing, owned by the service loop: templates and
//! their persistent VMs in libvirt, the handoff state machine
//! ([`crate::slicing::handoff`]) fed with libvirt's lifecycle events, due
//! scheduled actions and its own timer, and its actions carried out. Slow
//! libvirt calls run in tasks that report back to the loop as commands, so
//! the loop (and the watchdog it feeds) never waits on a hypervisor.

use crate::error::{Error, Result};
use crate::runtime::domain_xml::PciAddress;
use crate::runtime::libvirt::{Libvirt, Lifecycle};
use crate::schedule::ScheduledAction;
use crate::service::Command;
use crate::slicing::handoff::{self, Action, Event, Settings, State};
use crate::slicing::template::{self, Readiness, Template};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::{broadcast, mpsc};

/// A template and the name of its VM in libvirt.
#[derive(Clone, Debug)]
pub struct Defined {
    pub template: Template,
    pub domain: String,
}

/// The virtio channel a template's guest writes its GPU figures to: the
/// lines `nvidia-smi --query-gpu=index,utilization.gpu,memory.used,power.draw
/// --format=csv,noheader,nounits -l 5` prints (docs/time-slicing.md). A
/// passed-through GPU is invisible to the host's NVML, so this is the only
/// source of them.
pub const GPU_CHANNEL: &str = "org.astraeus.gpu.0";

/// One GPU's figures, from one line the guest wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSample {
    pub index: u32,
    pub util_pct: Option<f64>,
    pub memory_mib: Option<f64>,
    pub power_w: Option<f64>,
}

impl GpuSample {
    /// `0, 37, 10240, 250.12` (units after a number, `[N/A]` and
    /// `[Not Supported]` are accepted: the last two count as unknown).
    /// Lines that are not such a row give None.
    pub fn parse(line: &str) -> Option<GpuSample> {
        let fields: Vec<&str> = line.trim().split(',').map(str::trim).collect();
        if fields.len() != 4 {
            return None;
        }
        let number = |f: &str| -> Result<Option<f64>, ()> {
            if f.starts_with('[') {
                return Ok(None);
            }
            let n: f64 = f
                .split_whitespace()
                .next()
                .ok_or(())?
                .parse()
                .map_err(|_| ())?;
            if n.is_finite() && n >= 0.0 {
                Ok(Some(n))
            } else {
                Err(())
            }
        };
        Some(GpuSample {
            index: fields[0].parse().ok()?,
            util_pct: number(fields[1]).ok()?.map(|u| u.min(100.0)),
            memory_mib: number(fields[2]).ok()?,
            power_w: number(fields[3]).ok()?,
        })
    }
}

/// Gaps longer than this between two readings of a GPU are not counted as
/// energy (the guest stopped reporting; nothing is guessed for the gap).
const MAX_ENERGY_GAP_MS: u64 = 60_000;

/// What is measured over the running slice: CPU from libvirt's domain info,
/// GPU figures from what the guest writes to [`GPU_CHANNEL`] (none written:
/// "not reported", never zeros).
#[derive(Debug, Default)]
pub struct Meter {
    pub template: String,
    /// (wall ns, cpu ns) of the last reading.
    last: Option<(u64, u64)>,
    pub cpu: Vec<f64>,
    gpu_util: Vec<f64>,
    /// Each GPU's last reading: (at ms, memory MiB, power W).
    gpus: BTreeMap<u32, (u64, Option<f64>, Option<f64>)>,
    memory_peak_mib: Option<f64>,
    energy_j: Option<f64>,
    /// The task reading the guest's channel; stopped with the slice.
    pub reader: Option<tokio::task::AbortHandle>,
}

impl Drop for Meter {
    fn drop(&mut self) {
        if let Some(r) = &self.reader {
            r.abort();
        }
    }
}

impl Meter {
    pub fn new(template: &str) -> Meter {
        let mut m = Meter::default();
        m.template = template.to_string();
        m
    }

    /// Adds a reading of the domain's CPU time at `wall_ns`.
    pub fn record(&mut self, wall_ns: u64, cpu_ns: u64, vcpus: u32) {
        if let Some((w0, c0)) = self.last {
            if wall_ns > w0 && cpu_ns >= c0 {
                let pct = (cpu_ns - c0) as f64 * 100.0 / ((wall_ns - w0) as f64 * vcpus as f64);
                self.cpu.push(pct.min(100.0));
            }
        }
        self.last = Some((wall_ns, cpu_ns));
    }

    /// Adds one GPU's reading from the guest, received at `at_ms`. Energy
    /// is each GPU's power times the time to its next reading.
    pub fn record_gpu(&mut self, at_ms: u64, s: &GpuSample) {
        if let Some(u) = s.util_pct {
            self.gpu_util.push(u);
        }
        if let Some((t0, _, Some(p0))) = self.gpus.get(&s.index) {
            let dt = at_ms.saturating_sub(*t0);
            if dt > 0 && dt <= MAX_ENERGY_GAP_MS {
                *self.energy_j.get_or_insert(0.0) += p0 * dt as f64 / 1000.0;
            }
        }
        self.gpus.insert(s.index, (at_ms, s.memory_mib, s.power_w));
        // The baseboard's memory in use now: each GPU's latest reading.
        let known: Vec<f64> = self.gpus.values().filter_map(|g| g.1).collect();
        if !known.is_empty() {
            let total: f64 = known.iter().sum();
            self.memory_peak_mib = Some(self.memory_peak_mib.map_or(total, |p| p.max(total)));
        }
    }

    pub fn measures(&self) -> crate::store::SliceMeasures {
        let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        crate::store::SliceMeasures {
            cpu_avg_pct: mean(&self.cpu),
            cpu_peak_pct: self.cpu.iter().copied().reduce(f64::max),
            gpu_avg_pct: mean(&self.gpu_util),
            gpu_peak_pct: self.gpu_util.iter().copied().reduce(f64::max),
            gpu_memory_peak_bytes: self
                .memory_peak_mib
                .map(|m| (m * 1024.0 * 1024.0).round() as u64),
            energy_j: self.energy_j,
        }
    }
}

/// Reads the GPU figures the guest writes to its [`GPU_CHANNEL`] and sends
/// each to the loop, until aborted (the slice ended). The host end is the
/// unix socket QEMU listens on (libvirt puts its path in the live XML); a
/// VM without the channel reports no GPU figures. Reconnects after the
/// guest side closes (a reboot inside the slice).
pub async fn read_guest_gpus(
    vms: Arc<Libvirt>,
    domain: String,
    template: String,
    tx: mpsc::Sender<Command>,
) {
    use tokio::io::AsyncBufReadExt;
    // The slice begins when its start is issued; the socket's path is in
    // the live XML only once the domain runs.
    loop {
        match vms.is_on(&domain).await {
            Ok(true) => break,
            Ok(false) => tokio::time::sleep(std::time::Duration::from_millis(250)).await,
            Err(e) => {
                tracing::warn!(template = %template, "waiting for {domain} to run: {e}");
                return;
            }
        }
    }
    let path = match vms.channel_path(&domain, GPU_CHANNEL).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            tracing::info!(template = %template, "{domain} has no {GPU_CHANNEL} channel: its GPU figures are not reported");
            return;
        }
        Err(e) => {
            tracing::warn!(template = %template, "reading {domain}'s channels: {e}");
            return;
        }
    };
    let mut warned = false;
    loop {
        match tokio::net::UnixStream::connect(&path).await {
            Ok(stream) => {
                tracing::info!(template = %template, "reading the GPU figures {domain}'s guest writes to {path}");
                warned = false;
                let mut lines = tokio::io::BufReader::new(stream).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let Some(sample) = GpuSample::parse(&line) else {
                        continue;
                    };
                    let at_ms = now_ms();
                    let cmd = Command::GuestGpu {
                        template: template.clone(),
                        sample,
                        at_ms,
                    };
                    if tx.send(cmd).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) if !warned => {
                warned = true;
                tracing::info!(template = %template, "the GPU channel of {domain} at {path} is not open yet: {e}");
            }
            Err(_) => {}
        }
        tokio::time::sleep(std::time::Duration::from_millis(handoff::DEFAULT_POLL_MS)).await;
    }
}

pub struct Slicer {
    pub vms: Arc<Libvirt>,
    pub templates: BTreeMap<String, Defined>,
    pub state: State,
    pub settings: Settings,
    /// The handoff machine's wake-up (epoch ms).
    pub timer_ms: Option<u64>,
    /// Scheduled actions have fired up to here.
    pub cursor: jiff::Timestamp,
    /// libvirt's lifecycle events, once there is a template to watch (the
    /// event loop thread and libvirt itself stay unloaded on hosts without).
    pub events: Option<broadcast::Receiver<Lifecycle>>,
    tx: mpsc::Sender<Command>,
    /// Allow weights disks on networked filesystems (config).
    pub allow_networked_weights: bool,
    /// The running slice's measurements.
    pub meter: Option<Meter>,
    /// Each template's last handoff dead time (ms), for the metrics.
    pub dead_times: BTreeMap<String, u64>,
    /// Templates whose weights are being staged (their VM may not start).
    pub staging: std::collections::BTreeSet<String>,
    /// The last reason each starting template was not ready, so the journal
    /// gets a line when it changes, not one a second.
    not_ready: Arc<std::sync::Mutex<BTreeMap<String, String>>>,
}

pub fn now_ms() -> u64 {
    crate::store::now_ms().max(0) as u64
}

impl Slicer {
    pub fn new(vms: Arc<Libvirt>, settings: Settings, tx: mpsc::Sender<Command>) -> Slicer {
        Slicer {
            vms,
            templates: BTreeMap::new(),
            state: State::Idle { released_ms: None },
            settings,
            timer_ms: None,
            cursor: jiff::Timestamp::now(),
            events: None,
            tx,
            allow_networked_weights: false,
            meter: None,
            staging: Default::default(),
            not_ready: Default::default(),
            dead_times: BTreeMap::new(),
        }
    }

    /// Starts listening to libvirt's events (once).
    pub fn watch_events(&mut self) {
        if self.events.is_none() {
            self.events = Some(crate::runtime::libvirt::events().subscribe());
        }
    }

    /// The template whose VM this domain is.
    pub fn template_of(&self, domain: &str) -> Option<&str> {
        self.templates
            .values()
            .find(|d| d.domain == domain)
            .map(|d| d.template.name.as_str())
    }

    fn domain(&self, template: &str) -> Option<String> {
        self.templates.get(template).map(|d| d.domain.clone())
    }

    /// Validates a new template against its VM, the other templates and the
    /// weights disk's filesystem; defines its VM when given as XML.
    pub async fn prepare(&self, spec: &str) -> Result<Defined> {
        let t = Template::parse(spec)?;
        let others: Vec<Template> = self
            .templates
            .values()
            .map(|d| d.template.clone())
            .collect();
        if others.iter().any(|o| o.name == t.name) {
            return Err(Error::Exists(format!(
                "a template named {} already exists",
                t.name
            )));
        }
        template::check_baseboard_agrees(&t, &others)?;
        if let Some(weights) = &t.weights_disk {
            let fs = fs_type_of(std::path::Path::new(weights)).unwrap_or_default();
            template::check_weights_local(weights, &fs, self.allow_networked_weights)?;
        }
        let domain = match &t.vm {
            crate::request::VmSource::Domain(name) => {
                let xml = self.vms.definition(name).await?;
                t.check_domain(&xml)?;
                name.clone()
            }
            crate::request::VmSource::DomainXml(xml) => {
                t.check_domain(xml)?;
                self.vms.define(xml.clone()).await?
            }
        };
        if self.templates.values().any(|d| d.domain == domain) {
            return Err(Error::Conflict(format!(
                "domain {domain} already belongs to another template"
            )));
        }
        Ok(Defined {
            template: t,
            domain,
        })
    }

    /// A template from the ledger, with its VM's name (no libvirt call).
    pub fn restore(spec: &str) -> Result<Defined> {
        let t = Template::parse(spec)?;
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

    /// Per-template limits, from the templates' overrides.
    pub fn refresh_limits(&mut self) {
        self.settings.per_template = self
            .templates
            .values()
            .filter(|d| {
                d.template.stop_timeout_seconds.is_some() || d.template.start_retries.is_some()
            })
            .map(|d| {
                let base = self.settings.limits;
                (
                    d.template.name.clone(),
                    handoff::Limits {
                        stop_timeout_ms: d
                            .template
                            .stop_timeout_seconds
                            .map_or(base.stop_timeout_ms, |s| s * 1000),
                        start_retries: d.template.start_retries.unwrap_or(base.start_retries),
                    },
                )
            })
            .collect();
    }

    /// The earliest scheduled action after the cursor: (when, [(template, action)]).
    pub fn next_due(
        &self,
        rotation: &[(String, Vec<ScheduledAction>)],
        tz: &jiff::tz::TimeZone,
    ) -> Option<(jiff::Timestamp, Vec<(String, crate::schedule::Action)>)> {
        let mut best: Option<(jiff::Timestamp, Vec<(String, crate::schedule::Action)>)> = None;
        for (template, actions) in rotation {
            for a in actions {
                let Some(t) = a.next_after(self.cursor, tz) else {
                    continue;
                };
                match &mut best {
                    Some((bt, list)) if *bt == t => list.push((template.clone(), a.action)),
                    Some((bt, _)) if *bt < t => {}
                    _ => best = Some((t, vec![(template.clone(), a.action)])),
                }
            }
        }
        best
    }

    /// Translates a libvirt event about a template VM into a handoff event,
    /// checking the domain's state first (a late STOPPED of an earlier run
    /// must not end the VM created after it).
    pub async fn lifecycle(&self, ev: &Lifecycle) -> Option<Event> {
        let template = self.template_of(&ev.domain)?.to_string();
        let on = self.vms.is_on(&ev.domain).await.ok()?;
        let at_ms = now_ms();
        match ev.event {
            virt::sys::VIR_DOMAIN_EVENT_STOPPED if !on => Some(Event::Stopped { template, at_ms }),
            virt::sys::VIR_DOMAIN_EVENT_STARTED if on => Some(Event::Started { template, at_ms }),
            _ => None,
        }
    }

    /// Carries out one action that needs the hypervisor, in a task of its
    /// own; failures come back to the loop as events.
    pub fn execute(&mut self, action: &Action) {
        let vms = self.vms.clone();
        let tx = self.tx.clone();
        let send = |tx: mpsc::Sender<Command>, e: Event| async move {
            let _ = tx.send(Command::Slice(e)).await;
        };
        match action {
            Action::SetTimer { at_ms } => self.timer_ms = Some(*at_ms),
            Action::Shutdown { template } | Action::Destroy { template } => {
                let hard = matches!(action, Action::Destroy { .. });
                let Some(domain) = self.domain(template) else {
                    return;
                };
                tokio::spawn(async move {
                    if let Err(e) = vms.power_off(&domain, hard).await {
                        tracing::warn!(template = %domain, "powering off {domain}: {e}");
                    }
                });
            }
            Action::Create { template } => {
                let Some(domain) = self.domain(template) else {
                    return;
                };
                // A new start: its first "not ready" is worth a line again.
                self.not_ready
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(template);
                let template = template.clone();
                tokio::spawn(async move {
                    if let Err(e) = vms.power_on(&domain).await {
                        let error = e.message().to_string();
                        send(
                            tx,
                            Event::StartFailed {
                                template,
                                error,
                                at_ms: now_ms(),
                            },
                        )
                        .await;
                    }
                });
            }
            Action::CheckRelease => {
                let devices: Vec<PciAddress> = self
                    .templates
                    .values()
                    .flat_map(|d| d.template.baseboard.iter().copied())
                    .collect();
                tokio::spawn(async move {
                    match vms.holders(devices).await {
                        Ok(h) if h.is_empty() => {
                            send(tx, Event::Released { at_ms: now_ms() }).await
                        }
                        Ok(h) => tracing::info!("baseboard still held by {}", h.join(", ")),
                        Err(e) => tracing::warn!("checking the baseboard's release: {e}"),
                    }
                });
            }
            Action::Probe { template } => {
                let Some(d) = self.templates.get(template) else {
                    return;
                };
                let (readiness, domain) = (d.template.readiness.clone(), d.domain.clone());
                let template = template.clone();
                let not_ready = self.not_ready.clone();
                tokio::spawn(async move {
                    let result = probe(&vms, &domain, &readiness).await;
                    let changed = {
                        let mut last = not_ready.lock().unwrap_or_else(|p| p.into_inner());
                        match &result {
                            Ok(_) => {
                                last.remove(&template);
                                true
                            }
                            Err(why) => {
                                last.insert(template.clone(), why.clone()).as_ref() != Some(why)
                            }
                        }
                    };
                    match result {
                        Ok(passed) => {
                            tracing::info!(template = %template, "{template} is ready: {passed}");
                            send(
                                tx,
                                Event::Ready {
                                    template,
                                    at_ms: now_ms(),
                                },
                            )
                            .await;
                        }
                        // Probed again at the next poll.
                        Err(why) if changed => {
                            tracing::info!(template = %template, "{template} is not ready yet: {why}")
                        }
                        Err(_) => {}
                    }
                });
            }
            Action::Record(_) | Action::Signal(_) | Action::Refuse { .. } => {}
        }
    }
}

/// Probes the template's VM once: what passed, or why it did not.
/// libvirt's STARTED (the default) has already happened when asked.
async fn probe(vms: &Libvirt, domain: &str, readiness: &Readiness) -> Result<String, String> {
    match readiness {
        Readiness::Started => Ok("libvirt reported it started".into()),
        Readiness::Http(url) => match http_ok(url).await {
            true => Ok(format!("GET {url} answered 2xx")),
            false => Err(format!("GET {url} did not answer 2xx")),
        },
        Readiness::Tcp {
            host: Some(host),
            port,
        } => {
            let addr = format!("{host}:{port}");
            match tcp_connects(&addr).await {
                true => Ok(format!("TCP {addr} accepted a connection")),
                false => Err(format!("TCP {addr} refused or did not answer")),
            }
        }
        Readiness::Tcp { host: None, port } => {
            let addresses = vms
                .guest_addresses(domain)
                .await
                .map_err(|e| format!("asking libvirt for the guest's addresses: {e}"))?;
            if addresses.is_empty() {
                return Err("libvirt knows no address of the guest yet \
                            (no DHCP lease, guest agent or ARP entry)"
                    .into());
            }
            let mut tried = Vec::new();
            for ip in addresses {
                let addr = std::net::SocketAddr::new(ip, *port).to_string();
                if tcp_connects(&addr).await {
                    return Ok(format!("TCP {addr} accepted a connection"));
                }
                tried.push(addr);
            }
            Err(format!(
                "TCP {} refused or did not answer",
                tried.join(", ")
            ))
        }
        Readiness::Agent => match vms.agent_answers(domain).await {
            Ok(Ok(())) => Ok("the guest agent answered".into()),
            Ok(Err(why)) => Err(format!("the guest agent does not answer: {why}")),
            Err(e) => Err(format!("asking for the guest agent: {e}")),
        },
    }
}

/// A TCP connection to `addr` opens within 2 s.
async fn tcp_connects(addr: &str) -> bool {
    let connect = tokio::net::TcpStream::connect(addr);
    matches!(
        tokio::time::timeout(std::time::Duration::from_secs(2), connect).await,
        Ok(Ok(_))
    )
}

/// A plain `GET` of an http:// URL answers 2xx within 5 s.
async fn http_ok(url: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let addr = if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:80")
    };
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(&addr).await.ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.ok()?;
        Some(head.starts_with(b"HTTP/1.") && head[9] == b'2')
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// The filesystem type a path lives on, from /proc/self/mountinfo (the
/// longest mount point that contains it); fuse subtypes as `fuse.sshfs`.
pub fn fs_type_of(path: &std::path::Path) -> Option<String> {
    let path = std::fs::canonicalize(path)
        .or_else(|_| {
            path.parent().map_or(
                Err(std::io::ErrorKind::NotFound.into()),
                std::fs::canonicalize,
            )
        })
        .ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut best: Option<(usize, String)> = None;
    for line in info.lines() {
        let (left, right) = line.split_once(" - ")?;
        let mount = left.split(' ').nth(4)?.replace("\\040", " ");
        let fs = right.split(' ').next()?.to_string();
        let inside = path.starts_with(&mount);
        if inside && best.as_ref().is_none_or(|(len, _)| mount.len() >= *len) {
            best = Some((mount.len(), fs));
        }
    }
    best.map(|(_, fs)| fs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_rows_are_read_with_or_without_units() {
        let s = GpuSample::parse("0, 37, 10240, 250.12").unwrap();
        assert_eq!(
            s,
            GpuSample {
                index: 0,
                util_pct: Some(37.0),
                memory_mib: Some(10240.0),
                power_w: Some(250.12)
            }
        );
        let s = GpuSample::parse("3, 100 %, 81559 MiB, [N/A]").unwrap();
        assert_eq!(
            (s.index, s.util_pct, s.memory_mib, s.power_w),
            (3, Some(100.0), Some(81559.0), None)
        );
        let s = GpuSample::parse("1, [Not Supported], 0, 70").unwrap();
        assert_eq!(s.util_pct, None);
        // A header, a short row, a negative or non-number figure: not a row.
        for bad in [
            "index, utilization.gpu [%], memory.used [MiB], power.draw [W]",
            "0, 37, 10240",
            "0, -1, 1, 1",
            "0, x, 1, 1",
            "0, NaN, 1, 1",
            "",
        ] {
            assert_eq!(GpuSample::parse(bad), None, "{bad:?}");
        }
    }

    fn row(index: u32, util: f64, mib: f64, watts: Option<f64>) -> GpuSample {
        GpuSample {
            index,
            util_pct: Some(util),
            memory_mib: Some(mib),
            power_w: watts,
        }
    }

    #[test]
    fn guest_gpu_figures_give_use_memory_peak_and_energy() {
        let mut m = Meter::new("a");
        assert_eq!(m.measures().gpu_avg_pct, None, "none written: not reported");
        assert_eq!(m.measures().energy_j, None);
        // Two GPUs every 5 s; GPU 1 reports no power.
        m.record_gpu(0, &row(0, 20.0, 1000.0, Some(100.0)));
        m.record_gpu(0, &row(1, 40.0, 3000.0, None));
        m.record_gpu(5_000, &row(0, 60.0, 2000.0, Some(300.0)));
        m.record_gpu(5_000, &row(1, 80.0, 3000.0, None));
        m.record_gpu(10_000, &row(0, 0.0, 500.0, Some(50.0)));
        let got = m.measures();
        assert_eq!(got.gpu_avg_pct, Some(40.0));
        assert_eq!(got.gpu_peak_pct, Some(80.0));
        // Peak of the sum of the GPUs' latest readings: 2000 + 3000 MiB.
        assert_eq!(got.gpu_memory_peak_bytes, Some(5000 * 1024 * 1024));
        // 100 W for 5 s, then 300 W for 5 s.
        assert_eq!(got.energy_j, Some(2000.0));
        // A long silence is not counted.
        m.record_gpu(
            10_000 + MAX_ENERGY_GAP_MS + 1,
            &row(0, 0.0, 500.0, Some(50.0)),
        );
        assert_eq!(m.measures().energy_j, Some(2000.0));
    }
}
