//! PURE: text that came from outside (another user's process name, a name
//! service) made safe to show: control characters (terminal escapes, bells,
//! newlines that would forge a journal or table line) never reach a reason,
//! the journal, a terminal or the page.

/// Whether `c` must not be shown as it is: a control character (C0, C1),
/// or one that changes how the text around it reads without being seen:
/// the bidirectional marks, embeddings, overrides and isolates (U+202E
/// turns the rest of a line around: "evil\u{202e}txt.exe"), and the line
/// and paragraph separators some terminals and viewers break lines at;
/// and the invisible ones that make one name look like another ("Xorg"
/// and "Xorg\u{200b}"): zero-width spaces and joiners, word joiner and
/// invisible operators, the byte-order mark, soft hyphen, tag characters.
pub fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00ad}'
                | '\u{061c}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{feff}'
                | '\u{e0000}'..='\u{e007f}'
        )
}

/// `text` for a terminal: every [`hidden`] character but line breaks and
/// tabs replaced by `?` (what a program prints line by line).
pub fn printable_lines(text: &str) -> String {
    text.chars()
        .map(|c| {
            if hidden(c) && c != '\n' && c != '\t' {
                '?'
            } else {
                c
            }
        })
        .collect()
}

/// `text` with every [`hidden`] character replaced by `?`.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if hidden(c) { '?' } else { c })
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

#[cfg(test)]
mod tests {
    use super::*;

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
        // Right-to-left text itself is text.
        assert_eq!(printable("שלום مرحبا"), "שלום مرحبا");
    }
}
