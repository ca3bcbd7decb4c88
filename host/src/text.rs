//! Text from outside (a server's, a client's, an adapter's), cut to a size before it is
//! kept, logged or shown, on a character boundary, with `…` marking the cut.

/// `text`, at most `max` bytes of it.
pub fn capped(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    format!("{}…", &text[..text.floor_char_boundary(max)])
}

/// Cuts `text` in place to at most `max` bytes of it.
pub fn cap(text: &mut String, max: usize) {
    if text.len() > max {
        text.truncate(text.floor_char_boundary(max));
        text.push('…');
    }
}

/// The message a panic (a bug) was raised with.
pub fn of_panic(payload: &(dyn std::any::Any + Send)) -> &str {
    let text = payload.downcast_ref::<&str>().copied();
    text.or_else(|| payload.downcast_ref::<String>().map(String::as_str)).unwrap_or("a panic without a message")
}

/// Text from outside as the host shows it (an adapter's in a log line, `rebound check`,
/// the status; a configuration's key names in `rebound check`'s warnings):
/// at most `max` bytes, on one line, its control characters (line breaks, terminal
/// escapes) and those that move or reorder text (Unicode's line and paragraph
/// separators, its bidirectional controls) written out, not obeyed, so that it can
/// neither forge the gateway's own lines nor drive, or disguise itself in, the terminal
/// or page of whoever reads them.
/// (Cut after the escapes are written: `\u{1b}` takes six bytes shown.)
pub fn shown(text: &str, max: usize) -> String {
    // Only the first `max` bytes can be shown (escapes only lengthen): nothing past them
    // is read, however long the text.
    let head = &text[..text.floor_char_boundary(max)];
    if !head.chars().any(obeyed) {
        return capped(text, max);
    }
    let mut shown = String::with_capacity(head.len().saturating_add(4));
    for c in head.chars() {
        if obeyed(c) {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
        if shown.len() > max {
            break;
        }
    }
    if shown.len() > max {
        cap(&mut shown, max);
    } else if head.len() < text.len() {
        shown.push('…');
    }
    shown
}

/// `json` (as `serde_json` writes it: control characters below U+0020 escaped) with every
/// other character a terminal would obey (C1 controls, bidirectional controls, line
/// separators) escaped as `\uXXXX` too: the same JSON, safe to print. Outside strings
/// JSON has only whitespace, which is left alone.
pub fn json_for_terminal(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if obeyed(c) && !c.is_ascii_whitespace() {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether a reader's terminal or page would act on `c` rather than show it: a control
/// character, a line or paragraph separator (U+2028, U+2029), or a bidirectional control
/// (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069), which reorders what follows.
fn obeyed(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_for_a_terminal_escapes_what_a_terminal_would_obey_and_stays_the_same_json() {
        let doc = serde_json::json!({"e": "a\u{9b}2J\u{202e}b\u{2028}", "n": [1]});
        let text = json_for_terminal(&serde_json::to_string_pretty(&doc).unwrap());
        assert!(!text.chars().any(|c| obeyed(c) && c != '\n'), "{text:?}");
        assert!(text.contains(r"a\u009b2J\u202eb\u2028"), "{text}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap(), doc);
    }

    #[test]
    fn text_is_cut_on_a_character_boundary_and_marked() {
        assert_eq!(capped("short", 5), "short");
        assert_eq!(capped("ééé", 3), "é…", "not inside the second é");
        assert_eq!(capped("héllo", 2), "h…");
        let mut text = "abcdef".to_owned();
        cap(&mut text, 4);
        assert_eq!(text, "abcd…");
    }

    #[test]
    fn text_from_outside_is_shown_on_one_line_and_obeys_no_terminal() {
        assert_eq!(shown("plain", 100), "plain");
        assert_eq!(shown("a\nERROR forged\x1b]0;title\x07", 100), "a\\nERROR forged\\u{1b}]0;title\\u{7}");
        assert_eq!(shown(&"x".repeat(10), 4), "xxxx…");
        // What moves or reorders text is written out too: a forged line after a Unicode
        // separator, a name reversed by a bidirectional override.
        assert_eq!(shown("a\u{2028}ERROR forged", 100), "a\\u{2028}ERROR forged");
        assert_eq!(shown("ok \u{202e}gnp.exe", 100), "ok \\u{202e}gnp.exe");
        assert_eq!(shown("\u{2067}x\u{2069}", 100), "\\u{2067}x\\u{2069}");
        assert_eq!(shown("café — ünïcode", 100), "café — ünïcode", "the rest as it is");
    }
}
