//! Secrets in the configuration (server `env` and `headers` values, the values of the
//! variables the file uses, the gateway's own tokens) never leave the gateway: every text that does — `rebound_status`, the errors
//! log, reports to the agent, log lines about servers — goes through [`Secrets::redact`].
//! A server that prints its API key on stderr as it crashes would otherwise put the key
//! into `last_error`.

use std::borrow::Cow;
use std::io::Write;
use std::sync::{Arc, RwLock};

use serde_json::Value;

use crate::config::{Config, Launch};
use crate::lasting::ReadWrite;

const MASK: &str = "[redacted]";

/// Names that mark a value as secret whatever its length.
const SECRET_NAMES: &[&str] =
    &["token", "key", "secret", "pass", "pw", "auth", "credential", "cookie", "private", "dsn", "jwt"];

/// Names that contain one of [`SECRET_NAMES`] and hold no secret: the shell's folders.
const NOT_SECRET_NAMES: &[&str] = &["pwd", "oldpwd"];

/// Whether `name` (a variable's, a header's) sounds like it holds a secret.
fn named_secret(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    SECRET_NAMES.iter().any(|n| lower.contains(n)) && !NOT_SECRET_NAMES.contains(&lower.as_str())
}

/// The variables of the gateway's environment that `config` reads (`${VAR}`) and that are
/// named like secrets: each reaches only the servers whose own `env` passes it on
/// (`transport::process::withheld`), not every server as the rest of the environment does.
pub fn secret_variables(config: &Config) -> impl Iterator<Item = &str> {
    config.expanded.iter().map(|(name, _)| name.as_str()).filter(|name| named_secret(name))
}

/// Whether `value`, under `name`, is a secret: named like one, 3 characters or more and
/// no flag; or, whatever its name, 8 or more and no path or number.
fn looks_secret(name: &str, value: &str) -> bool {
    let plain = value.starts_with(['/', '.', '~']) || value.parse::<f64>().is_ok();
    (named_secret(name) && value.len() >= 3 && !a_flag(value)) || (value.len() >= 8 && !plain)
}

/// A setting's value rather than a secret, whatever its name (`PRIVATE_MODE=true`).
fn a_flag(value: &str) -> bool {
    ["true", "false", "yes", "no", "on", "off", "none", "null"].iter().any(|f| value.eq_ignore_ascii_case(f))
}

/// Of the secrets of earlier configurations, at most this many values, and bytes, stay
/// hidden beside the current ones (the newest first): each reload that rotates a token
/// adds one, and every text the gateway lets out is searched for all of them.
const MAX_EARLIER: (usize, usize) = (512, 1 << 20);

/// The values to hide: `values` longest first, so that a secret containing another goes
/// whole; `newest_first` the same values, the current configuration's first and then
/// earlier ones' by age, for [`Secrets::union`] to know which to let go of.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    values: Arc<[String]>,
    newest_first: Arc<[String]>,
}

impl Secrets {
    /// The secrets of `config`: every header value; the password and query values of an
    /// upstream URL; environment values with a secret-sounding name, and the others of 8
    /// characters or more unless they are paths or numbers (short values like `1` or
    /// `true`, and the paths a server is told about, would only garble the text around them).
    pub fn of(config: &Config) -> Self {
        let mut values = Vec::new();
        let mut add = |name: &str, value: &str| {
            let named = named_secret(name);
            if looks_secret(name, value) {
                values.push(value.to_owned());
            }
            // `Bearer TOKEN`, `Basic CREDENTIALS`: the credential alone is secret too.
            if let Some((_, credential)) = value.split_once(' ')
                && named
                && credential.len() >= 3
            {
                values.push(credential.to_owned());
            }
            // A URL's secrets alone (`postgres://me:PASSWORD@db/app`): a server may print
            // the URL's parts, not the whole.
            if value.contains("://") {
                values.extend(url_secrets(value).into_iter().map(str::to_owned));
            }
        };
        for server in config.servers.values() {
            match &server.launch {
                Launch::Stdio(s) => s.env.iter().for_each(|(k, v)| add(k, v)),
                Launch::Http(h) => {
                    h.headers.iter().for_each(|(k, v)| add(&format!("{k}-auth"), v));
                    for value in url_credentials(&h.url) {
                        add("url-secret", value);
                    }
                }
            }
        }
        for token in [&config.settings.http.auth_token, &config.settings.http.operator_token].into_iter().flatten() {
            add("token", token);
        }
        // A secret-named variable's value wherever it went (`"args": ["--token", "${T}"]`);
        // of another (`${PROJECT_ID}`, `${DATABASE_URL}`), the credentials of a URL in it
        // (`postgres://user:password@host/db`, `?api_key=…`), and the rest only where an
        // `env` or header value would be.
        for (name, value) in &config.expanded {
            if named_secret(name) {
                add(name, value);
            } else if value.contains("://") {
                for credential in url_secrets(value) {
                    add("url-secret", credential);
                }
            }
        }
        Self::in_order(values, usize::MAX)
    }

