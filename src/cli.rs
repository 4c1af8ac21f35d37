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
Files: /etc/astraeus/node.toml (configuration; with --session $XDG_CONFIG_HOME/astraeus/node.toml \
alone), /var/lib/astraeus/ledger.db (the ledger; $STATE_DIRECTORY under systemd, \
$XDG_STATE_HOME/astraeus with --session, on every systemd). \
Logs go to the journal (journalctl -u astraeusd; MESSAGE_ID per kind of event) or stderr. \
Signals: SIGHUP re-reads node.toml (what a restart would refuse is refused, and the running \
configuration stays) and the GPU inventory; SIGTERM stops cleanly."
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
    /// Where the ledger lives (default: $STATE_DIRECTORY, or $XDG_STATE_HOME/astraeus with --session).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Configuration file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Check the configuration a start would read (--config, else the
    /// default file, or the session's with --session) and exit: 0 when it
    /// would start, 1 naming the key and its line when not (as nginx -t).
    #[arg(long)]
    pub check_config: bool,
}

/// The heading astraeusctl's global options are listed under, in every
/// subcommand's help, apart from the subcommand's own.
const GLOBAL: &str = "Global options";

#[derive(Parser)]
#[command(
    name = "astraeusctl",
    version,
    about = "Control astraeusd over D-Bus",
    long_about = "Control astraeusd, the GPU node daemon, over D-Bus (the system bus \
        unless --session or --bus-address says otherwise).\n\n\
        Memory is in GB: 1 GB is 2^30 bytes (a GiB); nvidia-smi's MiB are 1/1024 of it.",
    after_long_help = "A call the bus refuses because its queue to the daemon is full never \
        reached the daemon: astraeusctl says so on standard error and sends it again, \
        for up to 25 seconds.",
    max_term_width = 100
)]
pub struct CtlArgs {
    /// Talk to a daemon on the session bus.
    #[arg(long, global = true, help_heading = GLOBAL, conflicts_with = "bus_address")]
    pub session: bool,
    /// Talk to a daemon on the bus at this address.
    #[arg(long, global = true, help_heading = GLOBAL, value_name = "ADDR")]
    pub bus_address: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long, global = true, help_heading = GLOBAL)]
    pub json: bool,
    /// Print lists without their header, notes and count line (for scripts).
    #[arg(long, global = true, help_heading = GLOBAL)]
    pub no_legend: bool,
    /// Colour: auto (a terminal whose TERM takes colour, unless NO_COLOR is
    /// set; CLICOLOR_FORCE forces it), always or never.
    #[arg(long, global = true, help_heading = GLOBAL, value_name = "WHEN", default_value = "auto",
          value_parser = ["auto", "always", "never"])]
    pub color: String,
    /// Give up on a call the daemon has not answered in this many seconds
    /// (1 to 86400; busctl's and gdbus's default is the same 25).
    #[arg(long, global = true, help_heading = GLOBAL, value_name = "SECONDS", default_value_t = 25,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub timeout: u64,
    #[command(subcommand)]
    pub cmd: CtlCommand,
}

