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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_on_a_character_boundary_and_marked() {
        assert_eq!(capped("short", 5), "short");
        assert_eq!(capped("ééé", 3), "é…", "not inside the second é");
        assert_eq!(capped("héllo", 2), "h…");
        let mut text = "abcdef".to_owned();
        cap(&mut text, 4);
        assert_eq!(text, "abcd…");
    }
}
