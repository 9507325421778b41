//! Text from a server or participant made safe to print on an operator's terminal.
//!
//! A participant's `last_error`, a saga's `reason` or a refusal's `message` is whatever a peer
//! sent; printed raw, an escape sequence in it could move the cursor, rewrite earlier lines,
//! set the window title, or (bidi overrides) make text read other than it is. Every C0 and C1
//! control, DEL, and the bidi controls (U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069)
//! are shown as `\u{..}` instead.

use std::borrow::Cow;

/// Whether `c` must not reach a terminal as it is.
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every unsafe character escaped, newlines and tabs included: for one field
/// (a peer's string must not start a line of its own that looks like ctl's).
pub fn printable(text: &str) -> Cow<'_, str> {
    escape(text, |_| false)
}

/// As [`printable`] but keeping newlines: for a whole block of output that ctl laid out.
pub fn printable_lines(text: &str) -> Cow<'_, str> {
    escape(text, |c| c == '\n')
}

/// JSON text (`serde_json`'s, which leaves DEL, C1 and bidi controls raw) with those written
/// as JSON escapes: the same document, safe to print.
pub fn printable_json(json: &str) -> Cow<'_, str> {
    if !json.chars().any(is_unsafe) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if is_unsafe(c) {
            // Every unsafe character is in the Basic Multilingual Plane: one \uXXXX each.
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn escape(text: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(|c| is_unsafe(c) && !keep(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_unsafe(c) && !keep(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_are_escaped_and_the_rest_is_kept() {
        assert!(matches!(
            printable("prepare refused: é ok"),
            Cow::Borrowed(_)
        ));
        assert_eq!(printable("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(printable("bell\u{7}"), "bell\\u{7}");
        assert_eq!(printable("del\u{7f}"), "del\\u{7f}");
        assert_eq!(printable("csi\u{9b}31m"), "csi\\u{9b}31m");
        assert_eq!(printable("x\u{202E}gnp.exe"), "x\\u{202e}gnp.exe");
        for c in ['\u{200E}', '\u{200F}', '\u{202A}', '\u{2066}', '\u{2069}'] {
            assert!(!printable(&format!("a{c}b")).contains(c), "{c:?}");
        }
        assert_eq!(printable("line\nforged"), "line\\u{a}forged");
        assert_eq!(printable_lines("one\ntwo\r\u{1b}"), "one\ntwo\\u{d}\\u{1b}");
    }

    #[test]
    fn json_stays_json() {
        let value = serde_json::json!({"reason": "x\u{1b}\u{9b}\u{7f}\u{202E}y"});
        let text = value.to_string();
        let safe = printable_json(&text);
        assert!(!safe.chars().any(is_unsafe), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, value);
    }
}
