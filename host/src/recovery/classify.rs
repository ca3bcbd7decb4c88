//! The built-in classifier: every [`Failure`] gets a category from the MCP error
//! taxonomy (connection, transport, timeout, protocol, initialization, capability,
//! tool-not-found, tool-execution, tool-validation, configuration, discovery,
//! server-unavailable, circuit-open, rate-limit, cancelled), whether it is worth retrying,
//! whether it says the server is unhealthy (and so counts for the breakers), a severity,
//! and whose fault it is (USER, CONFIG or BUG), which decides its log level.

use std::fmt;
use std::time::{Duration, SystemTime};

use super::Failure;
use super::retry_after;
use crate::transport::Status;

/// The error taxonomy, flattened; `Other` is the escape for adapters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Category {
    Connection,
    Transport,
    Timeout,
    Protocol,
    Initialization,
    Capability,
    ToolNotFound,
    ToolExecution,
    ToolValidation,
    Configuration,
    Discovery,
    ServerUnavailable,
    CircuitOpen,
    RateLimit,
    Cancelled,
    Other(String),
}

impl Category {
    pub fn as_str(&self) -> &str {
        match self {
            Self::Other(s) => s,
            fixed => fixed.label(),
        }
    }

    /// The category as a metric label: one of the fixed names, and `other` for whatever
    /// an adapter made up (its text is not a label value anyone chose to allow).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Other(_) => "other",
            Self::Connection => "connection",
            Self::Transport => "transport",
            Self::Timeout => "timeout",
            Self::Protocol => "protocol",
            Self::Initialization => "initialization",
            Self::Capability => "capability",
            Self::ToolNotFound => "tool-not-found",
            Self::ToolExecution => "tool-execution",
            Self::ToolValidation => "tool-validation",
            Self::Configuration => "configuration",
            Self::Discovery => "discovery",
            Self::ServerUnavailable => "server-unavailable",
            Self::CircuitOpen => "circuit-open",
            Self::RateLimit => "rate-limit",
            Self::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Low,
    Medium,
    High,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
            Self::Critical => "critical",
        }
    }
}

/// Whose fault it is, which decides how loudly it is logged: a caller's mistake is a
/// warning, a broken setup or a failing server an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The caller's arguments (logged as a warning).
    User,
    /// The setup: a missing server, a wrong command (logged as an error).
    Config,
    /// Anything else (logged as an error).
    Bug,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "USER",
            Self::Config => "CONFIG",
            Self::Bug => "BUG",
        }
    }

    pub fn log_level(self) -> tracing::Level {
        match self {
            Self::User => tracing::Level::WARN,
            Self::Config | Self::Bug => tracing::Level::ERROR,
        }
    }
}

/// What the gateway believes about a failure.
#[derive(Debug, Clone, PartialEq)]
pub struct Classification {
    pub category: Category,
    /// Whether the same call may succeed if made again (safety is decided separately).
    pub retryable: bool,
    pub retry_after: Option<Duration>,
    /// Whether it says the server (or what one tool of it depends on) is unhealthy: it
    /// did not answer in time, its connection broke, it broke the protocol, or it said
    /// it is unavailable or timed out itself (as a JSON-RPC error or as a tool's
    /// `isError` text). Such failures count for the tool's breaker and, unless they
    /// stay confined to one tool, for the server's (see `engine`). A tool that answers
    /// with any other error is a healthy server saying no.
    pub counts_for_breaker: bool,
    pub severity: Severity,
    pub kind: Kind,
    /// Whether the failure proves the request never reached the server, which makes a
    /// retry safe even for a tool with side effects.
    pub not_delivered: bool,
    /// What the agent should read first, when an adapter knows better than the failure's
    /// own text.
    pub message: Option<String>,
}

impl Classification {
    fn new(category: Category, retryable: bool, counts_for_breaker: bool, severity: Severity, kind: Kind) -> Self {
        Self {
            category,
            retryable,
            retry_after: None,
            counts_for_breaker,
            severity,
            kind,
            not_delivered: false,
            message: None,
        }
    }
}

