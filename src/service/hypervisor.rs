//! The hypervisor's side of time-slicing: every libvirt call the loop needs
//! runs in a task of its own here, and its result comes back to the loop as
//! a [`Command`]. The loop never awaits libvirt, so a hung libvirtd stalls
//! no D-Bus caller and no watchdog ping (tests/hang.rs proves it).

use crate::command::Command;
use crate::domain_xml::PciAddress;
use crate::error::Result;
use crate::runtime::vm_host::VmHost;
use crate::slicing::handoff::{Event, HandoffAction};

use crate::slicing::template::{Defined, Template};
use crate::time::EpochMs;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// The hypervisor, driven from tasks that report back to the loop.
pub struct Hypervisor {
    vms: Arc<dyn VmHost>,
    tx: mpsc::Sender<Command>,
    /// Whether lifecycle events are being forwarded (started once there is
    /// a template to watch: libvirt stays unloaded on hosts without).
    watching: bool,
    /// The last reason each starting template was not ready, so the journal
    /// gets a line when it changes, not one a second.
    not_ready: Arc<Mutex<BTreeMap<String, String>>>,
    /// Who held the baseboard when that was last said, and when: the
    /// journal gets a line when the holders change or a minute passed,
    /// not one a check (a second).
    held_said: Arc<Mutex<Option<(String, std::time::Instant)>>>,
    /// The site's command between slices, run before a release counts.
    between: Option<Arc<super::between_slices::BetweenSlices>>,
}

/// How often the same holders of the baseboard are said again.
const HELD_SAID_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether holders `now` are to be said, given what was said last: when
/// they differ, or [`HELD_SAID_EVERY`] passed. Records it when so.
fn say_held(last: &Mutex<Option<(String, std::time::Instant)>>, now: &str) -> bool {
    let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
    let due = match &*last {
        Some((said, at)) => said != now || at.elapsed() >= HELD_SAID_EVERY,
        None => true,
    };
    if due {
        *last = Some((now.to_string(), std::time::Instant::now()));
    }
    due
}

impl Hypervisor {
    pub fn new(vms: Arc<dyn VmHost>, tx: mpsc::Sender<Command>) -> Hypervisor {
        Hypervisor {
            vms,
            tx,
            watching: false,
            not_ready: Default::default(),
            held_said: Default::default(),
            between: None,
        }
    }

    /// With the site's command between slices (`[slicing] between_slices`).
    pub fn with_between_slices(
        mut self,
        between: Option<super::between_slices::BetweenSlices>,
    ) -> Hypervisor {
        self.between = between.map(Arc::new);
        self
    }

    /// A template's VM stopped: the command between slices is due.
    pub fn vm_stopped(&self) {
        if let Some(b) = &self.between {
            b.vm_stopped();
        }
    }