#[derive(Subcommand)]
pub enum CtlCommand {
    /// The machine's GPUs as a table: what each offers, how it is used, its health.
    Gpus,
    /// Live workers with their state, owner, GPUs (`1 · shared 2.2 GB`, the
    /// seed's count) and which GPUs (the GPU column, by index).
    Workers,
    /// Workers that ended, newest first, with when and how they ended.
    History {
        /// Only those that ended since then: 1h, 30min, 2d, today, yesterday,
        /// YYYY-MM-DD[THH:MM] (your zone, $TZ) or @EPOCH (seconds) [default: all].
        #[arg(long, value_name = "WHEN", allow_hyphen_values = true)]
        since: Option<String>,
        /// At most this many (1 to 10000).
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: u32,
    },
    /// Follow what happens, a line each (JSON lines with --json), until Ctrl-C:
    /// workers added and removed, state changes, why they wait, handoff steps
    /// and slices.
    Events,
    /// One worker whole, for a person: state, owner, GPUs, share, use,
    /// warnings, holders, why it waits, and its request (env values only for
    /// its owner and root). With no name, the daemon's: its machine, its
    /// workers, the engine containers run through, its page.
    Status {
        /// The worker's name.
        name: Option<String>,
    },
    /// One worker's properties as KEY=VALUE lines, for scripts (as
    /// systemctl show): the D-Bus property names; a list of texts a line
    /// per entry; --json: one object.
    Show {
        /// The worker's name.
        name: String,
        /// Only these properties (repeat, or separate by commas).
        #[arg(
            short = 'p',
            long = "property",
            value_name = "NAME",
            value_delimiter = ','
        )]
        property: Vec<String>,
        /// Print the values alone, without KEY=.
        #[arg(long)]
        value: bool,
    },
    /// Who shares one GPU, and how much each takes.
    Sharers {
        /// The GPU's index (as `astraeusctl gpus` lists it).
        gpu: u32,
    },
    /// Submit a worker spec (JSON) from a file, or - for standard input.
    /// A workload it launches is waited for, as systemctl start waits for
    /// its job: running, or how it failed (exit status 1).
    Submit {
        /// The spec's file, or - for standard input.
        file: String,
        /// Return once the daemon took it, without waiting for its launch.
        #[arg(long)]
        no_block: bool,
    },
    /// Stop workers, each in turn and each answered (as podman stop A B),
    /// each waited for until it has ended (as systemctl stop); the exit
    /// status is the worst of theirs.
    Stop {
        /// The workers' names.
        #[arg(required = true, num_args = 1.., value_name = "NAME")]
        names: Vec<String>,
        /// Return once the stop is acknowledged, without waiting for the end.
        #[arg(long)]
        no_block: bool,
    },
    /// Where a spec would go now, or why it would wait (changes nothing).
    Why {
        /// The spec's file, or - for standard input.
        file: String,
    },
    /// A template's scheduled actions (time-slicing rotation).
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// Time-slicing templates: persistent VMs that own the GPU baseboard in turn.
    #[command(subcommand)]
    Template(TemplateCommand),
    /// Who owns the GPU baseboard when, in your time zone ($TZ); with
    /// --report, the slices that ran, by template and by user.
    Slices {
        /// Report the slices that ran in the window (default: the last 7 days).
        #[arg(long, conflicts_with = "next")]
        report: bool,
        /// Show the next N slices from now (1 to 1000), however far away.
        #[arg(long, value_name = "N", conflicts_with_all = ["from", "to"],
              value_parser = clap::value_parser!(u32).range(1..=1000))]
        next: Option<u32>,
        /// Window start: today, yesterday, -2d, YYYY-MM-DD[THH:MM] (your zone) or @EPOCH (seconds).
        #[arg(long, requires = "to", allow_hyphen_values = true)]
        from: Option<String>,
        /// Window end, as --from.
        #[arg(long, requires = "from", allow_hyphen_values = true)]
        to: Option<String>,
    },
    /// Follow your own workers and raise desktop notifications: placed after
    /// waiting, failed, a new warning (beyond its share), stopped by someone
    /// else; and your template's slice starting. At most 5 a minute. Without
    /// --session or --bus-address: the session's daemon and the system's.
    /// Runs until stopped (the user unit astraeus-notify.service runs it).
    Notify,
    /// Open the machine page of the daemon that runs in your browser (the
    /// desktop entry's command): your session's daemon, else the system's,
    /// at the address it reports. Never starts a daemon.
    Page {
        /// Print the page's address instead of opening it.
        #[arg(long)]
        print: bool,
        /// When there is no page to open, say so in a desktop notification too.
        #[arg(long)]
        notify: bool,
    },
    /// The CDI createContainer hook of a Kubernetes claim (the kubelet
    /// plugin's spec runs it, as root): binds the container whose OCI state
    /// is on standard input to the claim, before its command runs.
    ClaimHook {
        /// The claim's UID.
        uid: String,
    },
    /// GPU-hours and energy by worker, owner, GPU or user; a shared GPU counts
    /// for each sharer by its share of the GPU's memory.
    Usage {
        /// Window start: 1h, 30min, 2d (that long ago), today, yesterday,
        /// YYYY-MM-DD[THH:MM] (your zone, $TZ) or @EPOCH (seconds) [default: 24 hours ago].
        #[arg(long, allow_hyphen_values = true)]
        since: Option<String>,
        /// Window end, as --since, or now [default: now].
        #[arg(long, allow_hyphen_values = true)]
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
    Create {
        /// The template's JSON file, or - for standard input.
        file: String,
    },
    /// Every template with its user, VM and state.
    List,
    /// Remove a template whose VM is off (the libvirt domain is kept). Root only.
    Remove {
        /// The template's name.
        name: String,
    },
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
        /// The template's name.
        name: String,
        /// Power the baseboard's holder off first, then boot this one.
        #[arg(long)]
        handoff: bool,
    },
    /// Power a template's VM off (ACPI, forced after the timeout; --hard: at once).
    Poweroff {
        /// The template's name.
        name: String,
        /// Destroy at once instead of ACPI shutdown.
        #[arg(long)]
        hard: bool,
    },
}

