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
    let (mut values, mut in_string, mut escaped) = (1usize, false, false);
    for &b in text {
        match (in_string, b) {
            (true, _) if escaped => escaped = false,
            (true, b'\\') => escaped = true,
            (true, b'"') => in_string = false,
            (true, _) => {}
            (false, b'"') => in_string = true,
            (false, b'[' | b'{' | b',') => values += 1,
            (false, _) => {}
        }
    }
    text.len().saturating_add(values.saturating_mul(PER_VALUE))
}