    /// `newest_first` as secrets, without repeats, keeping the first `own` values whole and
    /// of the rest (earlier configurations') what fits in [`MAX_EARLIER`]. Each is hidden
    /// also as it reads once escaped: inside a JSON string (`\"`, `\\`, and `\u00e9` as
    /// Python writes what is not ASCII), percent-decoded (a URL's password as a server
    /// that parsed the URL prints it) and percent-encoded (a key a server put in a URL).
    pub(crate) fn in_order(newest_first: Vec<String>, own: usize) -> Self {
        let mut seen = std::collections::HashSet::new();
        let (mut earlier, mut bytes) = (0, 0);
        let mut kept = Vec::new();
        for (i, value) in newest_first.into_iter().enumerate() {
            if seen.contains(&value) {
                continue;
            }
            if i >= own {
                if earlier == MAX_EARLIER.0 || bytes + value.len() > MAX_EARLIER.1 {
                    continue;
                }
                (earlier, bytes) = (earlier + 1, bytes + value.len());
            }
            seen.insert(value.clone());
            kept.push(value);
        }
        let mut values: Vec<String> = kept.iter().flat_map(|v| as_written(v)).collect();
        values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        values.dedup();
        Self { values: values.into(), newest_first: kept.into() }
    }

    /// `newer`'s secrets, and this set's too, as earlier ones: a reload keeps hiding the
    /// old secrets, which may be in text written before it, up to [`MAX_EARLIER`] (the
    /// most recent first).
    pub fn union(&self, newer: &Secrets) -> Secrets {
        let all = newer.newest_first.iter().chain(self.newest_first.iter()).cloned().collect();
        Self::in_order(all, newer.newest_first.len())
    }

    /// The length of the longest secret, in bytes.
    pub fn longest(&self) -> usize {
        self.values.first().map_or(0, String::len)
    }

    /// `text` with every secret replaced by `[redacted]`.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for secret in self.values.iter() {
            if out.contains(secret.as_str()) {
                out = Cow::Owned(out.replace(secret.as_str(), MASK));
            }
        }
        out
    }

    /// Redacts every string (and object key) inside `value`.
    pub fn redact_json(&self, value: &mut Value) {
        if !self.values.is_empty() {
            self.redact_json_within(value, usize::MAX);
        }
    }

    /// [`Self::redact_json`], each string also cut to at most `max` bytes
    /// ([`Self::redact_capped`]).
    pub fn redact_json_within(&self, value: &mut Value, max: usize) {
        match value {
            Value::String(s) => {
                if s.len() > max {
                    *s = self.redact_capped(s, max);
                } else if let Cow::Owned(r) = self.redact(s) {
                    *s = r;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_json_within(v, max)),
            Value::Object(map) => {
                let entries = std::mem::take(map);
                for (k, mut v) in entries {
                    self.redact_json_within(&mut v, max);
                    map.insert(self.redact(&k).into_owned(), v);
                }
            }
            _ => {}
        }
    }

    /// `text` redacted and cut to at most `max` bytes (and `…`), searching only what may
    /// be kept: no secret is left, nor the start of one the cut goes through. What is
    /// hidden is found on the text as it is (each secret's every occurrence, and at the
    /// cut the longest end that starts a secret), then each run of it is masked once, so
    /// that no replacement moves what the cut is measured on.
    pub fn redact_capped(&self, text: &str, max: usize) -> String {
        let window = text.floor_char_boundary(max.saturating_add(self.longest()));
        let head = &text[..window];
        let mut hidden = vec![false; head.len()];
        for secret in self.values.iter() {
            for (at, _) in head.match_indices(secret.as_str()) {
                hidden[at..at + secret.len()].fill(true);
            }
        }
        if window < text.len() {
            let cut_through = (window.saturating_sub(self.longest())..window).find(|&at| {
                let end = &head.as_bytes()[at..];
                self.values.iter().any(|secret| secret.len() > end.len() && secret.as_bytes().starts_with(end))
            });
            if let Some(at) = cut_through {
                hidden[at..].fill(true);
            }
        }
        let mut kept = String::with_capacity(head.len());
        let mut at = 0;
        while at < head.len() {
            let run = hidden[at..].iter().position(|h| *h != hidden[at]).map_or(head.len(), |n| at + n);
            kept.push_str(if hidden[at] { MASK } else { &head[at..run] });
            at = run;
        }
        if kept.len() > max || window < text.len() {
            kept.truncate(kept.floor_char_boundary(max));
            kept.push('…');
        }
        kept
    }
}

