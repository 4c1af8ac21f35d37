//! astraeusctl: the command line for astraeusd. It speaks only D-Bus.

use astraeusd::bus::{BASE_PATH, BUS_NAME};
use astraeusd::cli::{CtlArgs as Args, CtlCommand as Cmd, ScheduleCommand, TemplateCommand};
use astraeusd::quantity::Amount;
use astraeusd::schedule_form::{self, Every, Form, Until};
use astraeusd::wire::{Sharers, SliceReportRow, SliceRow, UsageRow, WhyNot};
use clap::Parser;
use serde_json::json;
use std::io::Read;
use std::process::ExitCode;
use zbus::{Connection, OwnedObjectPath};

const MANAGER: &str = "org.astraeus.Node1.Manager";
const WORKER: &str = "org.astraeus.Node1.Worker";

/// Everything astraeusctl prints goes through these: what the daemon sends
/// (reasons, names, messages) never reaches the terminal with control
/// characters in it (line breaks and tabs aside), whatever the daemon did.
macro_rules! outln {
    () => { $crate::out_line("") };
    ($($t:tt)*) => { $crate::out_line(&astraeusd::text::printable_lines(&format!($($t)*))) };
}

macro_rules! errln {
    ($($t:tt)*) => { eprintln!("{}", $crate::for_locale(&astraeusd::text::printable_lines(&format!($($t)*)))) };
}

mod colour;
mod complete;
mod hints;
mod output;
use output::{for_locale, out_line, Progress};
mod events;
mod hook;
mod lists;
mod notify;
mod outcome;
mod page;
mod reports;
mod show;

use reports::{print_slice_report, print_slices, print_usage};

/// The caller's time zone ($TZ, else the system's), in which times are
/// shown and read, named wherever times are printed.
struct Local {
    name: String,
    tz: jiff::tz::TimeZone,
}

impl Local {
    fn here() -> Local {
        let tz = jiff::tz::TimeZone::system();
        let name = match tz.iana_name() {
            Some(n) => n.to_string(),
            None if tz == jiff::tz::TimeZone::UTC => "UTC".to_string(),
            None => "local time".to_string(),
        };
        Local { name, tz }
    }

    fn when(&self, text: &str, flag: &str) -> Result<i64, String> {
        astraeusd::cli::parse_when(text, jiff::Timestamp::now(), &self.tz, flag)
    }

    /// Epoch seconds as `2026-12-04 10:31:05`.
    fn time(&self, secs: i64) -> String {
        self.format(secs, "%Y-%m-%d %H:%M:%S")
    }

    /// Epoch seconds in this zone, as `form` (strftime) writes them.
    fn format(&self, secs: i64, form: &str) -> String {
        jiff::Timestamp::from_second(secs)
            .map(|t| t.to_zoned(self.tz.clone()).strftime(form).to_string())
            .unwrap_or_else(|_| secs.to_string())
    }
}

/// GB as the daemon shows them: `7`, `6.5`, `2.25`.
fn gb(x: f64) -> String {
    Amount::from_hundredths((x * 100.0).round().max(0.0) as u64).to_string()
}

/// A file of the caller's that cannot be read: its own kind (and exit
/// code), so that it is never taken for the daemon's answer (a file named
/// `NotFound`) or a bus that is not there ("No such file or directory").
fn no_input(what: &str, e: std::io::Error) -> String {
    format!("NoInput: {what}: {e}")
}

fn read_spec(file: &str) -> Result<String, String> {
    let mut text = String::new();
    if file == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| no_input("standard input", e))?;
    } else {
        text = std::fs::read_to_string(file).map_err(|e| no_input(file, e))?;
    }
    Ok(text)
}

fn describe(e: zbus::Error) -> String {
    match e {
        zbus::Error::MethodError(name, msg, _) => {
            astraeusd::cli::describe_error(name.as_str(), msg.as_deref().unwrap_or_default())
        }
        zbus::Error::FDO(e) => e.to_string(),
        zbus::Error::InputOutput(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            "NoReply: no answer in time (--timeout)".to_string()
        }
        e => e.to_string(),
    }
}

/// A connection to the bus the command line names: `--bus-address`, else
/// `--session`, else the system bus (completion asks the same one).
fn bus_builder(address: Option<&str>, session: bool) -> zbus::connection::Builder<'_> {
    match (address, session) {
        (Some(a), _) => zbus::connection::Builder::address(a),
        (None, true) => zbus::connection::Builder::session(),
        (None, false) => zbus::connection::Builder::system(),
    }
}

