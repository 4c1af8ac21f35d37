//! Staging a template's weights onto its read-only image, off the loop,
//! and recording what the image holds (its checksum) when it is done.

use super::super::Service;
use crate::access::Caller;
use crate::bus::manager::Manager;
use crate::bus::BASE_PATH;
use crate::command::Command;
use crate::error::{Error, Result};
use crate::slicing::handoff::VmState;
use crate::time::EpochMs;
use std::time::Duration;

impl Service {
    /// Starts staging a template's weights (its VM must be off); progress and
    /// the end come as signals.
    pub(in crate::service) fn stage_weights(
        &mut self,
        template: &str,
        source: &str,
        caller: &Caller,
    ) -> Result<()> {
        let s = self.manual(caller, template)?;
        let Some(image) =
            (s.engine.template(template)).and_then(|d| d.template.weights_disk.clone())
        else {
            return Err(Error::field(
                "weights_disk",
                format!("template {template} has no weights disk to stage"),
            ));
        };
        let state = s.engine.state().state_of(template);
        if state != VmState::Off {
            return Err(Error::Conflict(format!(
                "template {template}'s VM is {state}; weights are staged while it is off"
            )));
        }
        let source = std::path::PathBuf::from(source);
        if !source.is_dir() {
            return Err(Error::field(
                "source",
                format!("{} is not a directory", source.display()),
            ));
        }
        let before = self.node.store().weights(template)?;
        let s = self.slicing.as_mut().expect("manual() checked");
        if !s.engine.begin_staging(template) {
            return Err(Error::Conflict(format!(
                "the weights of {template} are already being staged"
            )));
        }
        let (tx, conn, template) = (self.lp.tx.clone(), self.conn.clone(), template.to_string());
        tokio::task::spawn_blocking(move || {
            let emitter = zbus::object_server::SignalEmitter::new(&conn, BASE_PATH).ok();
            let rt = tokio::runtime::Handle::current();
            let progress = |phase: &str, fraction: f64| {
                if let Some(e) = &emitter {
                    let _ = rt.block_on(Manager::weights_progress(e, &template, phase, fraction));
                }
            };
            let mut last = std::time::Instant::now();
            // The source opened once: both passes read what it was now, even
            // if its owner swaps the path for a link to elsewhere meanwhile.
            // Read with the rights of the source's owner: the image holds
            // what they could read, not what root can (weights.rs, Reader).
            let reader = crate::weights::Reader::of_source(&source);
            let result = reader.and_then(|reader| {
                let pinned = crate::weights::read_as(reader.as_ref(), || {
                    crate::weights::pinned(&source, std::path::Path::new(&image))
                });
                pinned.map(|(dir, source)| (reader, dir, source))
            });
            let result = result.and_then(|(reader, _dir, source)| {
                crate::weights::read_as(reader.as_ref(), || {
                    crate::weights::checksum(&source, |done, total| {
                        if last.elapsed() > Duration::from_millis(200) || done == total {
                            last = std::time::Instant::now();
                            progress("checksum", done as f64 / total.max(1) as f64);
                        }
                    })
                })
                .and_then(|sum| {
                    let image_path = std::path::Path::new(&image);
                    if before.as_deref() == Some(sum.as_str()) && image_path.exists() {
                        return Ok((sum, false)); // the same content: nothing to do
                    }
                    // New content: the image and its checksum come from one
                    // snapshot, which nobody else can change (see weights.rs).
                    progress("snapshot", 0.0);
                    let snapshot = crate::weights::snapshot_path(image_path);
                    let staged = crate::weights::read_as(reader.as_ref(), || {
                        crate::weights::snapshot(&source, &snapshot)
                    });
                    let staged = staged.and_then(|()| {
                        crate::failpoint::hit("weights.snapshot-taken");
                        let sum = crate::weights::checksum(&snapshot, |_, _| {})?;
                        progress("image", 0.0);
                        crate::weights::build_image(&snapshot, image_path)?;
                        Ok(sum)
                    });
                    let _ = std::fs::remove_dir_all(&snapshot);
                    progress("image", 1.0);
                    Ok((staged?, true))
                })
            });
            let _ = tx.blocking_send(Command::WeightsStaged { template, result });
        });
        Ok(())
    }

    pub(in crate::service) async fn weights_staged(
        &mut self,
        template: String,
        result: Result<(String, bool)>,
    ) {
        let Some(s) = self.slicing.as_mut() else {
            return;
        };
        s.engine.staging_done(&template);
        let image = s
            .engine
            .template(&template)
            .and_then(|d| d.template.weights_disk.clone())
            .unwrap_or_default();
        // New content the ledger does not take is not staged: the ledger's
        // checksum is what the image is said to hold.
        let result = result.and_then(|(sum, changed)| {
            if changed {
                self.node
                    .set_weights(&template, &sum, &image, EpochMs::now())
                    .map_err(|e| {
                        // Built in place: the image holds content the ledger
                        // does not know. Gone, it is built again by the next
                        // staging whatever it stages (the old content would
                        // compare equal to the old checksum).
                        let gone = match std::fs::remove_file(&image) {
                            Ok(()) => "the image was removed".to_string(),
                            Err(r) => format!("removing the image failed too ({r})"),
                        };
                        Error::Backend(format!(
                            "the image was built, but the ledger refused its checksum ({}); \
                             {gone}: stage the weights again",
                            e.message()
                        ))
                    })?;
            }
            Ok((sum, changed))
        });
        let (checksum, changed, error) = match result {
            Ok((sum, changed)) => {
                let same = if changed { "" } else { ", unchanged" };
                tracing::info!(template = %template, "weights of {template} staged ({sum}{same})");
                (sum, changed, String::new())
            }
            Err(e) => {
                // It may quote a file's name from a directory another user
                // owns: printable before the journal and the signal.
                let error = crate::text::printable(e.message());
                tracing::warn!(template = %template, "staging the weights of {template} failed: {error}");
                (String::new(), false, error)
            }
        };
        self.signal("WeightsStaged", BASE_PATH.into(), move |e| async move {
            Manager::weights_staged(&e, &template, &checksum, changed, &error).await
        });
    }
}