    /// Forwards libvirt's lifecycle events to the loop (once), each with
    /// whether its domain runs now, asked here: in event order, off the loop.
    pub fn watch_events(&mut self) {
        if self.watching {
            return;
        }
        self.watching = true;
        let mut events = self.vms.lifecycle_events();
        let (vms, tx) = (self.vms.clone(), self.tx.clone());
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                let ev = match events.recv().await {
                    Ok(ev) => ev,
                    Err(RecvError::Lagged(_)) => continue,
                    Err(RecvError::Closed) => return,
                };
                if ev.domain.is_empty() {
                    continue; // the connection closed; calls reconnect
                }
                // libvirt failing while we look (libvirtd going away):
                // the event's own word, and a domain that did not say it
                // stopped counts as on (the interlock's safe side).
                let on = match vms.is_on(&ev.domain).await {
                    Ok(on) => on,
                    Err(_) => !ev.stopped(),
                };
                let cmd = Command::Lifecycle {
                    event: ev.kind(),
                    domain: ev.domain,
                    on,
                    at: EpochMs::now(),
                };
                if tx.send(cmd).await.is_err() {
                    return;
                }
            }
        });
    }

    /// Looks up (or defines, from XML) a new template's VM and checks it;
    /// the loop checks it against the other templates again when it is back.
    pub fn prepare(&self, spec: String, t: Template, reply: oneshot::Sender<Result<String>>) {
        let (vms, tx) = (self.vms.clone(), self.tx.clone());
        tokio::spawn(async move {
            let result = async {
                let check = t.clone();
                tokio::task::spawn_blocking(move || check.check_files())
                    .await
                    .map_err(|e| crate::error::Error::Backend(e.to_string()))??;
                let domain = match &t.vm {
                    crate::request::VmSource::Domain(name) => {
                        let xml = vms.definition(name).await?;
                        t.check_domain(&xml)?;
                        if t.stateless {
                            crate::domain_xml::check_transient(&xml)?;
                        }
                        name.clone()
                    }
                    crate::request::VmSource::DomainXml(given) => {
                        t.check_domain(given)?;
                        // Stateless: defined with transient disks, so that
                        // every start boots from them as defined.
                        let xml = &match t.stateless {
                            true => crate::domain_xml::with_transient_disks(given)?,
                            false => given.clone(),
                        };
                        // Created again from the same file: the domain it
                        // defined then is kept (RemoveTemplate keeps it).
                        let name = crate::domain_xml::name_of(xml);
                        let kept = match &name {
                            Some(n) => vms.definition(n).await.ok(),
                            None => None,
                        };
                        match (name, kept) {
                            (Some(n), Some(existing))
                                if crate::domain_xml::same_vm(&existing, xml) =>
                            {
                                // Kept from a template that was not
                                // stateless: its disks keep what is written.
                                if t.stateless {
                                    crate::domain_xml::check_transient(&existing)?;
                                }
                                n
                            }
                            (Some(n), Some(_)) => {
                                return Err(crate::error::Error::field(
                                    "vm.domain_xml",
                                    format!(
                                        "a domain named {n} exists already and is not the VM this \
                                         XML describes (other devices or disks): name this VM \
                                         otherwise, or take that one as it is with \
                                         {{\"domain\": \"{n}\"}}"
                                    ),
                                ))
                            }
                            _ => vms.define(xml.clone()).await?,
                        }
                    }
                };
                Ok(Box::new(Defined {
                    template: t,
                    domain,
                }))
            }
            .await;
            let _ = tx
                .send(Command::TemplatePrepared {
                    spec,
                    result,
                    reply,
                })
                .await;
        });
    }

    /// Which of these templates' VMs run now (after a start, or a pause).
    /// libvirt failing to say is not "off": a VM taken for off could be
    /// started beside another. Asked again every 5 s until it answers for
    /// every one (a domain that is not defined is off).
    pub fn running(&self, domains: Vec<(String, String)>) {
        let (vms, tx) = (self.vms.clone(), self.tx.clone());
        tokio::spawn(async move {
            let mut said = false;
            let on = loop {
                match which_run(&vms, &domains).await {
                    Ok(on) => break on,
                    Err(e) => {
                        if !said {
                            tracing::warn!(
                                "time-slicing: libvirt cannot say whether the template VMs run \
                                 ({e}); nothing is started or stopped until it can, asked again \
                                 every 5 s"
                            );
                            said = true;
                        }
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                }
            };
            // A test holds the answer here, as a slow loop would.
            crate::failpoint::hit_async("hypervisor.running-answered").await;
            let _ = tx.send(Command::Running { on }).await;
        });
    }

    /// Reads a slice VM's CPU time for its meter.
    pub fn cpu_time(&self, template: String, domain: String) {
        let (vms, tx) = (self.vms.clone(), self.tx.clone());
        tokio::spawn(async move {
            let cpu = vms.cpu_time(&domain).await.ok();
            let at = EpochMs::now();
            let _ = tx.send(Command::SliceCpu { template, at, cpu }).await;
        });
    }

    /// Starts reading the guest's GPU figures; abort the handle when the slice ends.
    pub fn read_guest_gpus(&self, domain: String, template: String) -> tokio::task::AbortHandle {
        tokio::spawn(guest_gpus_to_loop(
            self.vms.clone(),
            domain,
            template,
            self.tx.clone(),
        ))
        .abort_handle()
    }

    /// Carries out one action that needs the hypervisor, in a task of its
    /// own; failures come back to the loop as events.
    pub fn execute(&self, action: &HandoffAction, templates: &BTreeMap<String, Defined>) {
        let domain = |template: &str| templates.get(template).map(|d| d.domain.clone());
        let vms = self.vms.clone();
        let tx = self.tx.clone();
        let send = |tx: mpsc::Sender<Command>, e: Event| async move {
            let _ = tx.send(Command::Slice(e)).await;
        };
        match action {
            HandoffAction::Shutdown { template } | HandoffAction::Destroy { template } => {
                let hard = matches!(action, HandoffAction::Destroy { .. });
                let Some(domain) = domain(template) else {
                    return;
                };
                let template = template.clone();
                tokio::spawn(async move {
                    let Err(e) = vms.power_off(&domain, hard).await else {
                        return;
                    };
                    // A domain that is gone (undefined behind the daemon's
                    // back) or already off sends no STOPPED event: without
                    // this, the handoff would wait for one forever.
                    if let Ok(false) = vms.is_on(&domain).await {
                        tracing::warn!(template = %template, "powering off {domain}: {e}; it is not running, so it counts as stopped");
                        let at_ms = EpochMs::now();
                        send(tx, Event::Stopped { template, at_ms }).await;
                    } else {
                        tracing::warn!(template = %template, "powering off {domain}: {e}");
                    }
                });
            }
            HandoffAction::Create { template } => {
                let Some(domain) = domain(template) else {
                    // Removed meanwhile: the handoff must not wait for it.
                    let e = Event::Gone {
                        template: template.clone(),
                        error: format!("template {template} no longer exists"),
                        at_ms: EpochMs::now(),
                    };
                    tokio::spawn(send(tx, e));
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
                        // libvirt's text may quote the domain's XML: one
                        // printable line for the journal, signals and ledger.
                        let error = crate::text::printable(e.message());
                        let at_ms = EpochMs::now();
                        let event = if e.kind() == "NotFound" {
                            Event::Gone {
                                template,
                                error: format!("its domain {domain} is not defined in libvirt"),
                                at_ms,
                            }
                        } else {
                            Event::StartFailed {
                                template,
                                error,
                                at_ms,
                            }
                        };
                        send(tx, event).await;
                    }
                });
            }
            HandoffAction::CheckRelease => {
                let devices: Vec<PciAddress> = templates
                    .values()
                    .flat_map(|d| d.template.baseboard.iter().copied())
                    .collect();
                let held_said = self.held_said.clone();
                let between = self.between.clone();
                tokio::spawn(async move {
                    match vms.holders(devices).await {
                        Ok(h) if h.is_empty() => {
                            *held_said.lock().unwrap_or_else(|p| p.into_inner()) = None;
                            // Nothing holds it: the site's command runs
                            // first, and only its success releases it.
                            if let Some(b) = between {
                                if !b.released().await {
                                    return;
                                }
                            }
                            send(
                                tx,
                                Event::Released {
                                    at_ms: EpochMs::now(),
                                },
                            )
                            .await
                        }
                        Ok(h) => {
                            // Foreign domains' names: printable.
                            let who = crate::text::printable(&h.join(", "));
                            if say_held(&held_said, &who) {
                                tracing::info!("baseboard still held by {who}");
                            }
                        }
                        Err(e) => tracing::warn!("checking the baseboard's release: {e}"),
                    }
                });
            }
            HandoffAction::Probe { template } => {
                let Some(d) = templates.get(template) else {
                    return;
                };
                let (readiness, domain) = (d.template.readiness.clone(), d.domain.clone());
                let template = template.clone();
                let not_ready = self.not_ready.clone();
                tokio::spawn(async move {
                    let result =
                        crate::runtime::vm_probes::probe(vms.as_ref(), &domain, &readiness).await;
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
                                    at_ms: EpochMs::now(),
                                },
                            )
                            .await;
                        }
                        // Probed again at the next poll.
                        // `why` may quote the guest (its agent's error).
                        Err(why) if changed => {
                            let why = crate::text::printable(&why);
                            tracing::info!(template = %template, "{template} is not ready yet: {why}")
                        }
                        Err(_) => {}
                    }
                });
            }
            // The loop's own: the ledger, the bus, its timer.
            HandoffAction::SetTimer { .. }
            | HandoffAction::Record(_)
            | HandoffAction::Signal(_)
            | HandoffAction::CloseSlice { .. }
            | HandoffAction::Refuse { .. } => {}
        }
    }
}