/// The secrets hidden now, shared: what a reload adds is hidden at once from everything
/// that holds it, a call that began before the reload included (its report, its trace).
#[derive(Debug, Clone, Default)]
pub struct Current(Arc<RwLock<Secrets>>);

impl Current {
    pub fn new(secrets: Secrets) -> Self {
        Self(Arc::new(RwLock::new(secrets)))
    }

    pub fn get(&self) -> Secrets {
        self.0.reading().clone()
    }

    pub fn set(&self, secrets: Secrets) {
        *self.0.writing() = secrets;
    }
}

static FOR_LOGS: RwLock<Option<Secrets>> = RwLock::new(None);

/// From now on, every log line written through [`LogLine`] is redacted with
/// `secrets`. Set when the configuration is loaded, and again on each reload.
pub fn redact_logs(secrets: Secrets) {
    *FOR_LOGS.writing() = Some(secrets);
}

/// The most a line of the gateway's log takes: a server's error text can be 64 MiB, and
/// the lines waiting for stderr are counted, not weighed.
pub const MAX_LOG_LINE: usize = 8 * 1024;

/// A log line on its way out, written to `W` as it should read: redacted (libraries log
/// too, and rmcp quotes an upstream's URL, query and all, when it cannot connect), on one
/// line (a line break or terminal escape in a server's text, which many log lines quote,
/// is written out, so that it can forge no line of the log), and at most
/// [`MAX_LOG_LINE`] bytes. `tracing-subscriber` formats an event whole and writes it in
/// one call, so this sees each line whole, before it is queued.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogLine<W>(pub W);

