//! What astraeusctl writes for a person: a line at a time (quiet when the
//! reader has gone), in the locale's characters, and staging's progress.

/// One line to stdout; when the reader has gone (`| head`), the rest would
/// go nowhere: stop quietly, as systemd's tools do, instead of panicking.
pub fn out_line(line: &str) {
    use std::io::Write;
    if writeln!(std::io::stdout(), "{}", for_locale(line)).is_err() {
        std::process::exit(0);
    }
}

/// Set at start: the locale is not UTF-8 and the output is for a person
/// (JSON stays UTF-8, as JSON is).
static ASCII_ONLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A line as this terminal's locale can show it.
pub fn for_locale(line: &str) -> std::borrow::Cow<'_, str> {
    if ASCII_ONLY.load(std::sync::atomic::Ordering::Relaxed) {
        astraeusd::text::ascii(line).into()
    } else {
        line.into()
    }
}

/// Staging progress: a bar redrawn in place on a terminal, a line per
/// report otherwise (a log, a pipe).
pub struct Progress {
    tty: bool,
    drawn: bool,
}

impl Progress {
    pub fn new() -> Progress {
        use std::io::IsTerminal;
        Progress {
            tty: std::io::stderr().is_terminal(),
            drawn: false,
        }
    }

    pub fn show(&mut self, phase: &str, fraction: f64) {
        let f = fraction.clamp(0.0, 1.0);
        let phase = astraeusd::text::printable(phase);
        if !self.tty {
            errln!("{phase}: {:.0}%", f * 100.0);
            return;
        }
        const WIDTH: usize = 30;
        let filled = (f * WIDTH as f64).round() as usize;
        eprint!(
            "\r{phase:<9} [{}{}] {:>3.0}%",
            "#".repeat(filled),
            " ".repeat(WIDTH - filled),
            f * 100.0
        );
        self.drawn = true;
    }

    /// Ends the bar's line, so what follows starts on its own.
    pub fn end(&mut self) {
        if self.drawn {
            eprintln!();
            self.drawn = false;
        }
    }
}

/// Sets, once at start, whether a person's output is ASCII: where the
/// locale is not UTF-8 (JSON stays UTF-8, as JSON is).
pub fn choose_locale(json: bool) {
    let var = |name: &str| std::env::var(name).ok();
    let utf8 = astraeusd::text::utf8_locale(
        var("LC_ALL").as_deref(),
        var("LC_CTYPE").as_deref(),
        var("LANG").as_deref(),
    );
    ASCII_ONLY.store(!utf8 && !json, std::sync::atomic::Ordering::Relaxed);
}
