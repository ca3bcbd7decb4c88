//! The `id` of a JSON-RPC message too long to read, found as its bytes go by without
//! keeping them: a message past the size bound is skipped, and its answer (a refusal to
//! the client, an error for the request a server's oversized answer was for) names the
//! request it concerns, so that nobody waits for an answer that will never come.
//!
//! Only the top-level object's `"id"` is read, and only a number or a string of at most
//! [`MAX_ID_BYTES`]; anything else (a batch, an id past the bound, broken JSON) has none.
//! Whether the object has a `"method"` tells a request from an answer.

use serde_json::Value;

/// The longest id text kept, quotes and escapes included.
const MAX_ID_BYTES: usize = 1024;

/// The longest key text kept (its opening quote aside): `"method"` with every letter
/// written as a `\uXXXX` escape. A longer key is neither `id` nor `method`.
const MAX_KEY_BYTES: usize = 6 * 6;

/// Where the scan is, outside the id's value.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
enum At {
    /// Before the object opens, or inside a nested value.
    #[default]
    Elsewhere,
    /// At the top level, where the next string is a key.
    Key,
    /// At the top level, after a key that was `"id"`, before or at its `:`.
    IdKey,
    /// At the top level, after `"id":`: the next value is the id.
    IdValue,
}

/// What a scan found at the top level of a message.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scanned {
    /// Its `"id"`, a number or a string.
    pub id: Option<Value>,
    /// Whether it has a `"method"`: a request (or, with no id, a notification).
    pub has_method: bool,
}

impl Scanned {
    /// `Some` when the message is an answer (an id and no method), with the request it
    /// answers: the other side's request that it fails, unread (`None` for an id no
    /// request can have, a fraction, say). Anything else with an id is a request of the
    /// sender's, to refuse.
    pub fn answers(&self) -> Option<Option<rmcp::model::RequestId>> {
        let id = self.id.clone().filter(|_| !self.has_method)?;
        Some(serde_json::from_value(id).ok())
    }
}

/// A JSON text fed in pieces, read for its top-level `"id"`.
#[derive(Debug, Default)]
pub struct IdScan {
    depth: u32,
    at: At,
    in_string: bool,
    escaped: bool,
    /// The top-level key being read, as written (escapes undone once it ends), or
    /// `None` inside it once it is too long to be `id` or `method`.
    key: Option<Vec<u8>>,
    method: bool,
    /// The id's text while it is read.
    value: Option<Vec<u8>>,
    found: Option<Vec<u8>>,
    /// The id could not be kept (too long).
    lost: bool,
}

impl IdScan {
    /// Reads the next piece of the text.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    /// What was found, once the whole text has been fed.
    pub fn finish(mut self) -> Scanned {
        if self.value.as_ref().is_some_and(|v| v[0] != b'"') {
            self.found = self.value.take(); // a number the text ended on
        }
        let id = self.found.and_then(|f| serde_json::from_slice::<Value>(&f).ok());
        Scanned { id: id.filter(|id| id.is_string() || id.is_number()), has_method: self.method }
    }

