//! The command lines of `astraeusd` and `astraeusctl`, in the library so that
//! man pages and shell completions are generated from the same definitions
//! (`cargo run --example gen-docs -- DIR`).

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "astraeusd",
    version,
    about = "Shares this host's GPUs by memory and by time",
    long_about = "astraeusd places workers on this host's GPUs, whole or shared by memory \
(best fit on the fullest GPU that still offers enough), explains every wait, and keeps its \
ledger in SQLite. It serves org.astraeus.Node1 on the system bus (or --session); drive it with \
busctl, gdbus or astraeusctl(1).\n\n\
Files: /etc/astraeus/node.toml (configuration), /var/lib/astraeus/ledger.db (the ledger; \
$STATE_DIRECTORY under systemd, $XDG_STATE_HOME/astraeus with --session). \
Logs go to the journal (journalctl -u astraeusd; MESSAGE_ID per kind of event) or stderr. \
Signals: SIGHUP re-reads the GPU inventory; SIGTERM stops cleanly."
)]
pub struct DaemonArgs {
    /// Serve on the session bus instead of the system bus.
    #[arg(long, conflicts_with = "bus_address")]
    pub session: bool,
    /// Serve on the bus at this address (e.g. unix:path=/run/x).
    #[arg(long, value_name = "ADDR")]
    pub bus_address: Option<String>,
    /// Simulated GPUs: the built-in machine `majin`, or the TOML file given.
    #[arg(long, value_name = "FILE", num_args = 0..=1)]
    pub sim: Option<Option<PathBuf>>,
    /// Where the ledger lives (default: $STATE_DIRECTORY, or the user's state dir with --session).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Configuration file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Parser)]
#[command(name = "astraeusctl", version, about = "Control astraeusd over D-Bus")]
pub struct CtlArgs {
    /// Talk to a daemon on the session bus.
    #[arg(long, global = true, conflicts_with = "bus_address")]
    pub session: bool,
    /// Talk to a daemon on the bus at this address.
    #[arg(long, global = true, value_name = "ADDR")]
    pub bus_address: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub cmd: CtlCommand,
}

#[derive(Subcommand)]
pub enum CtlCommand {
    /// The machine's GPUs: what each offers and how it is used.
    Gpus,
    /// Workers with their state and GPUs (`1 · shared 2.2 GB`).
    Workers,
    /// One worker whole: state, owner, GPUs, share, use, warnings, holders,
    /// why it waits, and its request (env values only for its owner and root).
    Show {
        /// The worker's name.
        name: String,
    },
    /// Who shares one GPU, and how much each takes.
    Sharers { gpu: u32 },
    /// Submit a worker spec (JSON) from a file, or - for standard input.
    Submit { file: String },
    /// Stop a worker.
    Stop { name: String },
    /// Where a spec would go now, or why it would wait (changes nothing).
    Why { file: String },
    /// A template's scheduled actions (time-slicing rotation).
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// Time-slicing templates: persistent VMs that own the GPU baseboard in turn.
    #[command(subcommand)]
    Template(TemplateCommand),
    /// Who owns the GPU baseboard when, in the daemon's time zone; with
    /// --report, the slices that ran, by template and by user.
    Slices {
        /// Report the slices that ran in the window (default: the last 7 days).
        #[arg(long, conflicts_with = "next")]
        report: bool,
        /// Show the next N slices from now.
        #[arg(long, value_name = "N", conflicts_with_all = ["from", "to"])]
        next: Option<usize>,
        /// Window start: YYYY-MM-DD, YYYY-MM-DDTHH:MM (daemon's zone) or epoch seconds.
        #[arg(long, requires = "to")]
        from: Option<String>,
        /// Window end, as --from.
        #[arg(long, requires = "from")]
        to: Option<String>,
    },
    /// GPU-hours and energy by worker, owner, GPU or user; a shared GPU counts
    /// for each sharer by its share of the GPU's memory.
    Usage {
        /// Window start: YYYY-MM-DD, YYYY-MM-DDTHH:MM (daemon's zone) or epoch seconds [default: 24 hours ago].
        #[arg(long)]
        since: Option<String>,
        /// Window end, as --since [default: now].
        #[arg(long)]
        until: Option<String>,
        /// Group rows by worker, owner, gpu or user.
        #[arg(long, default_value = "owner", value_parser = ["worker", "owner", "gpu", "user"])]
        by: String,
        /// Print CSV instead of a table.
        #[arg(long, conflicts_with = "json")]
        csv: bool,
    },
}

#[derive(Subcommand)]
pub enum TemplateCommand {
    /// Define a template (JSON) from a file, or - for standard input. Root only.
    Create { file: String },
    /// Every template with its user, VM and state.
    List,
    /// Remove a template whose VM is off (the libvirt domain is kept). Root only.
    Remove { name: String },
    /// Build the template's read-only weights disk from a directory, once
    /// (the same content again changes nothing); waits until it is done,
    /// with a progress bar at a terminal (a line per step otherwise), and
    /// fails if the daemon goes away first. Root only.
    Stage {
        /// The template whose weights these are.
        name: String,
        /// The directory holding the weights, read by the daemon.
        source: String,
    },
    /// Boot a template's VM now; --handoff takes the baseboard over from its holder.
    Resume {
        name: String,
        #[arg(long)]
        handoff: bool,
    },
    /// Power a template's VM off (ACPI, forced after the timeout; --hard: at once).
    Poweroff {
        name: String,
        #[arg(long)]
        hard: bool,
    },
}

#[derive(Subcommand)]
pub enum ScheduleCommand {
    /// Set a template's schedule: in words (`--weekly mon,wed,fri --from
    /// 09:00 --to 17:00`, in the daemon's time zone), or as SCHED_ACTION JSON
    /// from FILE (- for standard input; `[]` removes the schedule).
    Set {
        /// The template whose slices these are.
        template: String,
        /// SCHED_ACTION JSON instead of the words below.
        #[arg(conflicts_with_all = ["weekly", "monthly", "hourly"])]
        file: Option<String>,
        /// Slices on these weekdays: mon,wed,fri or mon-fri.
        #[arg(long, value_name = "DAYS", group = "every")]
        weekly: Option<String>,
        /// Slices on these days of the month: 1,15.
        #[arg(long, value_name = "DAYS", group = "every")]
        monthly: Option<String>,
        /// A slice every N hours (1 to 168) from the first.
        #[arg(long, value_name = "N", group = "every")]
        hourly: Option<u16>,
        /// Each slice starts at this local time (HH:MM).
        #[arg(long, value_name = "HH:MM", requires = "every")]
        from: Option<String>,
        /// Each slice ends at this local time (HH:MM); not after --from: the next day.
        #[arg(long, value_name = "HH:MM", requires = "every")]
        to: Option<String>,
        /// The first day a slice may start (YYYY-MM-DD) [default: today].
        #[arg(long, value_name = "DATE", requires = "every")]
        starting: Option<String>,
        /// The last day a slice starts (YYYY-MM-DD) [default: no end].
        #[arg(
            long,
            value_name = "DATE",
            requires = "every",
            conflicts_with = "times"
        )]
        until: Option<String>,
        /// This many slices in all (each action fires N times).
        #[arg(long, value_name = "N", requires = "every")]
        times: Option<u32>,
        /// Print the next ten slices (or the refusal) without saving.
        #[arg(long)]
        dry_run: bool,
    },
    /// Show a template's schedule in words (--json: as SCHED_ACTION JSON).
    Show {
        /// The template whose schedule to show.
        template: String,
    },
}

