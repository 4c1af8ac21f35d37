//! The subcommands' man pages (astraeusctl-gpus(1), astraeusctl-schedule-set(1)…),
//! each one standing alone: the argument each option takes in its SYNOPSIS,
//! the version in its footer, its EXIT STATUS and EXAMPLES. tests/man.rs
//! renders them with man(1).

use clap::Command;

/// astraeusctl's exit status, on every page of it.
pub const EXIT_STATUS: &str = r#".SH "EXIT STATUS"
.TP
0
success
.TP
1
another failure (the message says which), and \fBLaunchFailed\fR: \fBsubmit\fR
waited for a launch that failed (the message says how)
.TP
2
a usage error (an option or argument that does not parse)
.TP
3
\fBInvalidRequest\fR: the request names a field that is wrong, and what is accepted;
\fBNotRunning\fR: \fBstatus\fR of a worker that ended within the hour (told as
it ended, as systemctl status tells a unit that is not running)
.TP
4
\fBNotFound\fR: no such worker, GPU, template or schedule
.TP
5
\fBAccessDenied\fR: not the caller's to do
.TP
6
\fBExists\fR, \fBConflict\fR, \fBBusy\fR or \fBQuotaExceeded\fR: refused as things stand now
.TP
7
\fBUnsatisfiable\fR: it could never be placed on this machine
.TP
66
\fBNoInput\fR: a file named on the command line (a request, a schedule, the
weights' directory) cannot be read; the message names it
.TP
69
the daemon is not running, the bus could not start it (\fBStartFailed\fR, with the
bus's reason), the bus cannot be reached (\fBNoBus\fR, naming the bus tried, and what to check), or
the daemon did not answer within \fB\-\-timeout\fR (\fBNoReply\fR);
\fBevents\fR ends with it when the daemon goes away (\fBGone\fR)
"#;

/// Each subcommand's examples, by its page's name: (command line, what it does).
pub const EXAMPLES: &[(&str, &[(&str, &str)])] = &[
    ("gpus", &[("astraeusctl gpus", "the GPUs, what each offers and how it is used"), ("astraeusctl --json gpus", "the same as data")]),
    ("workers", &[("astraeusctl workers", "live workers, and why each waiting one waits"), ("astraeusctl --no-legend workers | wc -l", "how many")]),
    ("history", &[("astraeusctl history --since yesterday", "workers that ended since yesterday"), ("astraeusctl history --since @1767225600 --json", "since an epoch second, as data")]),
    ("events", &[("astraeusctl events", "follow what happens until Ctrl-C"), ("astraeusctl --json events | jq .", "one JSON object a line")]),
    ("status", &[("astraeusctl status listen", "the worker listen whole, for a person")]),
    ("show", &[("astraeusctl show listen", "its properties, KEY=VALUE a line each"), ("astraeusctl show listen -p State --value", "its state alone, for a script")]),
    ("sharers", &[("astraeusctl sharers 0", "who shares GPU 0, and how much each takes")]),
    ("submit", &[("astraeusctl submit listen.json", "submit the worker that listen.json describes"), ("echo '{\"name\":\"listen\",\"requested_resources\":{\"gpu_requests\":{\"shared\":true,\"memory_gb\":2.2}}}' | astraeusctl submit -", "the same from standard input"), ("astraeusctl submit --no-block job.json", "return once the daemon took it, without waiting for its container to start")]),
    ("stop", &[("astraeusctl stop listen", "stop one worker"), ("astraeusctl stop listen voice", "stop two; the exit status is the worse of theirs"), ("astraeusctl stop --no-block listen", "return once the stop is acknowledged, before the workload has ended")]),
    ("why", &[("astraeusctl why big.json", "where big.json would go now, or why it would wait")]),
    ("schedule", &[("astraeusctl schedule show research", "the template research's schedule in words")]),
    ("schedule-set", &[("astraeusctl schedule set research --weekly mon,wed,fri --from 09:00 --to 17:00", "slices on Monday, Wednesday and Friday"), ("astraeusctl schedule set customer customer.one --dry-run", "check OpenNebula's SCHED_ACTION text, and list the next slices"), ("echo '[]' | astraeusctl schedule set research -", "remove the schedule")]),
    ("schedule-show", &[("astraeusctl schedule show research", "in words, times in the daemon's zone"), ("astraeusctl --json schedule show research", "as stored, SCHED_ACTION JSON")]),
    ("template", &[("astraeusctl template list", "every template, its user, VM and state")]),
    ("template-create", &[("astraeusctl template create research.json", "define the template research.json describes")]),
    ("template-list", &[("astraeusctl template list", "every template, its user, VM and state")]),
    ("template-remove", &[("astraeusctl template remove research", "remove a template whose VM is off")]),
    ("template-stage", &[("astraeusctl template stage research /srv/weights", "build research's read-only weights disk from a directory")]),
    ("template-resume", &[("astraeusctl template resume research", "boot research's VM now"), ("astraeusctl template resume customer --handoff", "take the baseboard over from the template that holds it")]),
    ("template-poweroff", &[("astraeusctl template poweroff research", "power research's VM off (ACPI, forced after the timeout)")]),
    ("slices", &[("astraeusctl slices --next 10", "the next ten slices, however far away"), ("astraeusctl slices --report --from -7d --to today", "the slices of the last week, with the GPUs' figures")]),
    ("notify", &[("systemctl --user enable --now astraeus-notify", "run it as the package's user unit does"), ("astraeusctl notify --session", "follow only the session's daemon")]),
    ("page", &[("astraeusctl page", "open the machine page in the browser"), ("astraeusctl page --print", "print its address")]),
    ("claim-hook", &[("astraeusctl claim-hook 0b5e0000-1111-2222-3333-444444444444", "what a claim's CDI spec has the runtime run as its container is created, the OCI state on standard input")]),
    ("usage", &[("astraeusctl usage --since 30d --by owner", "GPU-hours and energy by owner over 30 days"), ("astraeusctl usage --since 2026-11-01 --until 2026-12-01 --csv", "November as CSV")]),
];

/// `-` as roff writes it.
fn roff(text: &str) -> String {
    text.replace('\\', "\\e").replace('-', "\\-")
}

/// A SYNOPSIS that names the value each option takes.
fn synopsis(cmd: &Command) -> String {
    let bin = cmd.get_bin_name().unwrap_or(cmd.get_name());
    let mut line = format!("\\fB{}\\fR", roff(bin));
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        let value = arg
            .get_value_names()
            .and_then(|v| v.first())
            .map(|v| v.to_string())
            .unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
        let many = arg.get_num_args().is_some_and(|n| n.max_values() > 1);
        if arg.is_positional() {
            let dots = if many { "..." } else { "" };
            line += &if arg.is_required_set() {
                format!(" <\\fI{value}\\fR>{dots}")
            } else {
                format!(" [\\fI{value}\\fR]{dots}")
            };
            continue;
        }
        let mut names = Vec::new();
        if let Some(s) = arg.get_short() {
            names.push(format!("\\fB\\-{s}\\fR"));
        }
        if let Some(l) = arg.get_long() {
            names.push(format!("\\fB\\-\\-{}\\fR", roff(l)));
        }
        let takes = arg.get_action().takes_values();
        let value = if takes {
            format!(" \\fI{}\\fR", roff(&value))
        } else {
            String::new()
        };
        line += &format!(" [{}{value}]", names.join("|"));
    }
    if cmd.has_subcommands() {
        line += " <\\fISUBCOMMAND\\fR>";
    }
    line
}

/// Every subcommand's page under `root` (built), as (file name, roff).
pub fn subcommand_pages(root: &Command, version: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut todo: Vec<(String, &Command)> = root
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| (c.get_name().to_string(), c))
        .collect();
    while let Some((path, cmd)) = todo.pop() {
        for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
            todo.push((format!("{path}-{}", sub.get_name()), sub));
        }
        let title = format!("astraeusctl-{path}");
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd.clone())
            .title(&title)
            .section("1")
            .source(format!("astraeusctl {version}"))
            .render(&mut page)
            .expect("render to memory");
        let page = String::from_utf8(page).expect("roff is UTF-8");
        let mut lines: Vec<String> = page.lines().map(str::to_string).collect();
        if let Some(i) = lines.iter().position(|l| l == ".SH SYNOPSIS") {
            // Not hyphenated: an option cut at a line's end reads as two.
            lines[i + 1] = format!(".nh\n{}\n.hy", synopsis(cmd));
        }
        let mut text = lines.join("\n") + "\n";
        text += EXIT_STATUS;
        text += ".SH EXAMPLES\n";
        for (line, what) in EXAMPLES
            .iter()
            .find(|(p, _)| *p == path)
            .map(|(_, e)| *e)
            .unwrap_or_default()
        {
            text += &format!(".TP\n\\fB{}\\fR\n{}\n", roff(line), roff(what));
        }
        text += ".SH \"SEE ALSO\"\n\\fBastraeusctl\\fR(1), \\fBastraeusd\\fR(8), \\fBnode.toml\\fR(5)\n";
        out.push((format!("{title}.1"), text));
    }
    out
}
