//! Writes the man pages (astraeusd.8, astraeusctl.1, node.toml.5) and the bash, zsh and
//! fish completions into DIR, from the same clap definitions the binaries
//! use. The packaging script runs it: `cargo run --example gen-docs -- DIR`.

use astraeusd::cli::{CtlArgs, DaemonArgs};
use clap::CommandFactory;
use clap_complete::Shell;
use std::path::PathBuf;

mod man;

/// The sections clap does not write: exit status, files, examples, see also.
const CTL_TAIL: &str = r#".PP
Memory is in GB as the seed writes it: 1 GB is 2\(ha30 bytes (a GiB;
\fBnvidia\-smi\fR's MiB are 1/1024 of it). Energy is in kWh in tables and
in mJ in JSON and CSV; instants in JSON are epoch milliseconds.
.PP
Lists print a header and a count line, as systemd's tools do; \fB\-\-no\-legend\fR
prints the rows alone. Times are shown in the caller's zone (\fBTZ\fR), named;
\fB\-\-since\fR, \fB\-\-until\fR, \fB\-\-from\fR and \fB\-\-to\fR take \fB1h\fR,
\fB30min\fR, \fB2d\fR (that long ago), \fBtoday\fR, \fByesterday\fR, \fBnow\fR,
a date or date-time in that zone, or epoch seconds, as \fBjournalctl\fR(1) reads them.
.PP
With \fB\-\-json\fR an error is printed as JSON on standard error:
{"error": KIND, "message": TEXT, "exit_code": N}.
.SH FILES
.TP
/usr/share/dbus-1/interfaces/org.astraeus.Node1.xml
the D-Bus interface astraeusctl speaks.
.SH EXAMPLES
.nf
echo '{"name":"listen","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":2.2}}}' \e
    | astraeusctl submit -
astraeusctl workers
astraeusctl status listen
astraeusctl show listen \-p State \-\-value
astraeusctl history \-\-since yesterday
astraeusctl \-\-json events          # follow, one JSON object a line
astraeusctl why spec.json
astraeusctl schedule set research \-\-weekly mon,wed,fri \-\-from 09:00 \-\-to 17:00
astraeusctl \-\-json gpus
.fi
.SH "SEE ALSO"
\fBastraeusd\fR(8), \fBnode.toml\fR(5), \fBbusctl\fR(1), \fBsystemctl\fR(1), \fBjournalctl\fR(1),
\fBpodman\fR(1), \fBvirsh\fR(1)
"#;

const DAEMON_TAIL: &str = r#".SH "EXIT STATUS"
0 after SIGTERM or SIGINT (the ledger closed cleanly); 1 when it cannot start
(the message says why: the bus, NVML, the configuration, the ledger).
.SH FILES
.TP
/etc/astraeus/node.toml
the configuration (\fBnode.toml\fR(5)).
.TP
/var/lib/astraeus/ledger.db
the ledger (SQLite; placements, history, usage, schedules).
.TP
/usr/share/dbus-1/system.d/org.astraeus.Node1.conf
the bus policy: who may call what.
.TP
/usr/libexec/astraeusd/astraeus\-libvirt
the helper that does every libvirt call, started at the first VM worker or
template; the only program of the package that links libvirt, so libvirt
(libvirt0, libvirt\-libs) need be installed only where VMs run.
.SH EXAMPLES
.nf
astraeusd \-\-session \-\-sim          # try it without a GPU
systemctl reload astraeusd             # re\-read node.toml and the GPUs
journalctl \-x \-u astraeusd
.fi
.SH "SEE ALSO"
\fBastraeusctl\fR(1), \fBnode.toml\fR(5), \fBsystemctl\fR(1), \fBjournalctl\fR(1),
\fBbusctl\fR(1), \fBpodman\fR(1), \fBvirsh\fR(1)
"#;

fn main() -> std::io::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("--config-markdown") {
        print!(
            "{}",
            astraeusd::config_doc::markdown(astraeusd::config_doc::EXAMPLE)
        );
        return Ok(());
    }
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "target/docs".into()),
    );
    std::fs::create_dir_all(dir.join("man"))?;
    std::fs::create_dir_all(dir.join("completions"))?;
    for (cmd, section) in [(DaemonArgs::command(), "8"), (CtlArgs::command(), "1")] {
        let name = cmd.get_name().to_string();
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd.clone())
            .section(section)
            .render(&mut out)?;
        let mut text = String::from_utf8(out).expect("roff is UTF-8");
        if section == "1" {
            // astraeusctl(1), and one page per subcommand (astraeusctl-gpus(1),
            // astraeusctl-schedule-set(1)…), which the main page refers to.
            text.push_str(man::EXIT_STATUS);
            text.push_str(CTL_TAIL);
            let mut built = cmd.clone().disable_help_subcommand(true);
            built.build();
            for (file, page) in man::subcommand_pages(&built, env!("CARGO_PKG_VERSION")) {
                std::fs::write(dir.join("man").join(file), page)?;
            }
        } else {
            text.push_str(DAEMON_TAIL);
        }
        std::fs::write(dir.join("man").join(format!("{name}.{section}")), text)?;
        // astraeusctl's ask the binary itself, which asks the daemon for
        // names (COMPLETE=bash astraeusctl): scripts/package writes them.
        if section == "1" {
            continue;
        }
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut cmd = cmd.clone();
            clap_complete::generate_to(shell, &mut cmd, &name, dir.join("completions"))?;
        }
    }
    // node.toml(5), from the example config that ships (docs/operations.md
    // holds the same reference as a table: `gen-docs --config-markdown`).
    std::fs::write(
        dir.join("man").join("node.toml.5"),
        astraeusd::config_doc::man(astraeusd::config_doc::EXAMPLE, env!("CARGO_PKG_VERSION")),
    )?;
    println!("wrote man pages and completions to {}", dir.display());
    Ok(())
}