// Parsed once per run: the size of one variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum ScheduleCommand {
    /// Set a template's schedule: in words (`--weekly mon,wed,fri --from
    /// 09:00 --to 17:00`, in the daemon's time zone), or from FILE (- for
    /// standard input; `[]` removes the schedule): our SCHED_ACTION JSON, or
    /// OpenNebula's own SCHED_ACTION=[…] text or JSON as `onevm show` prints it.
    Set {
        /// The template whose slices these are.
        template: String,
        /// SCHED_ACTION JSON or OpenNebula text instead of the words below.
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
        /// Slices on these days of the year, counted from 0 as OpenNebula's
        /// scheduler does (0 = 1 January): 0,181.
        #[arg(long, value_name = "DAYS", group = "every")]
        yearly: Option<String>,
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

/// A time given on the command line, as epoch seconds, the way journalctl
/// reads them: `now`, `today`, `yesterday`, `tomorrow` (midnight in `tz`),
/// a span ago (`1h`, `30min`, `2d`, `-1h`, `1h ago`), a date or date-time in
/// `tz` (`2026-12-04`, `2026-12-04T09:30`, `2026-12-04 09:30`), or `@EPOCH`
/// seconds (as journalctl and date(1) write them); a bare number is refused:
/// `--since 2026` would be a second of 1970, not the year.
pub fn parse_when(
    text: &str,
    now: jiff::Timestamp,
    tz: &jiff::tz::TimeZone,
    flag: &str,
) -> Result<i64, String> {
    let t = text.trim();
    let bad = || {
        format!(
            "{flag}: expected 1h, 30min, 2d, today, yesterday, YYYY-MM-DD, \
             YYYY-MM-DDTHH:MM or @EPOCH (seconds); got {text:?}"
        )
    };
    if let Some(secs) = t.strip_prefix('@') {
        return secs.parse::<i64>().map_err(|_| bad());
    }
    if t.parse::<i64>().is_ok() {
        return Err(format!(
            "{flag}: {t} alone could be a year or epoch seconds: write @{t} for epoch seconds \
             (as journalctl and date(1) take them), or a date such as 2026-12-01"
        ));
    }
    let midnight = |days: i64| -> Result<i64, String> {
        let date = now.to_zoned(tz.clone()).date();
        let day = date
            .checked_add(jiff::Span::new().days(days))
            .map_err(|_| bad())?;
        day.to_zoned(tz.clone())
            .map(|z| z.timestamp().as_second())
            .map_err(|e| format!("{flag}: {e}"))
    };
    match t {
        "now" => return Ok(now.as_second()),
        "today" => return midnight(0),
        "yesterday" => return midnight(-1),
        "tomorrow" => return midnight(1),
        _ => {}
    }
    let ago = t.strip_suffix(" ago").unwrap_or(t);
    let ago = ago.strip_prefix('-').unwrap_or(ago);
    if let Some(secs) = span_seconds(ago) {
        return Ok(now.as_second() - secs);
    }
    // With its offset (2026-07-01T09:15+02:00, …Z): that instant, whatever
    // the zone here (read as civil time, the offset was dropped).
    if let Ok(at) = t.replacen(' ', "T", 1).parse::<jiff::Timestamp>() {
        return Ok(at.as_second());
    }
    let civil: jiff::civil::DateTime = t
        .replacen(' ', "T", 1)
        .parse::<jiff::civil::DateTime>()
        .or_else(|_| {
            t.parse::<jiff::civil::Date>()
                .map(|d| d.to_datetime(jiff::civil::Time::midnight()))
        })
        .map_err(|_| bad())?;
    civil
        .to_zoned(tz.clone())
        .map(|z| z.timestamp().as_second())
        .map_err(|e| format!("{flag}: {e}"))
}

/// `90s`, `30min`, `1h`, `2d`, `1w`, `1h30min` as seconds; None otherwise.
fn span_seconds(text: &str) -> Option<i64> {
    let mut total: i64 = 0;
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        if digits == 0 {
            return None;
        }
        let n: i64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match rest[..unit_len].trim() {
            "s" | "sec" | "second" | "seconds" => 1,
            "m" | "min" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3_600,
            "d" | "day" | "days" => 86_400,
            "w" | "week" | "weeks" => 7 * 86_400,
            _ => return None,
        };
        total = total.checked_add(n.checked_mul(unit)?)?;
        rest = &rest[unit_len..];
    }
    Some(total)
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
        // systemctl status's "not running" (LSB: program is not running).
        "NotRunning" => 3,
        // sysexits' EX_NOINPUT: a file of the caller's that cannot be read.
        "NoInput" => 66,
        "Usage" => 2,
        // sysexits' EX_UNAVAILABLE: no daemon (or no bus) to talk to.
        "ServiceUnknown" | "NameHasNoOwner" | "NoReply" | "Unreachable" | "Gone"
        | "StartFailed" | "NoDaemon" | "NoBus" => 69,
        _ => 1,
    }
}

