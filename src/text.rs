//! PURE: text that came from outside (another user's process name, a name
//! service) made safe to show: control characters (terminal escapes, bells,
//! newlines that would forge a journal or table line) never reach a reason,
//! the journal, a terminal or the page.

/// `text` for a terminal: every control character but line breaks and
/// tabs replaced by `?` (what a program prints line by line).
pub fn printable_lines(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                '?'
            } else {
                c
            }
        })
        .collect()
}

/// `text` with every control character replaced by `?`.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