/// JSON-RPC `-32001`: the request timed out (MCP SDKs' `RequestTimeout`, Claude Code's
/// AbortError).
pub const ABORTED: i32 = -32001;

/// Classifies `failure`; `now` is the wall clock, for HTTP-date retry hints.
pub fn classify(failure: &Failure, now: SystemTime) -> Classification {
    classify_sent(failure, None, now)
}

/// [`classify`] of the failure of a call whose arguments were `sent`: what the caller
/// wrote that would classify a failure on its own is taken out of the failure's text
/// first. A tool that echoes its arguments in its error ("no such file: /x/503 service
/// unavailable") could otherwise be made to report an outage, which counts against the
/// breakers of a server every client shares. Arguments that say nothing on their own
/// ("out", "rate", "error") stay: the tool's own words around them still classify.
pub fn classify_sent(
    failure: &Failure,
    sent: Option<&serde_json::Map<String, serde_json::Value>>,
    now: SystemTime,
) -> Classification {
    classified(failure, now, &Reading { sent, echoes: Default::default(), unread: Default::default() })
}

/// How a failure's text is read, given what the caller sent: with the caller's echoes
/// taken out, or, for arguments past what is read for echoes (which could hide any text
/// in what was not read), without acting on any word of the reading's the caller wrote
/// anywhere ([`words_in`]). Each is found only when a text is read (a timeout's never
/// is), and once.
struct Reading<'a> {
    sent: Option<&'a serde_json::Map<String, serde_json::Value>>,
    echoes: std::cell::OnceCell<Option<Vec<String>>>,
    unread: std::cell::OnceCell<Unread>,
}

impl Reading<'_> {
    /// `text` with the caller's echoes taken out.
    fn text(&self, text: String) -> String {
        match self.echoes() {
            Some(echoes) => without(text, echoes),
            None => text,
        }
    }

    fn echoes(&self) -> Option<&[String]> {
        self.echoes.get_or_init(|| self.sent.map_or(Some(Vec::new()), echoes)).as_deref()
    }

    /// The words of the reading's not to act on.
    fn unread(&self) -> &Unread {
        self.unread.get_or_init(|| match (self.echoes(), self.sent) {
            (None, Some(sent)) => words_in(sent),
            _ => Unread::default(),
        })
    }
}

