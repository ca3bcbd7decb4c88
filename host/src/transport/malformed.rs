//! The protocol's answer to a message that cannot be read as one: the same for a client
//! over stdio (a line) and streamable HTTP (a request body), and for a server's line.
//!
//! JSON-RPC 2.0 says: what is not JSON gets -32700 (parse error) with a null id; JSON
//! that is not a valid message gets -32600 (invalid request) with the message's id when it
//! has one, or -32602 (invalid params) when only its structured params are wrong; a
//! notification or an answer gets no reply. Batches left MCP in 2025-06-18, so an array is
//! an invalid request too.

use serde_json::{Value, json};

use crate::text::capped;

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const INVALID_PARAMS: i64 = -32602;

/// The requests MCP defines for a client to send (2025-11-25). rmcp reads one whose
/// params do not fit as a custom request; these names say it was not.
pub const CLIENT_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "completion/complete",
    "logging/setLevel",
];

/// The most bytes of a sender's `method` or `id` quoted in an error's message.
const QUOTED_BYTES: usize = 256;

/// Why a message could not be read, and whether JSON-RPC wants it answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Unreadable {
    pub code: i64,
    pub message: String,
    /// The message's own id when it has a usable one (a string or a number), else null.
    pub id: Value,
    /// False for a notification or an answer: JSON-RPC sends nothing back for those.
    pub wants_answer: bool,
    /// A JSON-RPC 2.0 request with a usable id, only the rest wrong: someone waits on it.
    pub is_request: bool,
}

impl Unreadable {
    /// Classifies `bytes`, which did not decode as a message (of a client, or of a server:
    /// the reasons are the same).
    pub fn of(bytes: &[u8]) -> Self {
        let object = match Self::object_of(bytes) {
            Ok(object) => object,
            Err(unreadable) => return unreadable,
        };
        let is_notification = object.contains_key("method") && !object.contains_key("id");
        let is_answer =
            !object.contains_key("method") && (object.contains_key("result") || object.contains_key("error"));
        // An id MCP takes: a string or an integer (a signed 64-bit one, as SDKs read it).
        let id = object.get("id").filter(|id| id.is_string() || id.is_i64()).cloned();
        let is_request = id.is_some()
            && object.get("jsonrpc") == Some(&json!("2.0"))
            && object.get("method").is_some_and(Value::is_string);
        let (code, message) = Self::what_is_wrong(&object, id.as_ref());
        Self { code, message, wants_answer: !is_notification && !is_answer, is_request, id: id.unwrap_or(Value::Null) }
    }

    /// `bytes` as a JSON object, else what is wrong with them.
    fn object_of(bytes: &[u8]) -> Result<serde_json::Map<String, Value>, Self> {
        let value = match serde_json::from_slice::<Value>(bytes) {
            Ok(value) => value,
            // Nesting past serde_json's depth limit lands here too: it is not JSON we read.
            Err(e) => return Err(Self::answered(PARSE_ERROR, format!("Parse error: {e}"), Value::Null)),
        };
        let why = match value {
            Value::Object(object) => return Ok(object),
            Value::Array(_) => {
                "Invalid Request: JSON-RPC batches are not part of MCP (since 2025-06-18); send one message at a time"
            }
            _ => "Invalid Request: a JSON-RPC message is a JSON object",
        };
        Err(Self::answered(INVALID_REQUEST, why.into(), Value::Null))
    }

    /// The error code and message for the JSON object `object`, which did not decode as a
    /// message; `id` is its id, if one MCP takes. (serde's untagged enums say only "did not
    /// match any variant": this says what is wrong.)
    fn what_is_wrong(object: &serde_json::Map<String, Value>, id: Option<&Value>) -> (i64, String) {
        let structured = matches!(object.get("params"), Some(Value::Object(_) | Value::Array(_)));
        let bad_id = object.get("id").filter(|_| id.is_none());
        // What the sender wrote is quoted only in part: it goes into log lines.
        // (`Some(None)`: a `method` that is not a string.)
        let method = object.get("method").map(|m| m.as_str().map(|m| capped(m, QUOTED_BYTES)));
        match method {
            Some(Some(method)) if let Some(bad) = bad_id => (
                INVALID_REQUEST,
                format!(
                    "Invalid Request: the id of `{method}` must be a string or an integer (of 64 bits, signed), not {}",
                    capped(&bad.to_string(), QUOTED_BYTES)
                ),
            ),
            Some(Some(method)) if object.get("jsonrpc") != Some(&json!("2.0")) => {
                (INVALID_REQUEST, format!("Invalid Request: `{method}` needs \"jsonrpc\": \"2.0\""))
            }
            Some(Some(method)) if structured && id.is_some() => {
                (INVALID_PARAMS, format!("Invalid params: the `params` of `{method}` are not what it takes"))
            }
            Some(Some(method)) => {
                (INVALID_REQUEST, format!("Invalid Request: the `params` of `{method}` must be an object"))
            }
            Some(_) => (INVALID_REQUEST, "Invalid Request: `method` must be a string".into()),
            None => (
                INVALID_REQUEST,
                "Invalid Request: a message has a `method` (a request or notification) or a `result` or `error` (an answer)"
                    .into(),
            ),
        }
    }