/// Exit codes by what went wrong (astraeusctl(1), EXIT STATUS); 2 is clap's
/// usage error.
pub fn exit_code(kind: &str) -> u8 {
    match kind {
        "InvalidRequest" => 3,
        "NotFound" => 4,
        "AccessDenied" => 5,
        "Exists" | "Conflict" | "Busy" | "QuotaExceeded" => 6,
        "Unsatisfiable" => 7,
        "Usage" => 2,
        // sysexits' EX_UNAVAILABLE: no daemon (or no bus) to talk to.
        "ServiceUnknown" | "NameHasNoOwner" | "NoReply" | "Unreachable" => 69,
        _ => 1,
    }
}

/// The error's kind ("NotFound") and message, from "Kind: message" (what
/// every failure here reads like) or a bus error's full name.
pub fn kind_of(e: &str) -> (&str, &str) {
    let (head, rest) = e.split_once(": ").unwrap_or(("", e));
    let kind = head.rsplit('.').next().unwrap_or(head);
    if head.starts_with("--") {
        // A flag of ours that did not parse: a usage error, as clap's are.
        ("Usage", e)
    } else if !kind.is_empty() && kind.chars().all(|c| c.is_ascii_alphanumeric()) {
        (kind, rest)
    } else if e.contains("No such file or directory") || e.contains("Connection refused") {
        ("Unreachable", e)
    } else {
        ("Failed", e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_their_documented_exit_codes() {
        let code = |e: &str| exit_code(kind_of(e).0);
        assert_eq!(code("NotFound: no live worker named x"), 4);
        assert_eq!(code("InvalidRequest: name: …"), 3);
        assert_eq!(code("AccessDenied: …"), 5);
        assert_eq!(code("QuotaExceeded: …"), 6);
        assert_eq!(code("Unsatisfiable: …"), 7);
        assert_eq!(
            code("org.freedesktop.DBus.Error.ServiceUnknown: no owner"),
            69
        );
        assert_eq!(code("--since: expected YYYY-MM-DD"), 2);
        assert_eq!(code("something odd happened"), 1);
        assert_eq!(
            kind_of("NotFound: no live worker named x").1,
            "no live worker named x"
        );
    }
}