impl<W: Write> Write for LogLine<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let secrets = FOR_LOGS.reading().clone();
        self.0.write_all(as_logged(buf, secrets.as_ref()).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// `line` as [`LogLine`] writes it with `secrets` hidden, ending in one line break.
fn as_logged(line: &[u8], secrets: Option<&Secrets>) -> String {
    let line = String::from_utf8_lossy(line);
    let line = line.strip_suffix('\n').unwrap_or(&line);
    let redacted = match secrets {
        Some(secrets) => Cow::Owned(secrets.redact_capped(line, MAX_LOG_LINE)),
        None => Cow::Borrowed(line),
    };
    let mut logged = crate::text::shown(&redacted, MAX_LOG_LINE);
    logged.push('\n');
    logged
}

/// What a URL's encoders leave as it is: RFC 3986's unreserved characters, and `/` too
/// for a path's (Python's `quote`).
const UNRESERVED: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');
const UNRESERVED_AND_SLASH: &percent_encoding::AsciiSet = &UNRESERVED.remove(b'/');

/// `secret` as it reads written plainly and written escaped (see [`Secrets::in_order`]).
fn as_written(secret: &str) -> Vec<String> {
    let mut forms = vec![secret.to_owned()];
    let json = serde_json::to_string(secret).unwrap_or_default();
    let json = json.get(1..json.len().saturating_sub(1)).unwrap_or_default().to_owned();
    if !json.is_ascii() {
        let mut ascii = String::new();
        for c in json.chars() {
            match c {
                ' '..='~' => ascii.push(c),
                _ => c.encode_utf16(&mut [0; 2]).iter().for_each(|u| ascii.push_str(&format!("\\u{u:04x}"))),
            }
        }
        forms.push(ascii);
    }
    forms.push(json);
    if let Ok(decoded) = percent_encoding::percent_decode_str(secret).decode_utf8() {
        forms.push(decoded.into_owned());
    }
    // And percent-encoded, as a server that puts it in a URL writes it (`+` and `/` of a
    // cloud provider's key as `%2B` and `%2F`), by an encoder that keeps `/` or not.
    for kept in [UNRESERVED, UNRESERVED_AND_SLASH] {
        forms.push(percent_encoding::utf8_percent_encode(secret, kept).to_string());
    }
    forms.retain(|f| f.len() >= 3);
    forms.sort();
    forms.dedup();
    forms
}

/// What is secret in a URL that is not an upstream's own (a database's in a variable):
/// its password, and its query values named like secrets or long and no path or number
/// (not its user name, nor `?sslmode=disable`, which would garble every text they are in).
fn url_secrets(url: &str) -> Vec<&str> {
    let (authority, path) = authority_and_rest(url);
    let mut found = Vec::new();
    if let Some((userinfo, _)) = authority.rsplit_once('@')
        && let Some((_, password)) = userinfo.split_once(':')
        && password.len() >= 3
    {
        found.push(password);
    }
    found.extend(query_pairs(path).filter(|(key, value)| looks_secret(key, value)).map(|(_, value)| value));
    found
}

/// The `key=value` pairs of the query in `rest` (what follows a URL's authority).
fn query_pairs(rest: &str) -> impl Iterator<Item = (&str, &str)> {
    let query = rest.split_once('?').map(|(_, q)| q.split('#').next().unwrap_or_default()).unwrap_or_default();
    query.split('&').filter_map(|pair| pair.split_once('='))
}

/// `url`'s authority (`user:password@host:port`) and what follows it (`/path?query`, or
/// `?query` alone: `https://host?key=…` has no path).
fn authority_and_rest(url: &str) -> (&str, &str) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()))
}