/// Words of the reading's (its lists below) that it passes over in a failure's text.
#[derive(Debug, Default)]
struct Unread(Vec<&'static str>);

impl Unread {
    fn skips(&self, word: &str) -> bool {
        self.0.contains(&word)
    }
}

/// The most of a call's argument values read for [`echoes`], and the most taken out.
const MAX_READ: usize = 10_000;
const MAX_ECHOES: usize = 256;

/// What in `sent` would classify a failure on its own (an outage, a rate limit, an
/// unknown tool, refused arguments), longest first: its strings, its numbers (`{"id":
/// 503}` echoed as "item 503 not found") and its objects' keys, each also as JSON writes
/// it (a tool's structured content is read as JSON, where a quote or a line break in an
/// echoed string is escaped). `None` when `sent` is past what is read ([`MAX_READ`]
/// values, [`MAX_ECHOES`] found): the caller chooses the order they are read in, so what
/// was left unread could be anything ([`words_in`] reads it).
fn echoes(sent: &serde_json::Map<String, serde_json::Value>) -> Option<Vec<String>> {
    use serde_json::Value;
    let none = Unread::default();
    let says = |s: &str| {
        from_text(s, SystemTime::UNIX_EPOCH, &none).is_some()
            || mentions_unknown_tool(s, &none)
            || refuses_arguments(s, &none)
    };
    let mut found = Vec::new();
    let keep = |s: &str, found: &mut Vec<String>| {
        if says(s) {
            found.push(s.to_owned());
            let quoted = Value::from(s).to_string();
            let escaped = &quoted[1..quoted.len() - 1];
            if escaped != s {
                found.push(escaped.to_owned());
            }
        }
    };
    let mut pending: Vec<(Option<&String>, &Value)> = sent.iter().map(|(k, v)| (Some(k), v)).collect();
    let mut read = 0;
    while let Some((key, value)) = pending.pop() {
        read += 1;
        if found.len() >= MAX_ECHOES || read > MAX_READ {
            return None;
        }
        if let Some(key) = key {
            keep(key, &mut found);
        }
        match value {
            Value::String(s) => keep(s, &mut found),
            Value::Number(n) => keep(&n.to_string(), &mut found),
            Value::Array(items) => pending.extend(items.iter().map(|v| (None, v))),
            Value::Object(map) => pending.extend(map.iter().map(|(k, v)| (Some(k), v))),
            Value::Bool(_) | Value::Null => {}
        }
    }
    found.sort_by_key(|s| std::cmp::Reverse(s.len()));
    Some(found)
}

/// `text` with each of `echoes` taken out, in any case of its ASCII letters (a tool may
/// echo a value upper-cased; the reading of the text ignores case too).
fn without(mut text: String, echoes: &[String]) -> String {
    let mut lower = text.to_ascii_lowercase();
    for echo in echoes {
        let echo = echo.to_ascii_lowercase();
        if echo.is_empty() || !lower.contains(&echo) {
            continue;
        }
        // Lower-casing ASCII letters moves no byte: a match in `lower` is one in `text`.
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for (at, _) in lower.match_indices(&echo) {
            out.push_str(&text[last..at]);
            out.push(' ');
            last = at + echo.len();
        }
        out.push_str(&text[last..]);
        text = out;
        lower = text.to_ascii_lowercase();
    }
    text
}

fn classified(failure: &Failure, now: SystemTime, reading: &Reading<'_>) -> Classification {
    use Category as C;
    use Kind::{Bug, Config, User};
    use Severity::{High, Low, Medium};
    match failure {
        Failure::Timeout { .. } => C::Timeout.with(true, true, High, Bug),
        Failure::ConnectionLost { .. } => C::Transport.with(true, true, High, Bug),
        Failure::SendFailed { .. } => C::Connection.with(true, true, High, Bug).undelivered(),
        Failure::Unavailable { status, .. } => {
            // A server marked down is tried again only after `down_retry_ms`: its calls
            // fail at once, not after retries that could not find it up.
            let down = *status == Status::Down;
            let kind = if down { Config } else { Bug };
            // No traffic reached the server: nothing to count.
            C::ServerUnavailable.with(!down, false, High, kind).undelivered()
        }
        Failure::CircuitOpen { retry_in, .. } => {
            let mut c = C::CircuitOpen.with(true, false, Medium, Bug).undelivered();
            c.retry_after = Some(*retry_in);
            c
        }
        Failure::HttpStatus { status, retry_after } => {
            let mut c = match status {
                // Asked to come later: the server is healthy.
                429 => C::RateLimit.with(true, false, Medium, Bug),
                // Refused, not run: nothing against the server. Its credentials or its
                // address are the configuration's; any other refusal is of the request.
                401 | 403 | 404 => C::Configuration.with(false, false, High, Config),
                // Timed out receiving it, or too early: worth sending again.
                408 | 425 => C::Transport.with(true, false, Medium, Bug),
                400..=499 => C::Protocol.with(false, false, Medium, Bug),
                503 => C::ServerUnavailable.with(true, true, High, Bug),
                // A proxy that gave up waiting: the request may have run behind it.
                504 => C::Timeout.with(true, true, High, Bug),
                // A proxy's bad gateway or a server error: it may have run in part.
                _ => C::Transport.with(true, true, High, Bug),
            };
            c.retry_after = retry_after.as_deref().and_then(|v| retry_after::parse(&format!("Retry-After: {v}"), now));
            c
        }
        Failure::Cancelled => C::Cancelled.with(false, false, Low, User),
        Failure::Unanswered { .. } => C::Capability.with(false, false, Low, User),
        // The client's load, not the server's fault: it may call again once it has less.
        Failure::GatewayLimit { .. } => C::RateLimit.with(false, false, Medium, User),
        // The gateway's own bug: nothing to retry, nothing against the server.
        Failure::Internal { .. } => C::Other("internal".into()).with(false, false, Severity::Critical, Bug),
        Failure::Protocol { .. } => C::Protocol.with(false, true, High, Bug),
        Failure::Rpc { code, message, data } => {
            let text = reading.text(format!("{message} {}", data.as_ref().map(|d| d.to_string()).unwrap_or_default()));
            let unread = reading.unread();
            match *code {
                // The server answered that the request timed out behind it.
                ABORTED => C::Timeout.with(true, true, High, Bug),
                -32700 | -32600 => C::Protocol.with(false, true, High, Bug),
                -32601 => C::Capability.with(false, false, Medium, Config),
                // SDKs answer an unknown tool name with -32602 too.
                -32602 if mentions_unknown_tool(&text, unread) => C::ToolNotFound.with(true, false, Medium, Config),
                -32602 => C::ToolValidation.with(false, false, Low, User),
                -32002 => C::ToolExecution.with(false, false, Medium, User),
                _ => from_text(&text, now, unread).unwrap_or_else(|| C::ToolExecution.with(false, false, Medium, Bug)),
            }
        }
        Failure::ToolError { result } => {
            let text = reading.text(failure_text(failure, result));
            let unread = reading.unread();
            if refuses_arguments(&reading.text(failure.message()), unread) {
                return C::ToolValidation.with(false, false, Low, User);
            }
            // A tool that reports its own error is a healthy server saying no, unless
            // the text says the trouble is an outage or transient.
            from_text(&text, now, unread).unwrap_or_else(|| C::ToolExecution.with(false, false, Medium, User))
        }
    }
}

/// Whether a tool's own error is its SDK refusing the call's arguments before the tool
/// ran, as the official SDKs answer it: TypeScript's "Input validation error: Invalid
/// arguments for tool NAME: ..." and Python's "Error executing tool NAME: 1 validation
/// error for NAMEArguments ..." (pydantic's). The agent is to fix its call; another tool
/// would get the same arguments.
fn refuses_arguments(text: &str, unread: &Unread) -> bool {
    // pydantic names the model it validated ("1 validation error for M", "2 validation
    // errors for M"): the SDK's is `<tool>Arguments`.
    let model = |rest: &str| rest.split(char::is_whitespace).next().is_some_and(|m| m.ends_with("Arguments"));
    let mut saids =
        [" validation error for ", " validation errors for "].into_iter().filter(|said| !unread.skips(said));
    let pydantic = saids.any(|said| text.split(said).skip(1).any(model));
    let typescript =
        !unread.skips("input validation error") && text.contains("Input validation error: Invalid arguments for tool ");
    typescript || pydantic
}

/// The tool's error text, and its structured content, where hints may hide.
fn failure_text(failure: &Failure, result: &rmcp::model::CallToolResult) -> String {
    let mut text = failure.message();
    if let Some(s) = &result.structured_content {
        text.push(' ');
        text.push_str(&s.to_string());
    }
    text
}

fn mentions_unknown_tool(text: &str, unread: &Unread) -> bool {
    let t = text.to_ascii_lowercase();
    let has = |word: &str| !unread.skips(word) && t.contains(word);
    (has("tool") && (has("not found") || has("unknown"))) || has("no such tool")
}

/// Outages and transient conditions recognised in free text (HTTP status codes, common
/// phrases).
///
/// An outage (unavailable, timed out, connection refused) counts for the breakers: a
/// server that answers every call with "503 Service Unavailable" is as dead as one that
/// does not answer. Often what failed is behind one tool (a search API), so the engine
/// trips that tool's breaker first and leaves the server's other tools, often the
/// alternatives (`lean_leansearch` → `lean_loogle`), serving. A rate limit does not count:
/// the server is healthy and asked to be called later.
fn from_text(text: &str, now: SystemTime, unread: &Unread) -> Option<Classification> {
    use Category as C;
    use Kind::Bug;
    use Severity::{High, Medium};
    let t = text.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| !unread.skips(w) && says(&t, w));
    let mut c = if has(RATE_LIMITED) {
        C::RateLimit.with(true, false, Medium, Bug)
    } else if has(UNAVAILABLE) {
        C::ServerUnavailable.with(true, true, High, Bug)
    } else if has(TIMED_OUT) {
        C::Timeout.with(true, true, High, Bug)
    } else if has(UNREACHABLE) {
        C::Connection.with(true, true, High, Bug)
    } else {
        return None;
    };
    c.retry_after = retry_after::parse_without(text, now, |key| unread.skips(key));
    Some(c)
}

