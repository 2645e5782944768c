//! Text from elsewhere (plugins, images, drivers) made safe to print: control characters are
//! escaped, so a name with a newline or a terminal escape cannot forge or hide output lines.

use std::borrow::Cow;

/// `s` with every control character written as an escape (`\n`, `\u{1b}`).
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// At most `max` bytes of `s`, cut at a character boundary, with `…` when something was cut.
pub fn bounded(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    Cow::Owned(format!("{}…", &s[..char_floor(s, max)]))
}

/// The largest character boundary of `s` at or below `max` (`s.len()` if it is shorter).
pub fn char_floor(s: &str, max: usize) -> usize {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    end
}

/// A size for people: `512 B`, `1.5 KiB`, `80.0 GiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_long_text_is_cut() {
        assert_eq!(printable("host"), "host");
        assert_eq!(printable("a\nnote: forged"), "a\\nnote: forged");
        assert_eq!(printable("\u{1b}[2J"), "\\u{1b}[2J");
        assert_eq!(bounded("héllo", 2), "h…");
        assert_eq!(bounded("abc", 3), "abc");
    }
}