/// The guest's GPU samples, to the loop as commands.
async fn guest_gpus_to_loop(
    vms: Arc<dyn VmHost>,
    domain: String,
    template: String,
    tx: mpsc::Sender<Command>,
) {
    let (samples, mut rx) = mpsc::channel(16);
    let reader =
        crate::runtime::guest_channel::read_guest_gpus(vms, domain, template.clone(), samples);
    let forward = async {
        while let Some((sample, at)) = rx.recv().await {
            let cmd = Command::GuestGpu {
                template: template.clone(),
                sample,
                at,
            };
            if tx.send(cmd).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(reader, forward);
}

/// The templates whose VMs run, or why libvirt could not say.
async fn which_run(vms: &Arc<dyn VmHost>, domains: &[(String, String)]) -> Result<Vec<String>> {
    let mut on = Vec::new();
    for (template, domain) in domains {
        if vms.is_on(domain).await? {
            on.push(template.clone());
        }
    }
    Ok(on)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interlock's wait is said when its holders change, not at every
    /// check (#63: a line a second).
    #[test]
    fn the_same_holders_are_said_once_a_minute() {
        let last = Mutex::new(None);
        assert!(say_held(&last, "tmpl-a"));
        assert!(!say_held(&last, "tmpl-a"), "the same, a moment later");
        assert!(say_held(&last, "tmpl-a, foreign"), "changed");
        *last.lock().unwrap() =
            Some(("tmpl-a".into(), std::time::Instant::now() - HELD_SAID_EVERY));
        assert!(say_held(&last, "tmpl-a"), "a minute on");
    }
    use crate::error::Error;
    use crate::runtime::libvirt::Lifecycle;
    use crate::runtime::BoxFuture;
    use tokio::sync::broadcast;

    /// A hypervisor whose domain has vanished: every call about it fails,
    /// and nothing of it runs.
    struct Vanished;

    impl VmHost for Vanished {
        fn is_on<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<bool>> {
            Box::pin(async { Ok(false) })
        }
        fn definition<'a>(&'a self, d: &'a str) -> BoxFuture<'a, Result<String>> {
            Box::pin(async move { Err(Error::NotFound(format!("no domain {d}"))) })
        }
        fn define(&self, _: String) -> BoxFuture<'_, Result<String>> {
            Box::pin(async { Err(Error::Backend("no".into())) })
        }
        fn power_on<'a>(&'a self, d: &'a str) -> BoxFuture<'a, Result<()>> {
            Box::pin(async move { Err(Error::NotFound(format!("no domain {d}"))) })
        }
        fn power_off<'a>(&'a self, d: &'a str, _: bool) -> BoxFuture<'a, Result<()>> {
            Box::pin(async move { Err(Error::NotFound(format!("no domain {d}"))) })
        }
        fn cpu_time<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(u64, u32)>> {
            Box::pin(async { Err(Error::Backend("no".into())) })
        }
        fn holders(&self, _: Vec<PciAddress>) -> BoxFuture<'_, Result<Vec<String>>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn guest_addresses<'a>(
            &'a self,
            _: &'a str,
        ) -> BoxFuture<'a, Result<Vec<std::net::IpAddr>>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn agent_answers<'a>(
            &'a self,
            _: &'a str,
        ) -> BoxFuture<'a, Result<std::result::Result<(), String>>> {
            Box::pin(async { Ok(Err("no agent".into())) })
        }
        fn channel_path<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
        ) -> BoxFuture<'a, Result<Option<String>>> {
            Box::pin(async { Ok(None) })
        }
        fn lifecycle_events(&self) -> broadcast::Receiver<Lifecycle> {
            broadcast::channel(1).1
        }
    }

    /// A hypervisor that fails to say whether a VM runs the first time it
    /// is asked, then says it runs.
    struct FailsOnce(std::sync::atomic::AtomicBool, Vanished);

    impl VmHost for FailsOnce {
        fn is_on<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<bool>> {
            let failed = self.0.swap(true, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                match failed {
                    false => Err(Error::Backend("libvirtd is restarting".into())),
                    true => Ok(true),
                }
            })
        }
        fn definition<'a>(&'a self, d: &'a str) -> BoxFuture<'a, Result<String>> {
            self.1.definition(d)
        }
        fn define(&self, x: String) -> BoxFuture<'_, Result<String>> {
            self.1.define(x)
        }
        fn power_on<'a>(&'a self, d: &'a str) -> BoxFuture<'a, Result<()>> {
            self.1.power_on(d)
        }
        fn power_off<'a>(&'a self, d: &'a str, hard: bool) -> BoxFuture<'a, Result<()>> {
            self.1.power_off(d, hard)
        }
        fn cpu_time<'a>(&'a self, d: &'a str) -> BoxFuture<'a, Result<(u64, u32)>> {
            self.1.cpu_time(d)
        }
        fn holders(&self, p: Vec<PciAddress>) -> BoxFuture<'_, Result<Vec<String>>> {
            self.1.holders(p)
        }
        fn guest_addresses<'a>(
            &'a self,
            d: &'a str,
        ) -> BoxFuture<'a, Result<Vec<std::net::IpAddr>>> {
            self.1.guest_addresses(d)
        }
        fn agent_answers<'a>(
            &'a self,
            d: &'a str,
        ) -> BoxFuture<'a, Result<std::result::Result<(), String>>> {
            self.1.agent_answers(d)
        }
        fn channel_path<'a>(
            &'a self,
            d: &'a str,
            c: &'a str,
        ) -> BoxFuture<'a, Result<Option<String>>> {
            self.1.channel_path(d, c)
        }
        fn lifecycle_events(&self) -> broadcast::Receiver<Lifecycle> {
            self.1.lifecycle_events()
        }
    }

    /// libvirt failing to say whether a template's VM runs is not "off"
    /// (convergence would then start another beside it): asked again, the
    /// answer is the VM that runs.
    #[tokio::test]
    async fn which_vms_run_is_asked_again_when_libvirt_cannot_say() {
        let (tx, mut rx) = mpsc::channel(4);
        let hv = Hypervisor::new(Arc::new(FailsOnce(Default::default(), Vanished)), tx);
        hv.running(vec![("a".into(), "vm-a".into())]);
        match rx.recv().await {
            Some(Command::Running { on }) => assert_eq!(on, ["a"]),
            _ => panic!("no answer"),
        }
    }

    /// Powering off a template whose domain vanished reports it stopped, so
    /// the handoff goes on (it would otherwise wait for a STOPPED that never
    /// comes, asking for a destroy every few seconds).
    #[tokio::test]
    async fn a_vanished_domain_counts_as_stopped() {
        let (tx, mut rx) = mpsc::channel(4);
        let hv = Hypervisor::new(Arc::new(Vanished), tx);
        let spec = serde_json::json!({
            "name": "a",
            "workload": {"model": "m", "runtime": "r"},
            "user": {"kind": "internal", "name": "u"},
            "vm": {"domain": "vm-a"},
            "baseboard": [],
        })
        .to_string();
        let templates: BTreeMap<String, Defined> =
            [("a".to_string(), Defined::restore(&spec).unwrap())].into();
        for action in [
            HandoffAction::Shutdown {
                template: "a".into(),
            },
            HandoffAction::Destroy {
                template: "a".into(),
            },
        ] {
            hv.execute(&action, &templates);
            let got = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv())
                .await
                .expect("an event")
                .expect("the channel");
            match got {
                Command::Slice(Event::Stopped { template, .. }) => assert_eq!(template, "a"),
                _ => panic!("expected Stopped for a"),
            }
        }
    }
}
