//! PURE: text that came from outside (another user's process name, a name
//! service) made safe to show: control characters (terminal escapes, bells,
//! newlines that would forge a journal or table line) never reach a reason,
//! the journal, a terminal or the page.

/// Whether `c` may not be in a name or path a request gives: a control
/// character (C0, C1), or one that changes how the text around it reads
/// without being seen: the bidirectional marks, embeddings, overrides and
/// isolates (U+202E turns the rest of a line around: "evil\u{202e}txt.exe"),
/// and the line and paragraph separators some terminals and viewers break
/// lines at. Kept as it is: stored requests are checked by it again at
/// every start, so a wider set would refuse a ledger an older build wrote.
pub fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// Whether `c` is not shown as it is: [`hidden`], and the invisible
/// characters that make one name look like another ("Xorg" and
/// "Xorg\u{200b}"): zero-width spaces and joiners, word joiner and
/// invisible operators, the byte-order mark, soft hyphen, tag characters.
/// (The joiners are part of some scripts' words and of emoji: those show
/// a `?` where they were, in a name from outside.)
pub fn unseen(c: char) -> bool {
    hidden(c)
        || matches!(
            c,
            '\u{00ad}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200d}'
                | '\u{2060}'..='\u{2064}'
                | '\u{feff}'
                | '\u{e0000}'..='\u{e007f}'
        )
}

/// `text` for a terminal: every [`unseen`] character but line breaks and
/// tabs replaced by `?` (what a program prints line by line).
pub fn printable_lines(text: &str) -> String {
    text.chars()
        .map(|c| {
            if unseen(c) && c != '\n' && c != '\t' {
                '?'
            } else {
                c
            }
        })
        .collect()
}

/// `text` with every [`unseen`] character replaced by `?`.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if unseen(c) { '?' } else { c })
        .collect()
}

/// `text` cut to at most `max` characters, the last of them "…" when cut.
pub fn clipped(text: &str, max: usize) -> String {
    if text.chars().nth(max).is_none() {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Whether the locale the environment names takes UTF-8: the first of
/// LC_ALL, LC_CTYPE and LANG that is set and not empty decides (as
/// setlocale does); none set is taken as UTF-8, what every desktop and
/// systemd service has, rather than POSIX's "C".
pub fn utf8_locale(lc_all: Option<&str>, lc_ctype: Option<&str>, lang: Option<&str>) -> bool {
    let Some(name) = [lc_all, lc_ctype, lang]
        .into_iter()
        .flatten()
        .find(|v| !v.is_empty())
    else {
        return true;
    };
    let charset = name
        .split_once('.')
        .map(|(_, rest)| rest.split('@').next().unwrap_or(""))
        .unwrap_or("");
    charset.eq_ignore_ascii_case("UTF-8") || charset.eq_ignore_ascii_case("utf8")
}

/// `text` for a terminal whose locale is not UTF-8 (`LC_ALL=C`): the
/// symbols astraeusctl prints in their ASCII forms, anything else beyond
/// ASCII as `?`.
pub fn ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            c if c.is_ascii() => out.push(c),
            '·' | '—' | '–' | '−' => out.push('-'),
            '…' => out.push_str("..."),
            '×' => out.push('x'),
            '→' => out.push_str("->"),
            '≤' => out.push_str("<="),
            '≥' => out.push_str(">="),
            '“' | '”' => out.push('"'),
            '‘' | '’' => out.push('\''),
            '✓' => out.push('+'),
            _ => out.push('?'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_locale_decides_utf8_as_setlocale_would() {
        let u = |a: Option<&str>, c: Option<&str>, l: Option<&str>| utf8_locale(a, c, l);
        assert!(u(None, None, Some("C.UTF-8")));
        assert!(u(None, None, Some("en_GB.utf8")));
        assert!(u(None, None, Some("de_DE.UTF-8@euro")));
        assert!(!u(Some("C"), None, Some("C.UTF-8")), "LC_ALL first");
        assert!(!u(None, Some("POSIX"), Some("C.UTF-8")), "then LC_CTYPE");
        assert!(u(Some(""), None, Some("C.UTF-8")), "an empty one is unset");
        assert!(!u(None, None, Some("en_US.ISO-8859-1")));
        assert!(!u(None, None, Some("en_US")));
        assert!(u(None, None, None), "none set: taken as UTF-8");
    }

    #[test]
    fn ascii_keeps_what_it_can_say() {
        assert_eq!(ascii("1 · shared 2.2 GB"), "1 - shared 2.2 GB");
        assert_eq!(ascii("— unknown…"), "- unknown...");
        assert_eq!(ascii("Zürich ✓"), "Z?rich +");
        assert_eq!(ascii("plain"), "plain");
    }

    #[test]
    fn clipped_keeps_at_most_max_characters() {
        assert_eq!(clipped("abc", 3), "abc");
        assert_eq!(clipped("abcd", 3), "ab…");
        assert_eq!(clipped("ééééé", 4), "ééé…");
        assert_eq!(clipped("", 0), "");
    }

    #[test]
    fn control_characters_never_pass() {
        assert_eq!(printable("Xorg"), "Xorg");
        assert_eq!(printable("\u{1b}]0;owned\u{7}\u{1b}[2J"), "?]0;owned??[2J");
        assert_eq!(printable("a\nb\rc\u{9b}d"), "a?b?c?d", "C1 controls too");
        assert_eq!(printable("Zürich ✓"), "Zürich ✓");
        assert_eq!(
            printable_lines("a\tb\nc\u{1b}[2J\u{9b}0m"),
            "a\tb\nc?[2J?0m"
        );
        // Marks that turn text around or break it where nothing shows.
        assert_eq!(
            printable("x\u{202e}txt.exe \u{2066}a\u{2069} \u{200f}\u{061c}b\u{2028}c\u{2029}"),
            "x?txt.exe ?a? ??b?c?"
        );
        assert_eq!(printable_lines("a\u{202e}\nb\u{202d}"), "a?\nb?");
        // Invisible characters that make one name look like another.
        assert_eq!(
            printable("Xorg\u{200b}|a\u{200d}b|\u{feff}c|d\u{2060}|so\u{ad}ft|t\u{e0041}"),
            "Xorg?|a?b|?c|d?|so?ft|t?"
        );
        // What a request may hold is not widened with what is shown: a
        // ledger written before is read again at every start.
        assert!(!hidden('\u{200b}') && unseen('\u{200b}'));
        // Right-to-left text itself is text.
        assert_eq!(printable("שלום مرحبا"), "שלום مرحبا");
    }
}