/// A bus error reply as astraeusctl prints it: the daemon's own errors
/// (org.astraeus.…) by their kind, "NotFound: …"; any other by its full
/// name, which says whose it is (a bus that failed to start the daemon
/// through systemd: "org.freedesktop.systemd1.UnitMasked: …").
pub fn describe_error(name: &str, message: &str) -> String {
    match name.strip_prefix("org.astraeus.") {
        Some(ours) => format!("{}: {message}", ours.rsplit('.').next().unwrap_or(ours)),
        None => format!("{name}: {message}"),
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
    } else if head.starts_with("org.freedesktop.DBus.Error.Spawn.")
        || head.starts_with("org.freedesktop.systemd1.")
    {
        // The bus tried to start the daemon for this call (D-Bus
        // activation, directly or through systemd) and could not: the
        // daemon is not running. The bus's own words say why.
        ("StartFailed", e)
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

    /// A subcommand's help lists its own options apart from the global
    /// ones, under their own heading (as podman's and git's do).
    #[test]
    fn global_options_have_their_own_heading() {
        use clap::Parser;
        let help = CtlArgs::try_parse_from(["astraeusctl", "stop", "--help"])
            .err()
            .expect("--help ends the parse")
            .to_string();
        let (own, global) = help.split_once("Global options:").expect(&help);
        assert!(global.contains("--bus-address <ADDR>"), "{help}");
        assert!(global.contains("--timeout <SECONDS>"), "{help}");
        assert!(!own.contains("--bus-address"), "{help}");
        // And what a GB is, in the long help (docs/operations.md, Units).
        let long = <CtlArgs as clap::CommandFactory>::command()
            .render_long_help()
            .to_string();
        assert!(long.contains("1 GB is 2^30 bytes (a GiB)"), "{long}");
    }

    /// Every subcommand and argument of both programs says what it is (the
    /// man pages and completions are made from the same text).
    #[test]
    fn every_argument_has_help() {
        use clap::CommandFactory;
        fn walk(c: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in c.get_arguments() {
                let id = a.get_id().as_str();
                if id != "help" && id != "version" && a.get_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for s in c.get_subcommands() {
                if s.get_name() != "help" && s.get_about().is_none() {
                    missing.push(format!("{path} {}", s.get_name()));
                }
                walk(s, &format!("{path} {}", s.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&CtlArgs::command(), "astraeusctl", &mut missing);
        walk(&DaemonArgs::command(), "astraeusd", &mut missing);
        assert!(missing.is_empty(), "no help for: {missing:?}");
    }

    /// The help's own examples parse: a time that starts with a dash is
    /// the flag's value, not another flag.
    #[test]
    fn times_before_now_may_start_with_a_dash() {
        use clap::Parser;
        for args in [
            &["slices", "--report", "--from", "-2d", "--to", "now"][..],
            &["usage", "--since", "-1h", "--until", "-30min"],
            &["history", "--since", "-1h"],
        ] {
            let all = std::iter::once("astraeusctl").chain(args.iter().copied());
            assert!(CtlArgs::try_parse_from(all).is_ok(), "{args:?}");
        }
    }

    #[test]
    fn times_are_read_as_journalctl_reads_them() {
        let tz = jiff::tz::TimeZone::get("Europe/Berlin").unwrap();
        // 2026-12-04 10:30 in Berlin (UTC+1) = 09:30 UTC.
        let now: jiff::Timestamp = "2026-12-04T09:30:00Z".parse().unwrap();
        let at = |s: &str| parse_when(s, now, &tz, "--since");
        let n = now.as_second();
        assert_eq!(at("now"), Ok(n));
        assert_eq!(at("1h"), Ok(n - 3600));
        assert_eq!(at("-1h"), Ok(n - 3600));
        assert_eq!(at("1h ago"), Ok(n - 3600));
        assert_eq!(at("30min"), Ok(n - 1800));
        assert_eq!(at("1h30min"), Ok(n - 5400));
        assert_eq!(at("2d"), Ok(n - 2 * 86_400));
        assert_eq!(at("1w"), Ok(n - 7 * 86_400));
        // Midnight in Berlin is 23:00 UTC the day before.
        let utc = |s: &str| s.parse::<jiff::Timestamp>().unwrap().as_second();
        assert_eq!(at("today"), Ok(utc("2026-12-03T23:00:00Z")));
        assert_eq!(at("yesterday"), Ok(utc("2026-12-02T23:00:00Z")));
        assert_eq!(at("tomorrow"), Ok(utc("2026-12-04T23:00:00Z")));
        assert_eq!(at("2026-07-01"), Ok(utc("2026-06-30T22:00:00Z")));
        assert_eq!(at("2026-07-01T09:15"), Ok(utc("2026-07-01T07:15:00Z")));
        assert_eq!(at("2026-07-01 09:15"), Ok(utc("2026-07-01T07:15:00Z")));
        assert_eq!(at("@1700000000"), Ok(1_700_000_000));
        // A bare number is refused, saying how to write either meaning.
        let e = at("2026").unwrap_err();
        assert!(e.contains("write @2026 for epoch seconds"), "{e}");
        assert!(at("@").is_err() && at("@x").is_err());
        // An offset or Z names the instant (Berlin's zone does not apply).
        assert_eq!(
            at("2026-07-01T09:15+05:00"),
            Ok(utc("2026-07-01T04:15:00Z"))
        );
        assert_eq!(at("2026-07-01T09:15:00Z"), Ok(utc("2026-07-01T09:15:00Z")));
        assert_eq!(
            at("2026-07-01 09:15-04:00"),
            Ok(utc("2026-07-01T13:15:00Z"))
        );
        for bad in ["someday", "1x", "h", "", "1h ago ago", "2026-13-01"] {
            let e = at(bad).unwrap_err();
            assert!(e.starts_with("--since: expected 1h"), "{bad}: {e}");
        }
    }

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
        let spawn = "org.freedesktop.DBus.Error.Spawn.ChildExited: Process org.astraeus.Node1 \
                     exited with status 1";
        assert_eq!(code(spawn), 69);
        assert_eq!(kind_of(spawn), ("StartFailed", spawn));
        // As astraeusctl has them from a bus error reply (zbus gives the
        // name of one outside the standard D-Bus errors apart).
        let masked = describe_error(
            "org.freedesktop.systemd1.UnitMasked",
            "Unit astraeusd.service is masked.",
        );
        assert_eq!(code(&masked), 69);
        assert_eq!(kind_of(&masked).0, "StartFailed");
        let ours = describe_error(
            "org.astraeus.Node1.Error.NotFound",
            "no live worker named x",
        );
        assert_eq!(ours, "NotFound: no live worker named x");
        assert_eq!(code(&ours), 4);
        assert_eq!(code(&describe_error("com.example.Odd", "?")), 1);
        assert_eq!(code("--since: expected YYYY-MM-DD"), 2);
        assert_eq!(code("something odd happened"), 1);
        assert_eq!(
            kind_of("NotFound: no live worker named x").1,
            "no live worker named x"
        );
    }
}