/// The words [`from_text`] reads, in lower case, each list a category's.
const RATE_LIMITED: &[&str] = &["429", "rate limit", "rate-limit", "ratelimit", "too many requests", "quota exceeded"];
const UNAVAILABLE: &[&str] =
    &["503", "service unavailable", "overloaded", "temporarily unavailable", "502 bad gateway", "504 gateway"];
const TIMED_OUT: &[&str] = &["timed out", "timeout", "aborterror", "operation was aborted", "deadline exceeded"];
const UNREACHABLE: &[&str] =
    &["econnrefused", "connection refused", "econnreset", "connection reset", "broken pipe", "network is unreachable"];
/// The words [`mentions_unknown_tool`] and [`refuses_arguments`] read, in lower case.
const UNKNOWN_TOOL: &[&str] = &["tool", "not found", "unknown", "no such tool"];
const REFUSED: &[&str] = &[" validation error for ", " validation errors for ", "input validation error"];

/// Whether `lower` (a text in lower case) says `word`; a status code only as a number of
/// its own, not digits of another ("row 15030").
fn says(lower: &str, word: &str) -> bool {
    if !word.bytes().all(|b| b.is_ascii_digit()) {
        return lower.contains(word);
    }
    lower.match_indices(word).any(|(at, _)| {
        let alone = |b: Option<&u8>| !b.is_some_and(u8::is_ascii_alphanumeric);
        alone(at.checked_sub(1).and_then(|i| lower.as_bytes().get(i))) && alone(lower.as_bytes().get(at + word.len()))
    })
}

