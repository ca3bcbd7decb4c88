//! What JSON text costs once read: its bytes, and about [`PER_VALUE`] for each value in
//! it. A body of 4 MiB of `0,0,0…` is about 2 million values, hundreds of MiB once read,
//! where 4 MiB of text in one string is about 4 MiB. Weighed in one pass over the bytes,
//! without reading them: by the HTTP front before it reads a request
//! (`gateway::http::parsed`), and before an adapter is shown a call
//! (`plugins::adapter`), whose memory is small.

/// About what one JSON value costs once read, with the copy a call keeps.
pub const PER_VALUE: usize = 128;

/// The estimated cost of reading `text` as JSON: its bytes, and [`PER_VALUE`] for each
/// value in it, counted without reading it (each `[`, `{` and `,` outside a string
/// starts one more value). Text that is not JSON weighs as much as the JSON it resembles.
pub fn json(text: &[u8]) -> usize {
    let mut weigher = Weigher::default();
    weigher.feed(text);
    weigher.weight()
}

/// What `value` weighs written out as JSON ([`json`]): weighed as it is written, never
/// written whole.
pub fn of<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    let mut weigher = Weigher::default();
    let _ = serde_json::to_writer(&mut weigher, value);
    weigher.weight()
}

/// [`json`] over text that comes in pieces (as a serializer writes it): fed piece by
/// piece, it weighs as the whole would.
#[derive(Debug, Default)]
pub struct Weigher {
    bytes: usize,
    /// Values begun after the first.
    more: usize,
    in_string: bool,
    escaped: bool,
}

impl Weigher {
    /// Weighs the next piece of the text.
    pub fn feed(&mut self, text: &[u8]) {
        self.bytes = self.bytes.saturating_add(text.len());
        for &b in text {
            match (self.in_string, b) {
                (true, _) if self.escaped => self.escaped = false,
                (true, b'\\') => self.escaped = true,
                (true, b'"') => self.in_string = false,
                (true, _) => {}
                (false, b'"') => self.in_string = true,
                (false, b'[' | b'{' | b',') => self.more += 1,
                (false, _) => {}
            }
        }
    }

    /// What the text fed so far weighs.
    pub fn weight(&self) -> usize {
        self.bytes.saturating_add(self.more.saturating_add(1).saturating_mul(PER_VALUE))
    }
}

/// A serializer's sink: what it writes is fed, and kept nowhere.
impl std::io::Write for Weigher {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.feed(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Text weighed in pieces weighs as the whole does, wherever it is cut (inside a
        /// string, between a backslash and what it escapes).
        #[test]
        fn text_in_pieces_weighs_as_the_whole(text in r#"[\[\]{},:"\\a0 ]{0,64}"#, cuts in proptest::collection::vec(0usize..64, 0..4)) {
            let bytes = text.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort_unstable();
            let mut weigher = Weigher::default();
            let mut from = 0;
            for cut in cuts.into_iter().chain([bytes.len()]) {
                weigher.feed(&bytes[from..cut]);
                from = cut;
            }
            proptest::prop_assert_eq!(weigher.weight(), json(bytes));
        }
    }

    #[test]
    fn values_weigh_outside_strings_only() {
        assert_eq!(json(b"[0,0,0]"), 7 + 4 * PER_VALUE);
        assert_eq!(json(br#""[0,\"0,0]""#), 11 + PER_VALUE);
    }
}