    /// An error that is answered, whatever the message was (one never read whole, say).
    pub fn answered(code: i64, message: String, id: Value) -> Self {
        Self { code, message, id, wants_answer: true, is_request: false }
    }

    /// The JSON-RPC error message to send back.
    pub fn to_json(&self) -> Value {
        json!({"jsonrpc": "2.0", "id": self.id, "error": {"code": self.code, "message": self.message}})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(text: &str) -> (i64, Value, bool) {
        let u = Unreadable::of(text.as_bytes());
        (u.code, u.id, u.wants_answer)
    }

    #[test]
    fn each_kind_of_unreadable_message_gets_the_protocols_answer() {
        assert_eq!(of("not json"), (PARSE_ERROR, Value::Null, true));
        assert_eq!(of(r#"{"jsonrpc":"2.0","id":3,"method":"tools/list""#), (PARSE_ERROR, Value::Null, true));
        assert_eq!(of(&"[".repeat(100_000)), (PARSE_ERROR, Value::Null, true));
        assert_eq!(of("42"), (INVALID_REQUEST, Value::Null, true));
        assert_eq!(of(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#), (INVALID_REQUEST, Value::Null, true));
        // An id MCP does not take is named, not the params.
        for id in [r#"{"a":1}"#, "null", "1.5", "true", "18446744073709551615"] {
            let u = Unreadable::of(format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#).as_bytes());
            assert_eq!((u.code, &u.id), (INVALID_REQUEST, &Value::Null));
            assert!(u.message.contains("the id of `ping` must be a string or an integer"), "{}", u.message);
        }
        // What the sender wrote is quoted in part: the message goes into log lines.
        let long = "m".repeat(1 << 20);
        let u = Unreadable::of(format!(r#"{{"jsonrpc":"2.0","id":{{"x":"{long}"}},"method":"{long}"}}"#).as_bytes());
        assert!(u.message.len() < 3 * QUOTED_BYTES, "{} bytes", u.message.len());
        let u = Unreadable::of(format!(r#"{{"jsonrpc":"1.0","id":1,"method":"{long}"}}"#).as_bytes());
        assert!(u.message.len() < 2 * QUOTED_BYTES && u.message.contains("needs"), "{}", u.message);
        // A request of the wrong shape keeps its id, string or number.
        assert_eq!(
            of(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":"x"}"#),
            (INVALID_REQUEST, json!(7), true)
        );
        assert_eq!(of(r#"{"jsonrpc":"2.0","id":"a","method":5}"#), (INVALID_REQUEST, json!("a"), true));
        // A bad id is an invalid request, whatever the params.
        assert_eq!(
            of(r#"{"jsonrpc":"2.0","id":1.5,"method":"ping","params":{}}"#),
            (INVALID_REQUEST, Value::Null, true)
        );
        assert!(Unreadable::of(br#"{"jsonrpc":"2.0","id":7,"method":"x","params":"y"}"#).is_request);
        assert!(!Unreadable::of(br#"{"id":7,"level":"info","msg":"a JSON log line"}"#).is_request);
        // Structured params of the wrong shape are invalid params.
        assert_eq!(
            of(r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":7}}"#),
            (INVALID_PARAMS, json!(8), true)
        );
        // An id that is neither is not echoed: the answer's id is null.
        assert_eq!(of(r#"{"jsonrpc":"2.0","id":[1],"method":"ping"}"#), (INVALID_REQUEST, Value::Null, true));
        // A notification or an answer is never answered.
        assert!(!of(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":7}"#).2);
        assert!(!of(r#"{"jsonrpc":"2.0","id":4,"result":7,"error":{}}"#).2);
        // An object that is neither a request nor an answer is.
        assert_eq!(of(r#"{"hello":"world"}"#), (INVALID_REQUEST, Value::Null, true));
        assert!(Unreadable::of(b"{}").to_json()["error"]["message"].as_str().unwrap().starts_with("Invalid Request"));
    }
}