/// Every word of the reading's that the caller wrote itself somewhere in `sent` (in a
/// string, a number or a key, in any case): what stands in for [`echoes`] when `sent` is
/// past what is read for them. All of `sent` is searched, so nothing the caller ordered
/// first can hide what follows; a word found is passed over wherever it is in the
/// failure's text, and the rest of the text still classifies (a bulk-data tool's real
/// "service unavailable" does, unless its arguments hold those words too). Nothing is
/// taken out of the text: taking out a word could join what was on either side of it
/// into another (`tool503tool`).
fn words_in(sent: &serde_json::Map<String, serde_json::Value>) -> Unread {
    use serde_json::Value;
    let words = [RATE_LIMITED, UNAVAILABLE, TIMED_OUT, UNREACHABLE, UNKNOWN_TOOL, REFUSED, &retry_after::KEYS];
    let mut left: Vec<&'static str> = words.into_iter().flatten().copied().collect();
    let mut found = Vec::new();
    let mut look = |s: &str| {
        let lower = s.to_ascii_lowercase();
        let (said, rest): (Vec<&'static str>, _) = left.iter().partition(|w| says(&lower, w));
        found.extend(said);
        left = rest;
        left.is_empty()
    };
    let mut pending: Vec<(Option<&String>, &Value)> = sent.iter().map(|(k, v)| (Some(k), v)).collect();
    while let Some((key, value)) = pending.pop() {
        let done = key.is_some_and(|k| look(k))
            || match value {
                Value::String(s) => look(s),
                Value::Number(n) => look(&n.to_string()),
                Value::Array(items) => {
                    pending.extend(items.iter().map(|v| (None, v)));
                    false
                }
                Value::Object(map) => {
                    pending.extend(map.iter().map(|(k, v)| (Some(k), v)));
                    false
                }
                Value::Bool(_) | Value::Null => false,
            };
        if done {
            break;
        }
    }
    Unread(found)
}

impl Category {
    fn with(self, retryable: bool, counts_for_breaker: bool, severity: Severity, kind: Kind) -> Classification {
        Classification::new(self, retryable, counts_for_breaker, severity, kind)
    }
}

impl Classification {
    fn undelivered(mut self) -> Self {
        self.not_delivered = true;
        self
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{CallToolResult, ContentBlock};

    use super::*;

    /// (failure, category, retryable, counts for breaker, not delivered)
    fn check(failure: Failure, category: Category, retryable: bool, counts: bool, undelivered: bool) {
        let c = classify(&failure, SystemTime::UNIX_EPOCH);
        assert_eq!(
            (&c.category, c.retryable, c.counts_for_breaker, c.not_delivered),
            (&category, retryable, counts, undelivered),
            "{failure:?}"
        );
    }

    fn rpc(code: i32, message: &str) -> Failure {
        Failure::Rpc { code, message: message.into(), data: None }
    }

    fn tool_error(text: &str) -> Failure {
        Failure::ToolError { result: Box::new(CallToolResult::error(vec![ContentBlock::text(text)])) }
    }

    /// What the caller sent, echoed in a tool's error, says nothing of the server: it
    /// cannot make a failure an outage (which counts against the breakers every client of
    /// a shared server shares), nor an unknown tool; the tool's own words still can.
    #[test]
    fn what_the_caller_sent_does_not_classify_its_failure() {
        let sent = serde_json::json!({"path": "/x/503 service unavailable", "o": {"q": "timed out"}});
        let sent = sent.as_object().unwrap();
        let now = SystemTime::UNIX_EPOCH;
        let echoed = tool_error("ENOENT: no such file /x/503 service unavailable");
        assert_eq!(classify(&echoed, now).category, Category::ServerUnavailable, "as read without the arguments");
        let c = classify_sent(&echoed, Some(sent), now);
        assert_eq!((c.category, c.counts_for_breaker), (Category::ToolExecution, false));
        let nested = tool_error("query 'timed out' matched nothing");
        assert!(!classify_sent(&nested, Some(sent), now).counts_for_breaker, "nested arguments too");
        let own = tool_error("upstream answered 503 service unavailable");
        assert!(classify_sent(&own, Some(sent), now).counts_for_breaker, "the tool's own words count");
        let unknown = serde_json::json!({"name": "unknown tool"});
        let c = classify_sent(&rpc(-32602, "bad value: unknown tool"), unknown.as_object(), now);
        assert_eq!(c.category, Category::ToolValidation);
        // What says nothing on its own stays, and the tool's words around it classify.
        let sent = serde_json::json!({"dir": "out", "level": "error", "q": "rate"});
        let sent = sent.as_object().unwrap();
        let c = classify_sent(&tool_error("request timed out"), Some(sent), now);
        assert_eq!(c.category, Category::Timeout, "`out` is no outage, `timed out` is");
        assert_eq!(classify_sent(&tool_error("rate limit exceeded"), Some(sent), now).category, Category::RateLimit);
        let refused = tool_error("Input validation error: Invalid arguments for tool t: level");
        assert_eq!(classify_sent(&refused, Some(sent), now).category, Category::ToolValidation);
    }

    /// Arguments past what is read for echoes cannot hide one behind them (the caller
    /// chooses what is read first): every word that classifies a text which they hold
    /// anywhere is taken out of the failure's, and the tool's own other words still
    /// classify it.
    #[test]
    fn what_the_caller_sent_past_the_bound_does_not_classify_its_failure() {
        let now = SystemTime::UNIX_EPOCH;
        let zeros = vec![0; MAX_READ + 1];
        let sent = serde_json::json!({"a": "503 service unavailable", "z": zeros});
        let echoed = tool_error("no such file: 503 service unavailable");
        let c = classify_sent(&echoed, sent.as_object(), now);
        assert_eq!((c.category, c.counts_for_breaker, c.retryable), (Category::ToolExecution, false, false));
        // Hidden last, in another case, past every value read.
        let sent = serde_json::json!({"a": zeros, "z": "Service Unavailable"});
        let echoed = tool_error("no such file: service unavailable");
        assert_eq!(classify_sent(&echoed, sent.as_object(), now).category, Category::ToolExecution);
        let many: serde_json::Map<String, serde_json::Value> = (0..2 * MAX_ECHOES)
            .map(|n| (format!("k{n}"), serde_json::json!(format!("{n} rate limit exceeded"))))
            .collect();
        let mut many = many;
        many.insert("a".into(), serde_json::json!("503 service unavailable"));
        assert!(!classify_sent(&echoed, Some(&many), now).counts_for_breaker, "nor past the most echoes found");
        // A bulk-data tool's own outage, its rate limit and its hint still read.
        let bulk = serde_json::json!({"rows": vec![15030; MAX_READ + 1], "q": "quarterly report"});
        let bulk = bulk.as_object();
        let c = classify_sent(&tool_error("503 service unavailable"), bulk, now);
        assert_eq!((c.category, c.counts_for_breaker), (Category::ServerUnavailable, true));
        let c = classify_sent(&tool_error("rate limit exceeded, retry after 30"), bulk, now);
        assert_eq!((c.category, c.retry_after), (Category::RateLimit, Some(Duration::from_secs(30))));
        // Nothing is taken out of the text, so nothing the caller wrote around a word it
        // also sent is joined into another ("tool503tool" would read " 503 ").
        let joined = serde_json::json!({"rows": vec![0; MAX_READ + 1], "q": "tool503tool", "r": "tool"});
        let c = classify_sent(&tool_error("no such file: tool503tool"), joined.as_object(), now);
        assert_eq!((c.category, c.counts_for_breaker), (Category::ToolExecution, false));
        // A hint the caller wrote is not the server's.
        let hinted = serde_json::json!({"rows": vec![0; MAX_READ + 1], "note": "retry after 86400"});
        let c = classify_sent(&tool_error("rate limit exceeded, retry after 86400"), hinted.as_object(), now);
        assert_eq!((c.category, c.retry_after), (Category::RateLimit, None));
        // Under the bound, the tool's own words still count.
        let sent = serde_json::json!({"z": vec![0; 100]});
        assert!(classify_sent(&tool_error("503 service unavailable"), sent.as_object(), now).counts_for_breaker);
    }

    /// A number, a key, a value echoed in another case or escaped in structured content
    /// is what the caller sent too.
    #[test]
    fn what_the_caller_sent_in_any_form_does_not_classify_its_failure() {
        let now = SystemTime::UNIX_EPOCH;
        let counts = |failure: &Failure, sent: serde_json::Value| classify_sent(failure, sent.as_object(), now);
        let c = counts(&tool_error("item 503 not found"), serde_json::json!({"id": 503}));
        assert_eq!((c.category, c.counts_for_breaker), (Category::ToolExecution, false));
        assert!(counts(&tool_error("item 503 not found"), serde_json::json!({"id": 7})).counts_for_breaker);
        let key = serde_json::json!({"filter": {"service unavailable": true}});
        assert!(!counts(&tool_error("unknown field `service unavailable`"), key).counts_for_breaker);
        let shouted = serde_json::json!({"q": "service unavailable"});
        assert!(!counts(&tool_error("NO MATCH FOR SERVICE UNAVAILABLE"), shouted).counts_for_breaker);
        let mut structured = CallToolResult::error(vec![ContentBlock::text("no match")]);
        structured.structured_content = Some(serde_json::json!({"query": "\"x\" 503 service unavailable"}));
        let structured = Failure::ToolError { result: Box::new(structured) };
        assert!(classify(&structured, now).counts_for_breaker, "as read without the arguments");
        let sent = serde_json::json!({"q": "\"x\" 503 service unavailable"});
        assert!(!counts(&structured, sent).counts_for_breaker);
    }

    #[test]
    fn the_hierarchy() {
        use Category::*;
        check(Failure::Timeout { after: Duration::from_secs(1) }, Timeout, true, true, false);
        check(rpc(-32001, "AbortError: The operation was aborted"), Timeout, true, true, false);
        check(rpc(-32602, "Invalid arguments: missing `query`"), ToolValidation, false, false, false);
        check(rpc(-32602, "Tool lean_foo not found"), ToolNotFound, true, false, false);
        check(rpc(-32601, "Method not found"), Capability, false, false, false);
        check(rpc(-32700, "Parse error"), Protocol, false, true, false);
        check(rpc(-32603, "internal error"), ToolExecution, false, false, false);
        check(rpc(-32603, "upstream returned 503 Service Unavailable"), ServerUnavailable, true, true, false);
        check(tool_error("503 Service Unavailable"), ServerUnavailable, true, true, false);
        check(tool_error("disk full"), ToolExecution, false, false, false);
        check(tool_error("Error: 429 Too Many Requests"), RateLimit, true, false, false);
        check(tool_error("request timed out after 30s"), Timeout, true, true, false);
        check(tool_error("connect ECONNREFUSED 127.0.0.1:8080"), Connection, true, true, false);
        check(Failure::ConnectionLost { reason: "eof".into(), session: None }, Transport, true, true, false);
        check(Failure::SendFailed { reason: "broken pipe".into() }, Connection, true, true, true);
        check(Failure::Unavailable { status: Status::Restarting, reason: None }, ServerUnavailable, true, false, true);
        check(Failure::Unavailable { status: Status::Down, reason: None }, ServerUnavailable, false, false, true);
        // A code is a number of its own: digits inside another number are not one.
        check(tool_error("no row with id 15030"), ToolExecution, false, false, false);
        check(tool_error("out of range at line 4290"), ToolExecution, false, false, false);
        check(tool_error("upstream said 503"), ServerUnavailable, true, true, false);
        check(tool_error("HTTP/1.1 429"), RateLimit, true, false, false);
        check(
            Failure::CircuitOpen { retry_in: Duration::from_secs(3), tool: None, own: false },
            CircuitOpen,
            true,
            false,
            true,
        );
        // A `url` server's refusals: none proves the request was not run.
        let http = |status, after: Option<&str>| Failure::HttpStatus { status, retry_after: after.map(str::to_owned) };
        check(http(429, Some("2")), RateLimit, true, false, false);
        check(http(503, None), ServerUnavailable, true, true, false);
        check(http(504, None), Timeout, true, true, false);
        check(http(502, None), Transport, true, true, false);
        check(http(500, None), Transport, true, true, false);
        check(http(401, None), Configuration, false, false, false);
        check(http(403, None), Configuration, false, false, false);
        check(http(404, None), Configuration, false, false, false);
        check(http(400, None), Protocol, false, false, false);
        check(http(408, None), Transport, true, false, false);
        check(http(425, None), Transport, true, false, false);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(classify(&http(429, Some("2")), now).retry_after, Some(Duration::from_secs(2)));
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(classify(&http(503, Some(&date)), now).retry_after, Some(Duration::from_secs(30)));
        assert_eq!(classify(&http(429, Some("soon")), now).retry_after, None);
        check(Failure::Cancelled, Cancelled, false, false, false);
        check(Failure::Unanswered { reason: "declined".into() }, Capability, false, false, false);
        check(Failure::Protocol { reason: "odd".into() }, Protocol, false, true, false);
        // A task past the client's share, refused by the gateway: no mark on the server.
        check(Failure::GatewayLimit { reason: "full".into() }, RateLimit, false, false, false);
    }

    #[test]
    fn rate_limits_carry_their_retry_after() {
        let c = classify(&tool_error("rate limit exceeded; retry after 2 seconds"), SystemTime::UNIX_EPOCH);
        assert_eq!(c.retry_after, Some(Duration::from_secs(2)));
        assert_eq!(c.kind.log_level(), tracing::Level::ERROR);
        assert_eq!(classify(&rpc(-32602, "bad"), SystemTime::UNIX_EPOCH).kind, Kind::User);
    }

    #[test]
    fn a_huge_retry_after_is_clamped() {
        let c = classify(&tool_error("429: try again in 99999999999999999999999 min"), SystemTime::UNIX_EPOCH);
        assert_eq!(c.retry_after, Some(retry_after::MAX));
    }

    proptest::proptest! {
        /// Whatever a server says, classifying it never panics and never asks for a wait
        /// past the cap.
        #[test]
        fn any_text_classifies(text in "\\PC{0,300}", code in proptest::num::i32::ANY, data in proptest::option::of("\\PC{0,100}")) {
            let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
            let data = data.map(serde_json::Value::String);
            for f in [rpc(code, &text), tool_error(&text), Failure::Rpc { code, message: text.clone(), data }] {
                let c = classify(&f, now);
                proptest::prop_assert!(c.retry_after.is_none_or(|d| d <= retry_after::MAX));
            }
        }
    }
}
