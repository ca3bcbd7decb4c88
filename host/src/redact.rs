//! Secrets in the configuration (server `env` and `headers` values, the gateway's own
//! token) never leave the gateway: every text that does — `rebound_status`, the errors
//! log, reports to the agent, log lines about servers — goes through [`Secrets::redact`].
//! A server that prints its API key on stderr as it crashes would otherwise put the key
//! into `last_error`.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::Value;

use crate::config::{Config, Launch};

const MASK: &str = "[redacted]";

/// Names that mark a value as secret whatever its length.
const SECRET_NAMES: &[&str] = &["token", "key", "secret", "pass", "auth", "credential", "cookie"];

/// The values to hide, longest first so that a secret containing another goes whole.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    values: Arc<[String]>,
}

impl Secrets {
    /// The secrets of `config`. Every header value counts, and every environment value of
    /// 8 characters or more or with a secret-sounding name; short values like `1` or `true`
    /// would only garble the text around them.
    pub fn of(config: &Config) -> Self {
        let mut values = Vec::new();
        let mut add = |name: &str, value: &str| {
            let lower = name.to_ascii_lowercase();
            let named = SECRET_NAMES.iter().any(|n| lower.contains(n));
            if value.len() >= 8 || (named && value.len() >= 3) {
                values.push(value.to_owned());
            }
            // `Bearer TOKEN`, `Basic CREDENTIALS`: the credential alone is secret too.
            if let Some((_, credential)) = value.split_once(' ')
                && named
                && credential.len() >= 3
            {
                values.push(credential.to_owned());
            }
        };
        for server in config.servers.values() {
            match &server.launch {
                Launch::Stdio(s) => s.env.iter().for_each(|(k, v)| add(k, v)),
                Launch::Http(h) => h.headers.iter().for_each(|(k, v)| add(&format!("{k}-auth"), v)),
            }
        }
        if let Some(token) = &config.settings.http.auth_token {
            add("token", token);
        }
        values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        values.dedup();
        Self { values: values.into() }
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
        if self.values.is_empty() {
            return;
        }
        match value {
            Value::String(s) => {
                if let Cow::Owned(r) = self.redact(s) {
                    *s = r;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_json(v)),
            Value::Object(map) => {
                let entries = std::mem::take(map);
                for (k, mut v) in entries {
                    self.redact_json(&mut v);
                    map.insert(self.redact(&k).into_owned(), v);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn secrets(json: &str) -> Secrets {
        Secrets::of(&crate::config::parse(json, Path::new("/x/rebound.json"), &|_| None).unwrap())
    }

    #[test]
    fn env_and_header_values_are_hidden_but_short_flags_are_not() {
        let s = secrets(
            r#"{"mcpServers": {
                "a": {"command": "a", "env": {"API_KEY": "abc", "DEBUG": "1", "LONG_SETTING": "0123456789"}},
                "b": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer tok-42"}}
            }}"#,
        );
        let text = "key abc, debug 1, setting 0123456789, header Bearer tok-42, bare tok-42";
        assert_eq!(s.redact(text), "key [redacted], debug 1, setting [redacted], header [redacted], bare [redacted]");
        let mut v = serde_json::json!({"last_error": ["crashed: API_KEY=abc"], "abc": 1});
        s.redact_json(&mut v);
        assert_eq!(v, serde_json::json!({"last_error": ["crashed: API_KEY=[redacted]"], "[redacted]": 1}));
    }
}