    fn byte(&mut self, b: u8) {
        // (A number that ends on `b` leaves `b` to what follows.)
        if self.value.is_some() && !self.id_byte(b) {
            return;
        }
        if self.in_string {
            self.string_byte(b);
            return;
        }
        let top = self.depth == 1;
        match b {
            b'"' => {
                self.in_string = true;
                if top && self.at == At::Key {
                    self.key = Some(vec![b'"']);
                } else if top && self.at == At::IdValue && self.keeps() {
                    self.in_string = false;
                    self.value = Some(vec![b]);
                }
            }
            b'{' | b'[' => {
                self.depth = self.depth.saturating_add(1);
                self.at = if self.depth == 1 && b == b'{' { At::Key } else { At::Elsewhere };
            }
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                self.at = At::Elsewhere;
            }
            b',' if top => self.at = At::Key,
            b':' if top && self.at == At::IdKey => self.at = At::IdValue,
            b'-' | b'0'..=b'9' if top && self.at == At::IdValue && self.keeps() => self.value = Some(vec![b]),
            b' ' | b'\t' | b'\r' | b'\n' => {}
            // A value of another kind (`true`, `null`, …) or one not the id.
            _ if top && self.at == At::IdValue => self.at = At::Elsewhere,
            _ => {}
        }
    }

    /// Whether an id is still to be read: the first one only, and not once one was lost.
    fn keeps(&self) -> bool {
        self.found.is_none() && !self.lost
    }

    /// A byte inside a string: a key's is kept (its first bytes), another's skipped.
    fn string_byte(&mut self, b: u8) {
        if self.escaped {
            self.escaped = false;
        } else if b == b'\\' {
            self.escaped = true;
        } else if b == b'"' {
            self.in_string = false;
            if let Some(mut key) = self.key.take() {
                key.push(b'"');
                // `"\u0069d"` is `id` to any JSON reader, so it is to this one.
                let key = serde_json::from_slice::<String>(&key).unwrap_or_default();
                self.method |= key == "method";
                self.at = if key == "id" { At::IdKey } else { At::Elsewhere };
            }
            return;
        }
        if let Some(key) = self.key.as_mut() {
            key.push(b);
            if key.len() > MAX_KEY_BYTES + 1 {
                self.key = None;
                self.at = At::Elsewhere;
            }
        }
    }

    /// A byte of the id's value. Returns whether the value ended before `b` (a number
    /// does at the first byte that cannot be part of it), which is then read as usual.
    fn id_byte(&mut self, b: u8) -> bool {
        let value = self.value.as_mut().expect("reading the id");
        let string = value[0] == b'"';
        if !string && !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
            self.found = self.value.take();
            self.at = At::Elsewhere;
            return true;
        }
        if value.len() == MAX_ID_BYTES {
            // Too long to keep: the rest of it is read as any string or number.
            self.lost = true;
            self.value = None;
            self.at = At::Elsewhere;
            if string {
                self.in_string = true;
                self.string_byte(b);
            }
            return false;
        }
        value.push(b);
        if string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.found = self.value.take();
                self.at = At::Elsewhere;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn scan(text: &str) -> Option<Value> {
        let mut s = IdScan::default();
        s.feed(text.as_bytes());
        s.finish().id
    }

    #[test]
    fn the_top_level_id_and_nothing_else() {
        assert_eq!(scan(r#"{"jsonrpc":"2.0","id":7,"method":"x"}"#), Some(json!(7)));
        assert_eq!(scan(r#"{"params":{"id":1,"a":[{"id":2}]},"id":"k\"1"}"#), Some(json!("k\"1")));
        assert_eq!(scan(r#"{ "id" : -1.5e3 }"#), Some(json!(-1500.0)));
        assert_eq!(scan(r#"{"method":"x","id":42"#), Some(json!(42)), "a text cut after its id");
        assert_eq!(scan(r#"{"method":"x","id":4"#), Some(json!(4)), "a text that ends on its id");
        assert_eq!(scan(r#"{"idx":1,"i":2,"d":3}"#), None);
        assert_eq!(scan(r#"{"id":null}"#), None);
        assert_eq!(scan(r#"{"id":{"a":1},"b":2}"#), None);
        assert_eq!(scan(r#"[{"id":1}]"#), None, "a batch has no one id");
        assert_eq!(scan(r#"{"a":"\"id\":3","b":{}}"#), None, "an id inside a string is no id");
        assert_eq!(scan(r#"{"\u0069d":5}"#), Some(json!(5)), "a key written with escapes");
        assert_eq!(scan(r#"{"\u0069\u0064":"k"}"#), Some(json!("k")));
        assert_eq!(scan(r#"{"i\"d":5,"\\id":6}"#), None);
        let long_key = format!(r#"{{"{}":1,"id":2}}"#, "\\u0069".repeat(40));
        assert_eq!(scan(&long_key), Some(json!(2)), "a key too long to keep is still skipped whole");
        let long = format!(r#"{{"id":"{}","method":"m"}}"#, "x".repeat(MAX_ID_BYTES));
        assert_eq!(scan(&long), None, "an id past the bound is not kept");
        let mut s = IdScan::default();
        s.feed(long.as_bytes());
        assert!(s.finish().has_method, "and what follows it is still read");
    }

    #[test]
    fn a_request_from_an_answer() {
        let finish = |text: &str| {
            let mut s = IdScan::default();
            s.feed(text.as_bytes());
            s.finish()
        };
        assert!(finish(r#"{"id":1,"method":"sampling/createMessage","params":{}}"#).has_method);
        assert!(!finish(r#"{"id":1,"result":{"method":"x","methods":1}}"#).has_method);
        assert!(!finish(r#"{"id":1,"methods":1,"metho":2}"#).has_method);
        assert!(finish(r#"{"id":1,"m\u0065thod":"ping"}"#).has_method);
        let escaped = r#"{"id":1,"\u006d\u0065\u0074\u0068\u006f\u0064":"ping"}"#;
        assert!(finish(escaped).has_method, "every letter escaped");
        let answer = finish(r#"{"id":"k","result":{}}"#);
        assert_eq!(answer.answers(), Some(Some(rmcp::model::RequestId::String("k".into()))));
        assert_eq!(finish(r#"{"id":1.5,"result":{}}"#).answers(), Some(None), "no request has that id");
        assert_eq!(finish(r#"{"id":1,"method":"ping"}"#).answers(), None, "a request answers nothing");
    }

    proptest! {
        /// Whatever surrounds it and however the text is cut into pieces, the scan finds
        /// the id serde reads.
        #[test]
        fn finds_what_serde_reads(
            id in prop_oneof![any::<i64>().prop_map(Value::from), "[^\u{0}]{0,40}".prop_map(Value::from)],
            before in proptest::collection::hash_map("[a-z\"\\\\{}:,]{0,6}", any::<String>(), 0..4),
            nested in "[ -~]{0,40}",
            cut in proptest::collection::vec(0usize..200, 0..6),
        ) {
            let mut message = serde_json::Map::new();
            for (k, v) in before.into_iter().filter(|(k, _)| k != "id") {
                message.insert(k, json!({"id": v, "list": [nested.clone(), {"id": 1}]}));
            }
            message.insert("id".into(), id.clone());
            let text = serde_json::to_string(&Value::Object(message)).unwrap();
            let mut cuts: Vec<usize> = cut.into_iter().map(|c| c.min(text.len())).collect();
            cuts.sort_unstable();
            let mut s = IdScan::default();
            let mut from = 0;
            for at in cuts.into_iter().chain([text.len()]) {
                s.feed(&text.as_bytes()[from..at]);
                from = at;
            }
            prop_assert_eq!(s.finish().id, Some(id));
        }
    }
}
