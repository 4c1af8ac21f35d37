//! Completion of what only the daemon knows — worker, template and GPU
//! names — for bash, zsh and fish (`COMPLETE=bash astraeusctl` prints the
//! registration; the packages install it). The shell calls astraeusctl
//! back with the words typed so far; each name list is one call to the
//! daemon on the bus those words name (`--session`, `--bus-address`), given
//! a second at most: a daemon that does not answer completes nothing.

use astraeusd::bus::{BASE_PATH, BUS_NAME};
use astraeusd::cli::CtlArgs;
use astraeusd::wire::{GpuRow, WorkerRow};
use clap::CommandFactory;
use clap_complete::engine::{ArgValueCompleter, CompletionCandidate};
use std::ffi::OsStr;

/// Answers a completion request and exits, when the shell made one.
pub fn answer_if_asked() {
    clap_complete::CompleteEnv::with_factory(command).complete();
}

/// astraeusctl's command line with the daemon's names attached.
pub fn command() -> clap::Command {
    let workers = || ArgValueCompleter::new(workers);
    let templates = || ArgValueCompleter::new(templates);
    let mut cmd = CtlArgs::command();
    for (sub, arg) in [("status", "name"), ("show", "name"), ("stop", "names")] {
        cmd = cmd.mut_subcommand(sub, |s| attach(s, arg, workers()));
    }
    cmd = cmd.mut_subcommand("sharers", |s| {
        attach(s, "gpu", ArgValueCompleter::new(gpus))
    });
    cmd = cmd.mut_subcommand("template", |t| {
        ["remove", "stage", "resume", "poweroff"]
            .into_iter()
            .fold(t, |t, sub| {
                t.mut_subcommand(sub, |s| attach(s, "name", templates()))
            })
    });
    cmd.mut_subcommand("schedule", |t| {
        ["set", "show"].into_iter().fold(t, |t, sub| {
            t.mut_subcommand(sub, |s| attach(s, "template", templates()))
        })
    })
}

/// `cmd` with `completer` on its argument `arg`. clap's mut_arg moves the
/// argument last, which would reorder positionals: those after it are
/// moved after it again, in their order.
fn attach(cmd: clap::Command, arg: &str, completer: ArgValueCompleter) -> clap::Command {
    let later: Vec<String> = cmd
        .get_positionals()
        .skip_while(|a| a.get_id() != arg)
        .skip(1)
        .map(|a| a.get_id().to_string())
        .collect();
    let mut cmd = cmd.mut_arg(arg, |a| a.add(completer));
    for id in later {
        cmd = cmd.mut_arg(id, |a| a);
    }
    cmd
}

fn workers(current: &OsStr) -> Vec<CompletionCandidate> {
    let rows: Vec<WorkerRow> = ask("ListWorkers").unwrap_or_default();
    matching(current, rows.into_iter().map(|r| (r.name, r.state)))
}

fn templates(current: &OsStr) -> Vec<CompletionCandidate> {
    let rows: Vec<(String, String, String, String)> = ask("ListTemplates").unwrap_or_default();
    matching(
        current,
        rows.into_iter().map(|(name, _, _, state)| (name, state)),
    )
}

fn gpus(current: &OsStr) -> Vec<CompletionCandidate> {
    let rows: Vec<GpuRow> = ask("ListGpus").unwrap_or_default();
    matching(
        current,
        rows.into_iter()
            .map(|g| (g.index.to_string(), format!("{} {}", g.model, g.mode))),
    )
}

/// The names that start with what is typed, each with a word of help.
fn matching(
    current: &OsStr,
    names: impl Iterator<Item = (String, String)>,
) -> Vec<CompletionCandidate> {
    let typed = current.to_string_lossy();
    names
        .filter(|(name, _)| name.starts_with(typed.as_ref()))
        .map(|(name, help)| {
            CompletionCandidate::new(astraeusd::text::printable(&name))
                .help(Some(astraeusd::text::printable(&help).into()))
        })
        .collect()
}

/// The bus the words being completed name: `--bus-address A`,
/// `--bus-address=A`, `--session`, else the system bus.
fn bus_named(words: &[String]) -> (Option<String>, bool) {
    let mut address = None;
    let mut session = false;
    for (i, w) in words.iter().enumerate() {
        if w == "--session" {
            session = true;
        } else if w == "--bus-address" {
            address = words.get(i + 1).cloned();
        } else if let Some(a) = w.strip_prefix("--bus-address=") {
            address = Some(a.to_string());
        }
    }
    (address, session)
}

/// One list from the daemon, within a second; None when it cannot say.
fn ask<T>(method: &str) -> Option<T>
where
    T: serde::de::DeserializeOwned + zbus::zvariant::Type,
{
    let words: Vec<String> = std::env::args().collect();
    let (address, session) = bus_named(&words);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    rt.block_on(async {
        let builder = super::bus_builder(address.as_deref(), session);
        let call = async {
            let conn = builder.build().await.ok()?;
            let reply = conn
                .call_method(
                    Some(BUS_NAME),
                    BASE_PATH,
                    Some("org.astraeus.Node1.Manager"),
                    method,
                    &(),
                )
                .await
                .ok()?;
            reply.body().deserialize::<T>().ok()
        };
        tokio::time::timeout(std::time::Duration::from_secs(1), call)
            .await
            .ok()
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bus_is_the_one_the_words_name() {
        let w = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
        assert_eq!(bus_named(&w("astraeusctl stop ")), (None, false));
        assert_eq!(bus_named(&w("astraeusctl --session stop ")), (None, true));
        assert_eq!(
            bus_named(&w("astraeusctl --bus-address unix:path=/b stop ")),
            (Some("unix:path=/b".into()), false)
        );
        assert_eq!(
            bus_named(&w("astraeusctl stop --bus-address=unix:path=/c ")),
            (Some("unix:path=/c".into()), false)
        );
    }

    /// Every argument the completers are attached to exists (a renamed
    /// one would panic here, not in a user's shell), and every
    /// subcommand's positionals keep their order (`template stage NAME
    /// DIR` was DIR NAME with mut_arg alone).
    #[test]
    fn the_completers_attach_to_arguments_that_exist_in_their_order() {
        command().debug_assert();
        fn positionals(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
            let ids: Vec<String> = cmd
                .get_positionals()
                .map(|a| a.get_id().to_string())
                .collect();
            out.push(format!("{path}: {}", ids.join(" ")));
            for s in cmd.get_subcommands() {
                positionals(s, &format!("{path} {}", s.get_name()), out);
            }
        }
        let (mut ours, mut plain) = (Vec::new(), Vec::new());
        positionals(&command(), "astraeusctl", &mut ours);
        positionals(&CtlArgs::command(), "astraeusctl", &mut plain);
        // (Subcommands may be listed in another order: completion only.)
        ours.sort();
        plain.sort();
        assert_eq!(ours, plain);
        assert!(ours.contains(&"astraeusctl template stage: name source".to_string()));
    }
}