struct Client {
    conn: Connection,
    /// `--timeout`: how long a call may go unanswered.
    patience: std::time::Duration,
}

/// How long a call refused by the bus for a full queue is tried again: as
/// long as D-Bus's default method timeout, what a slow answer would cost.
const BUS_FULL_PATIENCE: std::time::Duration = std::time::Duration::from_secs(25);

/// Whether the bus itself refused the call because its queue to the daemon
/// is full (someone else is sending it more than it reads). The message
/// never reached the daemon, so sending it again cannot do anything twice.
fn bus_queue_full(e: &zbus::Error) -> bool {
    match e {
        zbus::Error::MethodError(name, _, _) => {
            name.as_str() == "org.freedesktop.DBus.Error.LimitsExceeded"
        }
        zbus::Error::FDO(e) => matches!(**e, zbus::fdo::Error::LimitsExceeded(_)),
        _ => false,
    }
}

impl Client {
    /// One method call to the daemon, sent again (20 ms, then doubling to
    /// 1 s apart, for up to [`BUS_FULL_PATIENCE`]) while the bus refuses it
    /// for a full queue: another user flooding the daemon delays a member's
    /// call, it does not fail it. Any other error is returned at once.
    async fn method<B>(
        &self,
        path: &str,
        interface: &str,
        method: &str,
        body: &B,
    ) -> Result<zbus::Message, String>
    where
        B: serde::Serialize + zbus::Type,
    {
        let started = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(20);
        let mut told = false;
        loop {
            match self
                .conn
                .call_method(Some(BUS_NAME), path, Some(interface), method, body)
                .await
            {
                Err(e) if bus_queue_full(&e) && started.elapsed() < BUS_FULL_PATIENCE => {
                    if !told {
                        errln!(
                            "the bus refused {method}: its queue to the daemon is full (someone is \
                             sending it more than it reads); trying again for up to {} s",
                            BUS_FULL_PATIENCE.as_secs()
                        );
                        told = true;
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(1));
                }
                Err(e) if bus_queue_full(&e) => {
                    return Err(format!(
                    "{} (the bus refused {method} for {} s: its queue to the daemon stays full)",
                    describe(e),
                    BUS_FULL_PATIENCE.as_secs()
                ))
                }
                Err(zbus::Error::InputOutput(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
                    return Err(self.no_answer(method));
                }
                other => return other.map_err(describe),
            }
        }
    }

    /// A call that went unanswered for `--timeout`: the daemon is there
    /// (the bus would have said otherwise) but stuck or overloaded.
    fn no_answer(&self, what: &str) -> String {
        format!(
            "NoReply: astraeusd did not answer {what} within {} s (--timeout)",
            self.patience.as_secs()
        )
    }

    async fn call<B, R>(&self, method: &str, body: &B) -> Result<R, String>
    where
        B: serde::Serialize + zbus::Type,
        R: for<'d> serde::Deserialize<'d> + zbus::Type,
    {
        let msg = self.method(BASE_PATH, MANAGER, method, body).await?;
        msg.body()
            .deserialize()
            .map_err(|e| format!("reply of {method}: {e}"))
    }

    /// The daemon's time zone: its name, and the zone (UTC if unknown here).
    async fn zone(&self) -> Result<(String, jiff::tz::TimeZone), String> {
        let zone: String = self.manager_property("TimeZone").await?;
        let tz = jiff::tz::TimeZone::get(&zone).unwrap_or(jiff::tz::TimeZone::UTC);
        Ok((zone, tz))
    }

    /// The daemon's own signals under its base path, matched by its unique
    /// name (anyone may send a signal that looks like its own), merged with
    /// the bus's NameOwnerChanged for its name: the bus outlives the daemon,
    /// and that is how its end is seen.
    async fn daemon_signals(
        &self,
    ) -> Result<impl futures_util::Stream<Item = zbus::Result<zbus::Message>> + Unpin, String> {
        let owner = zbus::fdo::DBusProxy::new(&self.conn)
            .await
            .map_err(describe)?
            .get_name_owner(BUS_NAME.try_into().expect("bus name"))
            .await
            .map_err(|e| describe(e.into()))?;
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender(owner.as_str())
            .path_namespace(BASE_PATH)
            .build()
            .map_err(|e| e.to_string())?;
        let from_daemon = zbus::MessageStream::for_match_rule(rule, &self.conn, None)
            .await
            .map_err(describe)?;
        let owner_rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender("org.freedesktop.DBus")
            .member("NameOwnerChanged")
            .arg(0, BUS_NAME)
            .build()
            .map_err(|e| e.to_string())?;
        let owner_changes = zbus::MessageStream::for_match_rule(owner_rule, &self.conn, None)
            .await
            .map_err(describe)?;
        // The daemon's own first whenever both have one: the connection
        // hands each stream its messages in the order they came, so what
        // the daemon said before it left (its last changes, sent as it
        // stops) is read before the news that it left. Taken in turns, the
        // end could come first and those be lost.
        Ok(futures_util::stream::select_with_strategy(
            from_daemon,
            owner_changes,
            |_: &mut ()| futures_util::stream::PollNext::Left,
        ))
    }

    async fn manager_property<T>(&self, name: &str) -> Result<T, String>
    where
        T: TryFrom<zbus::OwnedVariant>,
        T::Error: std::fmt::Display,
    {
        self.property(BASE_PATH, MANAGER, name).await
    }

    /// One property of one of the daemon's objects.
    async fn property<T>(&self, path: &str, interface: &str, name: &str) -> Result<T, String>
    where
        T: TryFrom<zbus::OwnedVariant>,
        T::Error: std::fmt::Display,
    {
        let msg = self
            .method(
                path,
                "org.freedesktop.DBus.Properties",
                "Get",
                &(interface, name),
            )
            .await?;
        let v: zbus::OwnedVariant = msg.body().deserialize().map_err(|e| e.to_string())?;
        T::try_from(v).map_err(|e| format!("{name}: {e}"))
    }
}

async fn run(args: Args) -> Result<(), String> {
    // clap sees this conflict only when --json comes after --csv.
    if matches!(args.cmd, Cmd::Usage { csv: true, .. }) && args.json {
        return Err("--csv: cannot be used with --json (one form at a time)".into());
    }
    let patience = std::time::Duration::from_secs(args.timeout);
    // Looks on its own buses, and never where it would start a daemon.
    if let Cmd::Page { print, notify } = args.cmd {
        let address = args.bus_address.as_deref();
        return page::page(args.session, address, patience, print, notify).await;
    }
    if let Cmd::Notify = args.cmd {
        return notify::notify_all(args.session, args.bus_address.as_deref(), patience).await;
    }
    let builder = bus_builder(args.bus_address.as_deref(), args.session);
    // Every call, and the bus's own greeting, waits at most --timeout.
    let conn = tokio::time::timeout(patience, builder.method_timeout(patience).build())
        .await
        .map_err(|_| {
            format!(
                "NoReply: the bus did not answer within {} s (--timeout)",
                args.timeout
            )
        })?
        .map_err(|e| {
            format!(
                "NoBus: cannot reach {}: {e}",
                hints::bus_tried(args.bus_address.as_deref(), args.session)
            )
        })?;
    let c = Client { conn, patience };
    let form = lists::Form {
        json: args.json,
        legend: !args.no_legend,
    };
    match args.cmd {
        // Answered above, before connecting.
        Cmd::Page { .. } | Cmd::Notify => {}
        Cmd::Gpus => lists::gpus(&c, form).await?,
        Cmd::Workers => lists::workers(&c, form).await?,
        Cmd::History { since, limit } => lists::history(&c, form, since, limit).await?,
        Cmd::Events => events::follow(&c, args.json).await?,
        Cmd::Status { name: Some(name) } => show::status(&c, &name, args.json).await?,
        Cmd::Status { name: None } => show::daemon_status(&c, args.json).await?,
        Cmd::Show {
            name,
            property,
            value,
        } => show::show(&c, &name, &property, value, args.json).await?,
        Cmd::ClaimHook { uid } => {
            let pid = hook::pid_of_state(&hook::read_state()?)?;
            let args = (uid.as_str(), pid);
            match c.call::<_, String>("BindClaimContainer", &args).await {
                Ok(held) => errln!("astraeusctl claim-hook: claim {uid}: process {pid}'s container bound; its share: {held}"),
                // Another container of the pod holds the claim: this one runs.
                Err(e) if astraeusd::cli::kind_of(&e).0 == "Conflict" => {
                    errln!("astraeusctl claim-hook: {e} (this container runs unbound)")
                }
                Err(e) => return Err(e),
            }
        }
        Cmd::Sharers { gpu } => {
            let Sharers { sharers, summary } = c.call("ListSharers", &(gpu,)).await?;
            if args.json {
                let s: Vec<_> = sharers
                    .iter()
                    .map(|s| json!({"name": s.name, "gb": s.gb}))
                    .collect();
                outln!(
                    "{}",
                    serde_json::to_string_pretty(
                        &json!({"gpu": gpu, "sharers": s, "summary": summary})
                    )
                    .expect("json")
                );
            } else {
                outln!("GPU {gpu}: {summary}");
            }
        }
        Cmd::Submit { file, no_block } => {
            let spec = read_spec(&file)?;
            let asked_ms = jiff::Timestamp::now().as_millisecond();
            let (path, mut state, reasons): (OwnedObjectPath, String, Vec<String>) =
                c.call("SubmitWorker", &(spec,)).await?;
            // A launch under way is waited for (systemctl start's job).
            let mut failed = None;
            if state == "starting" && !no_block {
                match outcome::wait_for_launch(&c, path.as_str(), asked_ms).await? {
                    outcome::Launched::Running => state = "running".into(),
                    outcome::Launched::Ended(name, how) => {
                        state = "failed".into();
                        failed = Some((name, how));
                    }
                }
            }
            if let Some((name, how)) = failed {
                // Launched, and already done (a short job): not a failure.
                let launched = !how.starts_with("failed to start");
                if launched {
                    state = "ended".into();
                }
                if args.json {
                    outln!(
                        "{}",
                        json!({"worker": path.as_str(), "state": state, "ended": how})
                    );
                } else if launched {
                    outln!("ended: {} ({how})", path.as_str());
                }
                if !launched {
                    return Err(format!("LaunchFailed: worker {name} {how}"));
                }
                return Ok(());
            }
            if args.json {
                outln!(
                    "{}",
                    json!({"worker": path.as_str(), "state": state, "pending_reasons": reasons})
                );
            } else {
                outln!("{state}: {}", path.as_str());
                for r in reasons {
                    outln!("  {r}");
                }
            }
        }
        Cmd::Stop { names, no_block } => {
            // Each in turn, each answered; the exit status is the worst.
            let mut worst: Option<String> = None;
            let many = names.len() > 1;
            for name in &names {
                let asked = c.call::<_, ()>("StopWorker", &(name.as_str(),)).await;
                // Acknowledged: waited for until it has ended (systemctl stop).
                let asked = match asked {
                    Ok(()) if !no_block => outcome::wait_until_gone(&c, name).await,
                    other => other,
                };
                match asked {
                    Ok(()) if args.json => outln!("{}", json!({"stopped": name})),
                    Ok(()) if no_block => outln!("stopping {name}"),
                    Ok(()) => outln!("stopped {name}"),
                    Err(e) if many => {
                        errln!("astraeusctl: {name}: {e}");
                        let code =
                            |e: &str| astraeusd::cli::exit_code(astraeusd::cli::kind_of(e).0);
                        if worst.as_deref().is_none_or(|w| code(&e) > code(w)) {
                            worst = Some(e);
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            if let Some(w) = worst {
                let (kind, _) = astraeusd::cli::kind_of(&w);
                return Err(format!(
                    "{kind}: not every worker named was stopped (see above)"
                ));
            }
        }
        Cmd::Why { file } => {
            let spec = read_spec(&file)?;
            let WhyNot {
                fits,
                gpus,
                reasons,
            } = c.call("WhyNot", &(spec,)).await?;
            if args.json {
                outln!(
                    "{}",
                    json!({"fits": fits, "gpus": gpus, "reasons": reasons})
                );
            } else if fits {
                let g: Vec<String> = gpus.iter().map(|i| format!("GPU {i}")).collect();
                if g.is_empty() {
                    outln!("it would start now (no GPU asked for)");
                } else {
                    outln!("it would start now on {}", g.join(", "));
                }
            } else {
                outln!("it would wait:");
                for r in reasons {
                    outln!("  {r}");
                }
            }
        }
        Cmd::Schedule(ScheduleCommand::Set {
            template,
            file,
            weekly,
            monthly,
            hourly,
            yearly,
            from,
            to,
            starting,
            until,
            times,
            dry_run,
        }) => {
            let (_, tz) = c.zone().await?;
            let actions = match file {
                Some(file) => read_spec(&file)?,
                None => {
                    let every = match (weekly, monthly, hourly, yearly) {
                        (Some(w), _, _, _) => Every::Weekly(schedule_form::parse_weekdays(&w).map_err(|e| e.message().to_string())?),
                        (_, Some(m), _, _) => Every::Monthly(schedule_form::parse_month_days(&m).map_err(|e| e.message().to_string())?),
                        (_, _, Some(h), _) => Every::Hourly(h),
                        (_, _, _, Some(y)) => Every::Yearly(schedule_form::parse_year_days(&y).map_err(|e| e.message().to_string())?),
                        _ => return Err("Usage: give the schedule in words (--weekly, --monthly, --hourly or --yearly with --from and --to) or as a JSON FILE".into()),
                    };
                    let clock = |flag: &str,
                                 v: Option<String>|
                     -> Result<jiff::civil::Time, String> {
                        let v = v.ok_or_else(|| {
                            format!(
                                "{flag}: HH:MM is required with --weekly, --monthly or --hourly"
                            )
                        })?;
                        schedule_form::parse_clock(flag, &v).map_err(|e| e.message().to_string())
                    };
                    let day = |flag: &str, v: &str| -> Result<jiff::civil::Date, String> {
                        v.parse()
                            .map_err(|_| format!("{flag}: a date YYYY-MM-DD; got {v:?}"))
                    };
                    let form = Form {
                        every,
                        from: clock("--from", from)?,
                        to: clock("--to", to)?,
                        starting: match &starting {
                            Some(s) => day("--starting", s)?,
                            None => schedule_form::today(jiff::Timestamp::now(), &tz),
                        },
                        until: match (&until, times) {
                            (Some(u), _) => Until::Date(day("--until", u)?),
                            (_, Some(n)) => Until::Times(n),
                            _ => Until::Never,
                        },
                    };
                    form.actions(&tz)
                        .map_err(|e| e.message().to_string())?
                        .to_string()
                }
            };
            if dry_run {
                let (rows, notes): (Vec<SliceRow>, Vec<String>) = c
                    .call("PreviewScheduleMs", &(template.as_str(), actions.as_str()))
                    .await?;
                if !args.json {
                    outln!("dry run: nothing saved; the next slices would be");
                }
                print_slices(&rows, &notes, &Local::here(), form);
                return Ok(());
            }
            c.call::<_, ()>("SetSchedule", &(template.as_str(), actions.as_str()))
                .await?;
            if args.json {
                outln!("{}", json!({"set": template}));
            } else {
                outln!("schedule of {template} set");
            }
        }
        Cmd::Template(t) => template(&c, t, form).await?,
        Cmd::Schedule(ScheduleCommand::Show { template }) => {
            let actions: String = c.call("GetSchedule", &(template.as_str(),)).await?;
            if args.json {
                let v: serde_json::Value =
                    serde_json::from_str(&actions).map_err(|e| e.to_string())?;
                outln!("{}", serde_json::to_string_pretty(&v).expect("json"));
                return Ok(());
            }
            let (zone, tz) = c.zone().await?;
            // Stored actions are normalized; an end that has passed is no error here.
            let parsed = astraeusd::schedule::parse_actions(&actions, jiff::Timestamp::UNIX_EPOCH)
                .map_err(|e| e.message().to_string())?;
            outln!("schedule of {template}, times in {zone}");
            for a in &parsed {
                outln!("  {}", schedule_form::describe(a, &tz));
            }
        }
        Cmd::Slices {
            report: true,
            from,
            to,
            ..
        } => {
            let local = Local::here();
            let now = jiff::Timestamp::now().as_second();
            let (from, to) = match (from, to) {
                (Some(f), Some(t)) => (local.when(&f, "--from")?, local.when(&t, "--to")?),
                _ => (now - 7 * 86_400, now + 1),
            };
            let rows: Vec<SliceReportRow> = c
                .call("SliceReportMs", &("", from * 1000, to * 1000))
                .await?;
            print_slice_report(&rows, &local, form);
        }
        Cmd::Slices { next, from, to, .. } => {
            let local = Local::here();
            let (from, to, limit) = match (from, to, next) {
                (Some(f), Some(t), _) => (
                    local.when(&f, "--from")?,
                    local.when(&t, "--to")?,
                    usize::MAX,
                ),
                (_, _, n) => {
                    let now = jiff::Timestamp::now().as_second();
                    (now, now + 400 * 86_400, n.unwrap_or(10) as usize)
                }
            };
            let rows: Vec<SliceRow> = if limit == usize::MAX {
                c.call("ListSlicesMs", &(from * 1000, to * 1000)).await?
            } else {
                // However far away: the daemon walks the calendar's cycle.
                let count = u32::try_from(limit).unwrap_or(u32::MAX);
                c.call("ListNextSlicesMs", &(count,)).await?
            };
            let mut notes: Vec<String> = c
                .call("ListSliceNotesMs", &(from * 1000, to * 1000))
                .await?;
            if rows.is_empty() {
                notes.push(if limit == usize::MAX {
                    "no slice in this window".to_string()
                } else {
                    "no slice in the calendar's whole cycle (400 years) from now: no schedule \
                     is set, or every schedule has ended"
                        .to_string()
                });
            }
            print_slices(&rows, &notes, &local, form);
        }
        Cmd::Usage {
            since,
            until,
            by,
            csv,
        } => {
            let local = Local::here();
            let now = jiff::Timestamp::now().as_second();
            let until = match until {
                Some(u) => local.when(&u, "--until")?,
                None => now,
            };
            let since = match since {
                Some(s) => local.when(&s, "--since")?,
                None => until - 86_400,
            };
            // Said here in the flags' names (the daemon's would name its
            // arguments, from and to).
            if until <= since {
                return Err("--until: must be after --since".into());
            }
            let rows: Vec<UsageRow> = c
                .call("UsageReportMs", &(since * 1000, until * 1000, by.as_str()))
                .await?;
            // Usage over a day old is kept as whole UTC days (the daemon's
            // rollups): an edge inside such a day covers all of it. Said
            // on stderr, which data never goes to.
            let kept_whole = |t: i64| {
                let into = t.rem_euclid(86_400);
                into != 0 && t - into + 86_400 <= now - 86_400
            };
            let whole_days = [
                (since, "start at 00:00 UTC of the day --since falls in"),
                (until, "end at the 00:00 UTC after --until"),
            ];
            for (t, edge) in whole_days {
                if kept_whole(t) {
                    errln!("note: usage over a day old is kept as whole UTC days, so this report may {edge}");
                }
            }
            print_usage(&rows, &by, form, csv);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // A shell asking for completions (COMPLETE=bash …): answered, then exit.
    complete::answer_if_asked();
    let args = match Args::try_parse() {
        Ok(args) => args,
        // With --json, a usage error is JSON too (as every other error);
        // help and version are not errors.
        Err(e) if e.use_stderr() && std::env::args().any(|a| a == "--json") => {
            let full = e.to_string();
            let first = full.lines().next().unwrap_or_default();
            let first = first.strip_prefix("error: ").unwrap_or(first);
            let err = json!({"error": "Usage", "message": first, "exit_code": 2});
            errln!("{err}");
            return ExitCode::from(2);
        }
        Err(e) => e.exit(),
    };
    colour::choose(&args.color);
    output::choose_locale(args.json);
    let json_out = args.json;
    let session = args.session;
    let address = args.bus_address.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let (kind, message) = astraeusd::cli::kind_of(&e);
            let code = astraeusd::cli::exit_code(kind);
            if json_out {
                let err = json!({"error": kind, "message": message, "exit_code": code});
                errln!("{err}");
            } else {
                errln!("astraeusctl: {}", hints::explained(kind, &e));
                if let Some(hint) = hints::what_to_check(kind, code, address.as_deref(), session) {
                    errln!("  {hint}");
                }
            }
            ExitCode::from(code)
        }
    }
}

async fn template(c: &Client, cmd: TemplateCommand, form: lists::Form) -> Result<(), String> {
    let json_out = form.json;
    let done = |what: String| {
        if json_out {
            outln!("{}", json!({ "done": what }));
        } else {
            outln!("{what}");
        }
    };
    match cmd {
        TemplateCommand::Create { file } => {
            let spec = read_spec(&file)?;
            let path: zbus::OwnedObjectPath = c.call("CreateTemplate", &(spec.as_str(),)).await?;
            done(format!("template defined: {}", path.as_str()));
        }
        TemplateCommand::List => {
            let rows: Vec<(String, String, String, String)> = c.call("ListTemplates", &()).await?;
            if json_out {
                let j: Vec<_> = rows
                    .iter()
                    .map(|(n, u, d, s)| json!({"name": n, "user": u, "domain": d, "state": s}))
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&j).expect("json"));
                return Ok(());
            }
            let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(8).max(8);
            if form.legend {
                outln!(
                    "{:<w$}  {:<28}  {:<20}  STATE",
                    "TEMPLATE",
                    "USER",
                    "DOMAIN"
                );
            }
            for (n, u, d, s) in &rows {
                outln!("{n:<w$}  {u:<28}  {d:<20}  {s}");
            }
            if form.legend {
                outln!();
                outln!(
                    "{} listed.",
                    match rows.len() {
                        1 => "1 template".to_string(),
                        n => format!("{n} templates"),
                    }
                );
            }
        }
        TemplateCommand::Stage { name, source } => {
            use futures_util::StreamExt;
            // Absolute, `.` and `..` taken out by name, links left as
            // written: the daemon follows none (a link's owner decides where
            // it leads), so a link named here is refused there, by name.
            let path = lexically_absolute(std::path::Path::new(&source))
                .map_err(|e| no_input(&source, e))?;
            std::fs::metadata(&path).map_err(|e| no_input(&source, e))?;
            let source = path.to_string_lossy().into_owned();
            // Listen before asking, so the end cannot be missed.
            let mut signals = c.daemon_signals().await?;
            c.call::<_, ()>("StageWeights", &(name.as_str(), source.as_str()))
                .await?;
            let mut bar = Progress::new();
            loop {
                let Some(Ok(msg)) = signals.next().await else {
                    bar.end();
                    return Err(format!(
                        "Gone: the daemon went away before the weights of {name} were staged; \
                         see: journalctl -u astraeusd"
                    ));
                };
                let member = msg.header().member().map(|m| m.to_string());
                match member.as_deref() {
                    Some("NameOwnerChanged") => {
                        bar.end();
                        return Err(format!(
                            "Gone: the daemon went away before the weights of {name} were \
                             staged; see: journalctl -u astraeusd"
                        ));
                    }
                    Some("WeightsProgress") if !json_out => {
                        if let Ok((t, phase, f)) = msg.body().deserialize::<(String, String, f64)>()
                        {
                            if t == name {
                                bar.show(&phase, f);
                            }
                        }
                    }
                    Some("WeightsStaged") => {
                        let (t, sum, changed, error): (String, String, bool, String) =
                            msg.body().deserialize().map_err(|e| e.to_string())?;
                        if t != name {
                            continue;
                        }
                        bar.end();
                        if !error.is_empty() {
                            // The daemon's words (a file not found is the
                            // source's, not a missing daemon's: exit 1).
                            return Err(format!(
                                "Backend: staging the weights of {name} failed: {error}"
                            ));
                        }
                        let what = if changed {
                            "staged"
                        } else {
                            "already staged (unchanged)"
                        };
                        done(format!("weights of {name} {what}: sha256 {sum}"));
                        break;
                    }
                    _ => {}
                }
            }
        }
        TemplateCommand::Remove { name } => {
            c.call::<_, ()>("RemoveTemplate", &(name.as_str(),)).await?;
            done(format!("template {name} removed"));
        }
        TemplateCommand::Resume { name, handoff } => {
            c.call::<_, ()>("Resume", &(name.as_str(), handoff)).await?;
            done(format!("resuming {name}"));
        }
        TemplateCommand::Poweroff { name, hard } => {
            c.call::<_, ()>("PowerOff", &(name.as_str(), hard)).await?;
            done(format!("powering {name} off"));
        }
    }
    Ok(())
}

/// `path` made absolute against the working directory, with `.` and `..`
/// resolved by name alone (as `realpath -s`), never through a link.
fn lexically_absolute(path: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    use std::path::Component;
    let mut out = std::path::PathBuf::new();
    for part in std::path::absolute(path)?.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::lexically_absolute;
    use std::path::Path;

    #[test]
    fn a_source_is_made_absolute_by_name_with_its_links_kept() {
        let top = tempfile::tempdir().unwrap();
        let link = top.path().join("link");
        std::os::unix::fs::symlink("/etc", &link).unwrap();
        assert_eq!(
            lexically_absolute(&link.join("x/../y/.")).unwrap(),
            link.join("y")
        );
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            lexically_absolute(Path::new("a/../b")).unwrap(),
            cwd.join("b")
        );
    }
}