/// The user, password and query values of `url`.
fn url_credentials(url: &str) -> Vec<&str> {
    let (authority, path) = authority_and_rest(url);
    let mut found = Vec::new();
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        found.extend(userinfo.split(':').filter(|s| !s.is_empty()));
    }
    found.extend(query_pairs(path).map(|(_, value)| value).filter(|v| !v.is_empty()));
    found
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// Each reload that rotates a token keeps the old one hidden, but not for ever: past
    /// the bound, the oldest go first, and the current configuration's never do.
    #[test]
    fn earlier_secrets_are_kept_up_to_a_bound_newest_first() {
        let config =
            |n: usize| Secrets::in_order(vec![format!("token-number-{n:04}"), "shared-secret".into()], usize::MAX);
        let mut hidden = config(0);
        for n in 1..=2 * MAX_EARLIER.0 {
            hidden = hidden.union(&config(n));
        }
        let newest = 2 * MAX_EARLIER.0;
        assert_eq!(hidden.values.len(), 2 + MAX_EARLIER.0);
        assert_eq!(hidden.redact(&format!("token-number-{newest:04}")), MASK);
        assert_eq!(hidden.redact("shared-secret"), MASK);
        assert_eq!(hidden.redact(&format!("token-number-{:04}", newest - MAX_EARLIER.0)), MASK);
        let oldest = format!("token-number-{:04}", newest - MAX_EARLIER.0 - 1);
        assert_eq!(hidden.redact(&oldest), oldest, "past the bound");
        // In bytes too: one huge earlier value does not crowd out the current ones.
        let huge = Secrets::in_order(vec!["x".repeat(MAX_EARLIER.1 + 1)], usize::MAX);
        let hidden = huge.union(&config(1));
        assert_eq!(hidden.values.len(), 2);
        assert_eq!(config(1).union(&huge).values.len(), 3, "a current value is kept whatever its size");
    }

    /// A server's text in a log line can neither forge another line, nor fill the queue
    /// with a 64 MiB line, nor leave the start of a secret where the line is cut.
    #[test]
    fn a_log_line_is_one_line_redacted_and_bounded() {
        let forged = b"2026-11-29 WARN call failed: oops\n2026-11-29 ERROR rebound: forged\x1b[2J\n";
        assert_eq!(
            as_logged(forged, None),
            "2026-11-29 WARN call failed: oops\\n2026-11-29 ERROR rebound: forged\\u{1b}[2J\n"
        );
        let huge = format!("WARN call failed: {}\n", "x".repeat(64 << 20));
        let logged = as_logged(huge.as_bytes(), None);
        assert!(logged.len() <= MAX_LOG_LINE + 8, "{} bytes", logged.len());
        assert!(logged.ends_with("…\n"));
        let secrets = Secrets::in_order(vec!["hunter2-the-long-secret".into()], usize::MAX);
        for at in MAX_LOG_LINE - 30..MAX_LOG_LINE + 5 {
            let line = format!("{}hunter2-the-long-secret and more\n", "y".repeat(at));
            let logged = as_logged(line.as_bytes(), Some(&secrets));
            assert!(!logged.contains("hunter2-"), "the secret's start is kept when it begins at {at}");
            assert!(logged.len() <= MAX_LOG_LINE + 8 && logged.ends_with('\n'));
        }
        assert_eq!(as_logged(b"fine hunter2-the-long-secret\n", Some(&secrets)), format!("fine {MASK}\n"));
    }

    /// A secret reads as a server may print it: escaped inside JSON (Python escapes what
    /// is not ASCII too), or percent-decoded from the URL it came in.
    #[test]
    fn a_secret_is_hidden_as_written_escaped_or_decoded() {
        let s = Secrets::in_order(vec!["pa\"ss-wörd".into(), "p%40ssw0rd".into()], usize::MAX);
        assert_eq!(s.redact(r#"{"pw": "pa\"ss-wörd"}"#), r#"{"pw": "[redacted]"}"#);
        assert_eq!(s.redact(r#"{"pw": "pa\"ss-w\u00f6rd"}"#), r#"{"pw": "[redacted]"}"#);
        assert_eq!(s.redact("login with p@ssw0rd"), "login with [redacted]");
        // A key with `+`, `/` and `=` in it, as a server writes it in a URL.
        let s = Secrets::in_order(vec!["ab+c/d=xyz12345".into()], usize::MAX);
        assert_eq!(s.redact("GET /q?key=ab%2Bc%2Fd%3Dxyz12345&x=1"), "GET /q?key=[redacted]&x=1");
        assert_eq!(s.redact("GET /ab%2Bc/d%3Dxyz12345/x"), "GET /[redacted]/x");
        // A URL in an `env` value, and short passwords by their name.
        let s = secrets(
            r#"{"mcpServers": {"a": {"command": "a", "env": {"DATABASE_URL": "postgres://me:hunter22@db/app", "DB_PW": "hunter2"}}}}"#,
        );
        assert_eq!(s.redact("auth failed for me:hunter22 at db:5432"), "auth failed for me:[redacted] at db:5432");
        assert_eq!(s.redact("bad password hunter2"), "bad password [redacted]");
        // Not the URL's user or plain settings, nor the shell's folder or a flag.
        let s = secrets(
            r#"{"mcpServers": {"postgres": {"command": "a", "env": {"DATABASE_URL": "postgres://postgres:hunter22@db/app?sslmode=disable",
                "PWD": "/home/me/project", "PRIVATE_MODE": "true"}}}}"#,
        );
        let said = "postgres at /home/me/project with sslmode=disable, private mode true";
        assert_eq!(s.redact(said), said);
        // A query with no path before it; a flag under a secret-sounding key is no secret.
        let s = secrets(
            r#"{"mcpServers": {"a": {"url": "https://mcp.example.com?api_key=S3CR3T"},
                "b": {"command": "b", "env": {"DB": "mysql://u:p4ss@db/app?allowPublicKeyRetrieval=true"}}}}"#,
        );
        assert_eq!(
            s.redact("GET https://mcp.example.com/?api_key=S3CR3T"),
            "GET https://mcp.example.com/?api_key=[redacted]"
        );
        assert_eq!(s.redact("p4ss true"), "[redacted] true");
    }

    /// Cut to a size, a text is searched only as far as it is kept, and a secret the cut
    /// goes through leaves none of its start.
    #[test]
    fn a_long_text_is_cut_without_leaving_part_of_a_secret() {
        let secret = "abcdefghijkl";
        let s = Secrets::in_order(vec![secret.into()], usize::MAX);
        let inside = format!("{secret}{}", "y".repeat(200));
        assert!(s.redact_capped(&inside, 100).starts_with("[redacted]y"));
        for at in 90..110 {
            let text = format!("{}{secret}{}", "x".repeat(at), "y".repeat(200));
            let cut = s.redact_capped(&text, 100);
            assert!(cut.len() <= 100 + '…'.len_utf8() && cut.ends_with('…'), "{at}: {cut}");
            assert!(!cut.contains("abc"), "{at}: {cut}");
        }
        assert_eq!(s.redact_capped("short abcdefghijkl", 100), "short [redacted]");
        // A short secret inside the start of a long one that the cut goes through, the
        // long one also earlier in the text: nothing that is measured moves.
        let s = Secrets::in_order(vec![secret.into(), "ghi".into()], usize::MAX);
        for at in 90..112 {
            let text = format!("{secret}{}{secret}{}", "x".repeat(at - secret.len()), "y".repeat(200));
            let cut = s.redact_capped(&text, 100);
            assert!(!cut.contains("abc") && !cut.contains("ghi"), "{at}: {cut}");
            assert!(cut.starts_with("[redacted]x"), "{at}: {cut}");
        }
    }

    fn secrets(json: &str) -> Secrets {
        Secrets::of(&crate::config::parse(json, Path::new("/x/rebound.json"), &|_| None).unwrap())
    }

    /// A secret-named variable's value passed as an argument is hidden, and so are the
    /// credentials of a URL another variable holds; the rest of another's is not.
    #[test]
    fn a_secret_variable_passed_as_an_argument_is_hidden() {
        let env = |name: &str| match name {
            "GH_TOKEN" => Some("ghp_x".to_owned()),
            "HOME" => Some("/home/me".to_owned()),
            "PROJECT_ID" => Some("my-project-42".to_owned()),
            _ => None,
        };
        let env = |name: &str| match name {
            "DATABASE_URL" => Some("postgres://me:hunter22@db/app".to_owned()),
            other => env(other),
        };
        let json = r#"{"mcpServers": {"a": {"command": "a",
            "args": ["--token", "${GH_TOKEN}", "--home", "${HOME}", "--project", "${PROJECT_ID}", "${DATABASE_URL}"]}}}"#;
        let s = Secrets::of(&crate::config::parse(json, Path::new("/x/rebound.json"), &env).unwrap());
        assert_eq!(
            s.redact("auth ghp_x failed in /home/me for my-project-42 at postgres://me:hunter22@db/app"),
            "auth [redacted] failed in /home/me for my-project-42 at postgres://me:[redacted]@db/app"
        );
    }

    #[test]
    fn env_and_header_values_are_hidden_but_short_flags_and_paths_are_not() {
        let s = secrets(
            r#"{"mcpServers": {
                "a": {"command": "a", "env": {"API_KEY": "abc", "DEBUG": "1", "LONG_SETTING": "x0123456789",
                      "PROJECT": "/home/me/project", "TIMEOUT_MS": "1200000"}},
                "b": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer tok-42"}},
                "c": {"url": "https://me:hunter22@h/mcp?api_key=k-9876&x=1"}
            }}"#,
        );
        let text =
            "key abc, debug 1, setting x0123456789, header Bearer tok-42, bare tok-42, in /home/me/project, 1200000";
        assert_eq!(
            s.redact(text),
            "key [redacted], debug 1, setting [redacted], header [redacted], bare [redacted], in /home/me/project, 1200000"
        );
        assert_eq!(
            s.redact("at https://me:hunter22@h/mcp?api_key=k-9876"),
            "at https://me:[redacted]@h/mcp?api_key=[redacted]"
        );
        let mut v = serde_json::json!({"last_error": ["crashed: API_KEY=abc"], "abc": 1});
        s.redact_json(&mut v);
        assert_eq!(v, serde_json::json!({"last_error": ["crashed: API_KEY=[redacted]"], "[redacted]": 1}));
    }
}
