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

/// What is measured over the running slice (CPU from libvirt's domain
/// info; the passed-through GPU is invisible to the host, and no guest
/// channel reports it yet: "not reported").
#[derive(Clone, Debug, Default)]
pub struct Meter {
    pub template: String,
    /// (wall ns, cpu ns) of the last reading.
    last: Option<(u64, u64)>,
    pub cpu: Vec<f64>,
}

impl Meter {
    pub fn new(template: &str) -> Meter {
        Meter {
            template: template.to_string(),
            ..Default::default()
        }
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

    pub fn measures(&self) -> crate::store::SliceMeasures {
        let n = self.cpu.len();
        crate::store::SliceMeasures {
            cpu_avg_pct: (n > 0).then(|| self.cpu.iter().sum::<f64>() / n as f64),
            cpu_peak_pct: self.cpu.iter().copied().reduce(f64::max),
            ..Default::default()
        }
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
                let readiness = self
                    .templates
                    .get(template)
                    .map(|d| d.template.readiness.clone());
                let template = template.clone();
                tokio::spawn(async move {
                    if probe(readiness.as_ref()).await {
                        send(
                            tx,
                            Event::Ready {
                                template,
                                at_ms: now_ms(),
                            },
                        )
                        .await;
                    }
                });
            }
            Action::Record(_) | Action::Signal(_) | Action::Refuse { .. } => {}
        }
    }
}

/// Whether the template's readiness probe passes now. libvirt's STARTED
/// (the default) has already happened when a probe is asked for.
async fn probe(readiness: Option<&Readiness>) -> bool {
    match readiness {
        None | Some(Readiness::Started) => true,
        Some(Readiness::Http(url)) => http_ok(url).await,
        // TCP to the guest and the guest agent need the guest's address or
        // agent channel, which is not wired yet: STARTED stands in (logged).
        Some(Readiness::Tcp(_)) | Some(Readiness::Agent) => {
            tracing::warn!("this readiness probe is not supported yet; libvirt's STARTED is used");
            true
        }
    }
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
