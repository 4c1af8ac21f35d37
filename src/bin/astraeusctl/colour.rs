//! Colour for a person at a terminal: which words, in which colours, and
//! when at all (`--color`, NO_COLOR, CLICOLOR_FORCE, TERM).

/// Sets, once at start, whether stdout takes colour: `--color=always` or
/// `never` as asked; else anstream's rule (a terminal, unless NO_COLOR is
/// set, https://no-color.org; CLICOLOR_FORCE forces it), except that a dumb
/// or unset TERM takes none — anstream colours any terminal when `CI` is
/// set, and CI's dumb terminals then got escapes.
pub fn choose(flag: &str) {
    anstream::ColorChoice::write_global(match flag {
        "always" => anstream::ColorChoice::Always,
        "never" => anstream::ColorChoice::Never,
        _ if std::env::var_os("TERM").is_none_or(|t| t == "dumb") && !forced() => {
            anstream::ColorChoice::Never
        }
        _ => anstream::ColorChoice::Auto,
    });
}

/// CLICOLOR_FORCE set to anything but empty or "0" (https://bixense.com/clicolors).
fn forced() -> bool {
    std::env::var_os("CLICOLOR_FORCE").is_some_and(|v| !v.is_empty() && v != "0")
}

/// A word coloured when stdout takes colour ([`choose`]). The word is made
/// printable first; the only escapes printed are these.
pub fn paint(word: &str, sgr: &str) -> String {
    let word = astraeusd::text::printable(word);
    if anstream::AutoStream::choice(&std::io::stdout()) == anstream::ColorChoice::Never {
        return word;
    }
    format!("\x1b[{sgr}m{word}\x1b[0m")
}

/// The colour of a GPU's mode: red when it needs attention.
pub fn mode_colour(mode: &str) -> &'static str {
    match mode {
        "free" => "32",        // green
        "shared" => "36",      // cyan
        "whole" => "34",       // blue
        "unhealthy" => "1;31", // bold red
        _ => "35",             // time-sliced, mig: magenta (not offered)
    }
}
