//! Reading and validating a configuration file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::error::ConfigError;
use super::model::{
    AdapterGrant, Config, HttpLaunch, HttpSettings, Launch, MAX_TRUSTED_PROXIES, Protocol, RecoveryConfig,
    RestartPolicy, SESSION_VAR, Scope, ServerConfig, Settings, StdioLaunch, ToolNames, ToolPattern, proxy_block,
};

/// Keys a server entry may carry: the ones Claude Desktop, Claude Code and Cursor use,
/// and Rebound's additions.
/// Headers the streamable HTTP transport sets itself.
const RESERVED_HEADERS: &[&str] =
    &["accept", "content-type", "mcp-session-id", "mcp-protocol-version", "last-event-id"];

const SERVER_KEYS: &[&str] = &[
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "type",
    "disabled",
    "adapter",
    "recovery",
    "adapter_config",
    "adapter_allow",
    "scope",
    "protocol",
];

/// The `rebound` object, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawSettings {
    plugins_dir: Option<PathBuf>,
    errors_log: Option<PathBuf>,
    tool_names: ToolNames,
    startup_timeout_ms: Option<u64>,
    gateway_tools: Option<bool>,
    plugin_timeout_ms: Option<u64>,
    plugin_memory_mb: Option<usize>,
    plugin_max_calls: Option<u32>,
    plugin_cache_dir: Option<PathBuf>,
    plugin_compile_timeout_ms: Option<u64>,
    errors_log_max_bytes: Option<u64>,
    init_timeout_ms: Option<u64>,
    restart: RestartPolicy,
    http: HttpSettings,
    defaults: RawDefaults,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawDefaults {
    recovery: Map<String, Value>,
}

/// The largest configuration file read: a thousand servers' entries fit many times over.
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// The most servers one configuration runs.
pub const MAX_SERVERS: usize = 1024;

/// The most `rebound.defaults.recovery` may take, written out: every server gets a copy.
const MAX_DEFAULTS_BYTES: usize = 64 << 10;

/// The most the `${VAR}`s of one configuration may expand to, together: a variable can be
/// referred to many times, and its value may be long.
const MAX_EXPANDED_BYTES: usize = 4 * MAX_CONFIG_BYTES as usize;

/// Reads and validates the configuration at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = read(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    parse(&text, &absolute, &|name| std::env::var(name).ok())
}

/// The text of the regular file at `path`, of at most [`MAX_CONFIG_BYTES`]. Opened without
/// waiting (a FIFO put where the file was, as a reload may find, would hold the open until
/// someone writes to it), and read no further than one byte past the bound.
fn read(path: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_NONBLOCK).open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        let what = if kind.is_dir() { "a folder" } else { "not a regular file (a FIFO, a socket or a device)" };
        return Err(std::io::Error::other(format!("it is {what}")));
    }
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(std::io::Error::other(format!("it is larger than {} MiB", MAX_CONFIG_BYTES >> 20)));
    }
    Ok(text)
}

/// Validates configuration text as if read from `path`, expanding `${VAR}` and
/// `${VAR:-default}` in commands, arguments, environment values, working folders, URLs and headers through
/// `env` (as Claude Code does).
pub fn parse(text: &str, path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    let mut root = object(text, path)?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let ctx = Ctx { path, env, expanded: Default::default(), expanded_bytes: Default::default() };
    let mut warnings = Vec::new();
    for key in root.keys().filter(|k| !matches!(k.as_str(), "rebound" | "mcpServers")) {
        // A section written almost right would leave every setting at its default unseen
        // (an operator token among them).
        let near = |name: &str| squashed(key) == squashed(name);
        if let Some(meant) = ["rebound", "mcpServers"].into_iter().find(|name| near(name)) {
            let hint = format!("write it `{meant}`");
            return Err(ConfigError::invalid(
                path,
                key.as_str(),
                format!("not a key Rebound knows; `{meant}` is"),
                hint,
            ));
        }
        warnings.push(format!(
            "{}: `{key}` is not a key Rebound reads (it reads `mcpServers` and `rebound`); it is ignored",
            path.display()
        ));
    }

    let raw: RawSettings = match root.remove("rebound") {
        Some(v) => ctx.typed("rebound", v)?,
        None => RawSettings::default(),
    };
    let defaults = Value::Object(raw.defaults.recovery.clone());
    if serde_json::to_vec(&defaults).map_or(usize::MAX, |t| t.len()) > MAX_DEFAULTS_BYTES {
        return Err(ctx.err(
            "rebound.defaults.recovery",
            format!("is past the most it may take, {} KiB written out: every server gets a copy", MAX_DEFAULTS_BYTES >> 10),
            "keep the settings many servers share here, and a server's own tools and fallbacks under its own `recovery`",
        ));
    }
    // Checked alone so that a mistake in the defaults is reported where it is written (the
    // keys' relations, `initial_delay_ms` to `max_delay_ms` and the like, only once a
    // server's own keys are over them).
    let alone: RecoveryConfig = ctx.typed("rebound.defaults.recovery", defaults.clone())?;
    ctx.check_bounds("rebound.defaults.recovery", &alone)?;
    ctx.check_ratios("rebound.defaults.recovery", &alone)?;

    let plugins_dir = resolve(&base, raw.plugins_dir.clone().unwrap_or_else(|| "target/plugins".into()));
    let servers = ctx.servers(root.remove("mcpServers"), &defaults, &base, &plugins_dir, &mut warnings)?;
    ctx.check_references(&servers)?;
    let settings = ctx.settings(raw, &base, plugins_dir)?;
    Ok(Config { source: path.to_path_buf(), servers, settings, warnings, expanded: ctx.expanded.take() })
}

/// `key` lower-cased, without `_` and `-`: how far apart two spellings of a name are.
fn squashed(key: &str) -> String {
    key.chars().filter(|c| !matches!(c, '_' | '-')).flat_map(char::to_lowercase).collect()
}

/// The server key `key` was surely meant to be: one written in another case or with other
/// separators (`adapterConfig`), or one letter off (`arg`, `adpater`, `uri`).
fn meant_server_key(key: &str) -> Option<&'static str> {
    let key = squashed(key);
    // Short for one key, one letter off another.
    if key == "cmd" {
        return Some("command");
    }
    SERVER_KEYS.iter().copied().find(|known| {
        let known = squashed(known);
        key == known || (key.len() >= 3 && strsim::damerau_levenshtein(&key, &known) <= 1)
    })
}

/// The file's JSON, which must be an object.
fn object(text: &str, path: &Path) -> Result<serde_json::Map<String, Value>, ConfigError> {
    let root: Value = serde_json::from_str(text).map_err(|e| ConfigError::Syntax {
        path: path.to_path_buf(),
        line: e.line(),
        column: e.column(),
        message: strip_position(&e.to_string()),
    })?;
    let Value::Object(root) = root else {
        return Err(ConfigError::invalid(
            path,
            "(top level)",
            "the file is not a JSON object",
            r#"start from {"mcpServers": {"NAME": {"command": "...", "args": []}}}"#,
        ));
    };
    Ok(root)
}

impl Ctx<'_> {
    /// Every server of `mcpServers` (`servers`) that is not disabled, in file order, with
    /// the warnings for keys Rebound does not know and for disabled servers.
    fn servers(
        &self,
        servers: Option<Value>,
        defaults: &Value,
        base: &Path,
        plugins_dir: &Path,
        warnings: &mut Vec<String>,
    ) -> Result<IndexMap<String, ServerConfig>, ConfigError> {
        let mut resolved = IndexMap::new();
        for (name, entry) in self.server_entries(servers)? {
            let key = format!("mcpServers.{name}");
            validate_server_name(self, &key, &name)?;
            let Value::Object(entry) = entry else {
                return Err(ConfigError::invalid(
                    self.path,
                    key,
                    "must be an object",
                    r#"write {"command": "...", "args": []} or {"url": "https://..."}"#,
                ));
            };
            if !self.enabled(&key, &entry, warnings)? {
                continue;
            }
            let server = self.server(&key, &name, entry, defaults, base, plugins_dir)?;
            resolved.insert(name, server);
        }
        Ok(resolved)
    }

    /// `mcpServers`, which must be an object of at most [`MAX_SERVERS`] entries.
    fn server_entries(&self, servers: Option<Value>) -> Result<serde_json::Map<String, Value>, ConfigError> {
        let path = self.path;
        let servers = match servers {
            Some(Value::Object(servers)) => servers,
            Some(_) => {
                return Err(ConfigError::invalid(
                    path,
                    "mcpServers",
                    "must be an object mapping server names to their settings",
                    r#"write "mcpServers": {"NAME": {"command": "...", "args": []}}"#,
                ));
            }
            None => {
                return Err(ConfigError::invalid(
                    path,
                    "mcpServers",
                    "missing: the file names no servers",
                    r#"add "mcpServers": {"NAME": {"command": "...", "args": []}}, the same shape as Claude Desktop's config"#,
                ));
            }
        };
        if servers.len() > MAX_SERVERS {
            return Err(ConfigError::invalid(
                path,
                "mcpServers",
                format!("names {} servers, past the most one gateway runs, {MAX_SERVERS}", servers.len()),
                "split them across gateways, each with a configuration of its own",
            ));
        }
        Ok(servers)
    }

    /// Whether the server `key` (its `entry`) is not disabled; its keys Rebound does not
    /// know are warned of, and one that is a known key misspelt is refused.
    fn enabled(
        &self,
        key: &str,
        entry: &serde_json::Map<String, Value>,
        warnings: &mut Vec<String>,
    ) -> Result<bool, ConfigError> {
        let path = self.path;
        for k in entry.keys().filter(|k| !SERVER_KEYS.contains(&k.as_str())) {
            // A known key misspelt would leave its setting unseen (`arg`, `adpater`):
            // refused. Anything else may be another client's, passed over.
            if let Some(meant) = meant_server_key(k) {
                let hint = format!("write it `{meant}`");
                return Err(ConfigError::invalid(path, format!("{key}.{k}"), "is not a key Rebound knows", hint));
            }
            warnings.push(format!("{}: `{key}.{k}` is not a key Rebound knows; it is ignored", path.display()));
        }
        match entry.get("disabled") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(true),
            Some(Value::Bool(true)) => {
                warnings.push(format!("{}: `{key}` is disabled", path.display()));
                Ok(false)
            }
            Some(disabled) => Err(ConfigError::invalid(
                path,
                format!("{key}.disabled"),
                format!("must be true or false, not {disabled}"),
                r#"write "disabled": true"#,
            )),
        }
    }

    /// Every server an adapter's allowed tools or a fallback names is one of `servers`.
    fn check_references(&self, servers: &IndexMap<String, ServerConfig>) -> Result<(), ConfigError> {
        let known = || servers.keys().map(String::as_str).collect::<Vec<_>>().join(", ");
        for (name, server) in servers {
            for (i, pattern) in server.adapter_allow.tools.iter().enumerate() {
                let literal = pattern.to_string();
                let server_part = literal.split_once('/').map_or("", |(s, _)| s);
                if !server_part.contains('*') && !servers.contains_key(server_part) {
                    return Err(self.err(
                        format!("mcpServers.{name}.adapter_allow.tools[{i}]"),
                        format!("\"{literal}\" names no configured server"),
                        format!("start the pattern with one of: {} (or `*`)", known()),
                    ));
                }
            }
            for (tool, alternatives) in &server.recovery.fallbacks {
                for (i, alt) in alternatives.iter().enumerate() {
                    if let Some(other) = alt.server.as_deref().filter(|o| !servers.contains_key(*o)) {
                        return Err(self.err(
                            format!("mcpServers.{name}.recovery.fallbacks.{tool}[{i}].server"),
                            format!("no server named \"{other}\""),
                            format!("name one of the configured servers: {}", known()),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The `rebound` key's settings, defaults filled in and bounds applied.
    fn settings(&self, raw: RawSettings, base: &Path, plugins_dir: PathBuf) -> Result<Settings, ConfigError> {
        self.bounded(&raw)?;
        let plugin_cache_dir = raw.plugin_cache_dir.map(|d| resolve(base, d));
        if let Some(cache) = plugin_cache_dir.as_deref().filter(|c| within(c, &plugins_dir)) {
            return Err(self.err(
                "rebound.plugin_cache_dir",
                format!("{} is in the plugins folder {}", cache.display(), plugins_dir.display()),
                "compiled code in the cache is run as it is: keep it apart from the folder adapters are dropped in (leave the key out for ~/.cache/rebound/plugins)",
            ));
        }
        Ok(Settings {
            plugins_dir,
            errors_log: resolve(base, raw.errors_log.unwrap_or_else(|| "rebound-errors.jsonl".into())),
            tool_names: raw.tool_names,
            startup_timeout_ms: raw.startup_timeout_ms.unwrap_or(30_000),
            init_timeout_ms: raw.init_timeout_ms.unwrap_or(60_000),
            gateway_tools: raw.gateway_tools.unwrap_or(true),
            plugin_timeout_ms: raw.plugin_timeout_ms.unwrap_or(200),
            plugin_memory_mb: raw.plugin_memory_mb.unwrap_or(32),
            plugin_max_calls: raw.plugin_max_calls.unwrap_or(8),
            plugin_cache_dir,
            plugin_compile_timeout_ms: raw.plugin_compile_timeout_ms.unwrap_or(60_000),
            errors_log_max_bytes: raw.errors_log_max_bytes.unwrap_or(10 << 20),
            restart: raw.restart,
            http: self.http_settings(raw.http)?,
        })
    }
}

/// Whether folder `inner` is `outer` or inside it, links followed where they exist: a
/// compiled-code cache there would run as native code whatever is dropped in with the
/// adapters.
pub fn within(inner: &Path, outer: &Path) -> bool {
    followed(inner).starts_with(followed(outer))
}

/// `path`, absolute, its `..` taken back and its links followed where they exist, one
/// folder at a time.
pub fn followed(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let mut real = PathBuf::new();
    for part in absolute.components() {
        match part {
            std::path::Component::ParentDir => {
                real.pop();
            }
            std::path::Component::CurDir => {}
            part => {
                real.push(part);
                if real.is_symlink()
                    && let Ok(target) = real.canonicalize()
                {
                    real = target;
                }
            }
        }
    }
    real
}

/// A number setting's key, its value if set, its bounds, those bounds in words, and its
/// default in words.
type Bounded<'a> = (&'a str, Option<u64>, std::ops::RangeInclusive<u64>, &'a str, &'a str);

struct Ctx<'a> {
    path: &'a Path,
    env: &'a dyn Fn(&str) -> Option<String>,
    /// The variables expanded so far, with their values.
    expanded: std::cell::RefCell<Vec<(String, String)>>,
    /// What they expanded to, together, in bytes ([`MAX_EXPANDED_BYTES`]).
    expanded_bytes: std::cell::Cell<usize>,
}

impl Ctx<'_> {
    fn err(&self, key: impl Into<String>, message: impl Into<String>, hint: impl Into<String>) -> ConfigError {
        ConfigError::invalid(self.path, key, message, hint)
    }

    /// Deserializes `value`, reporting the exact key path of a mismatch.
    fn typed<T: DeserializeOwned>(&self, prefix: &str, value: Value) -> Result<T, ConfigError> {
        serde_path_to_error::deserialize(value).map_err(|e| {
            let inner = e.path().to_string();
            let key = if inner == "." { prefix.to_owned() } else { format!("{prefix}.{inner}") };
            let message = e.into_inner().to_string();
            let hint = if message.starts_with("unknown field") {
                "remove the key or correct its spelling".to_owned()
            } else {
                "give the value the type shown above".to_owned()
            };
            self.err(key, message, hint)
        })
    }

    fn server(
        &self,
        key: &str,
        name: &str,
        mut entry: Map<String, Value>,
        defaults: &Value,
        base: &Path,
        plugins_dir: &Path,
    ) -> Result<ServerConfig, ConfigError> {
        let launch = self.launch(key, &mut entry, base)?;
        self.no_other_transports_keys(key, &launch, &entry)?;
        let adapter = self.adapter(key, entry.remove("adapter"), plugins_dir)?;
        let recovery = self.recovery(key, entry.remove("recovery"), defaults)?;
        let server = ServerConfig {
            name: name.to_owned(),
            launch,
            adapter,
            recovery,
            adapter_config: entry.remove("adapter_config").unwrap_or(Value::Null),
            adapter_allow: self.grant(&format!("{key}.adapter_allow"), name, entry.remove("adapter_allow"))?,
            scope: self.scope(&format!("{key}.scope"), entry.remove("scope"))?,
            protocol: self.protocol(&format!("{key}.protocol"), entry.remove("protocol"))?,
        };
        if server.scope == Scope::Shared && server.mentions_session() {
            return Err(self.err(
                key,
                format!("uses {SESSION_VAR}, which only a server with one instance per client session has"),
                r#"add "scope": "session", or remove ${REBOUND_SESSION}"#,
            ));
        }
        Ok(server)
    }

    /// How the server is reached: `command` (stdio) or `url` (streamable HTTP), one of
    /// them, agreeing with `type` if given.
    fn launch(&self, key: &str, entry: &mut Map<String, Value>, base: &Path) -> Result<Launch, ConfigError> {
        let kind = match entry.remove("type") {
            None => None,
            Some(Value::String(s)) => Some(s),
            Some(_) => {
                return Err(self.err(format!("{key}.type"), "must be a string", r#"use "stdio" or "http""#));
            }
        };
        Ok(match (entry.contains_key("command"), entry.contains_key("url")) {
            (true, true) => {
                return Err(self.err(
                    key,
                    "has both `command` and `url`",
                    "keep `command` for a local server launched over stdio, or `url` for a remote one, not both",
                ));
            }
            (false, false) => {
                return Err(self.err(
                    key,
                    "has neither `command` nor `url`",
                    r#"add "command": "server-binary" (with "args") to launch a local server, or "url": "https://host/mcp" for a remote one"#,
                ));
            }
            (true, false) => {
                if let Some(k) = kind.as_deref().filter(|k| *k != "stdio") {
                    return Err(self.err(
                        format!("{key}.type"),
                        format!("is \"{k}\" but the server has a `command`"),
                        r#"use "type": "stdio" or remove `type`"#,
                    ));
                }
                Launch::Stdio(self.stdio(key, entry, base)?)
            }
            (false, true) => {
                match kind.as_deref() {
                    None | Some("http" | "streamable-http" | "streamableHttp") => {}
                    Some("sse") => {
                        return Err(self.err(
                            format!("{key}.type"),
                            "the legacy SSE transport is not supported",
                            "point `url` at the server's streamable HTTP endpoint (usually /mcp) and set \"type\": \"http\"",
                        ));
                    }
                    Some(k) => {
                        return Err(self.err(
                            format!("{key}.type"),
                            format!("unknown transport \"{k}\""),
                            r#"use "http" for a server with a `url`"#,
                        ));
                    }
                }
                Launch::Http(self.http(key, entry)?)
            }
        })
    }

    /// Refuses what the other transport takes and `launch`'s would drop unread: `headers`
    /// for a server the gateway starts, `args`, `env` or `cwd` for a `url` server (left
    /// empty, they say nothing, and pass).
    fn no_other_transports_keys(
        &self,
        key: &str,
        launch: &Launch,
        entry: &Map<String, Value>,
    ) -> Result<(), ConfigError> {
        let (theirs, hint): (&[&str], &str) = match launch {
            Launch::Stdio(_) => {
                (&["headers"], "headers go to a `url` server; pass what a `command` needs in its `env` or `args`")
            }
            Launch::Http(_) => (
                &["args", "env", "cwd"],
                "these start a `command`; a `url` server is running already, and takes `headers`",
            ),
        };
        let said = |v: &Value| match v {
            Value::Null => false,
            Value::Object(o) => !o.is_empty(),
            Value::Array(a) => !a.is_empty(),
            Value::String(s) => !s.is_empty(),
            _ => true,
        };
        match theirs.iter().find(|k| entry.get(**k).is_some_and(said)) {
            Some(k) => {
                let transport = if matches!(launch, Launch::Stdio(_)) { "a `command`" } else { "a `url`" };
                Err(self.err(format!("{key}.{k}"), format!("does not apply to a server with {transport}"), hint))
            }
            None => Ok(()),
        }
    }

    /// `adapter`: the name of a plugin in `plugins_dir`, or none.
    fn adapter(&self, key: &str, value: Option<Value>, plugins_dir: &Path) -> Result<Option<String>, ConfigError> {
        Ok(match value {
            None | Some(Value::Null) => None,
            Some(Value::String(a)) => {
                self.check_adapter(&format!("{key}.adapter"), &a, plugins_dir)?;
                Some(a)
            }
            Some(_) => {
                return Err(self.err(
                    format!("{key}.adapter"),
                    "must be a string",
                    r#"name a plugin, e.g. "adapter": "lean-fallback""#,
                ));
            }
        })
    }

    /// `recovery`: the server's own keys over `rebound.defaults.recovery`, checked.
    fn recovery(&self, key: &str, own: Option<Value>, defaults: &Value) -> Result<RecoveryConfig, ConfigError> {
        let mut recovery = defaults.clone();
        if let Some(own) = own {
            if !own.is_object() {
                return Err(self.err(
                    format!("{key}.recovery"),
                    "must be an object",
                    r#"write "recovery": {"timeout_ms": 60000}"#,
                ));
            }
            merge(&mut recovery, own);
        }
        let recovery: RecoveryConfig = self.typed(&format!("{key}.recovery"), recovery)?;
        self.check_bounds(&format!("{key}.recovery"), &recovery)?;
        self.check_ratios(&format!("{key}.recovery"), &recovery)?;
        self.check_relations(&format!("{key}.recovery"), &recovery)?;
        Ok(recovery)
    }

    /// `scope`: `"shared"` (the default) or `"session"`.
    fn scope(&self, key: &str, value: Option<Value>) -> Result<Scope, ConfigError> {
        let hint = r#"use "shared" (one process for every client) or "session" (one per client session)"#;
        self.one_of(key, value, &[("shared", Scope::Shared), ("session", Scope::Session)], "a scope", hint)
    }

    /// `protocol`: `"auto"` (the default) or `"2025-11-25"`.
    fn protocol(&self, key: &str, value: Option<Value>) -> Result<Protocol, ConfigError> {
        let hint =
            r#"use "auto" (MCP 2026-07-28 if the server speaks it, else initialize) or "2025-11-25" (initialize only)"#;
        let choices = [("auto", Protocol::Auto), ("2025-11-25", Protocol::Initialize)];
        self.one_of(key, value, &choices, "a way to start a connection", hint)
    }

    /// One of `choices` by its name; absent or `null` is the first.
    fn one_of<T: Copy>(
        &self,
        key: &str,
        value: Option<Value>,
        choices: &[(&str, T)],
        what: &str,
        hint: &str,
    ) -> Result<T, ConfigError> {
        match value {
            None | Some(Value::Null) => Ok(choices[0].1),
            Some(Value::String(s)) if let Some((_, t)) = choices.iter().find(|(name, _)| *name == s) => Ok(*t),
            Some(other) => Err(self.err(key, format!("is {other}, not {what}"), hint)),
        }
    }

    /// `adapter_allow`: `{"tools": ["server/tool", ...], "restart": false, "observes": ["tool", ...]}`.
    fn grant(&self, key: &str, server: &str, value: Option<Value>) -> Result<AdapterGrant, ConfigError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            tools: Option<Vec<String>>,
            #[serde(default)]
            restart: bool,
            #[serde(default)]
            observes: Vec<String>,
        }
        let Some(value) = value else { return Ok(AdapterGrant::own(server)) };
        if !value.is_object() {
            return Err(self.err(
                key,
                "must be an object",
                format!(r#"write "adapter_allow": {{"tools": ["{server}/*"], "restart": false}}"#),
            ));
        }
        let raw: Raw = self.typed(key, value)?;
        // Tool names of its own server, with `*`.
        let observes = raw
            .observes
            .iter()
            .enumerate()
            .map(|(i, p)| {
                ToolPattern::parse(&format!("{server}/{p}")).map_err(|why| {
                    self.err(format!("{key}.observes[{i}]"), why, r#"write tool names of the server, e.g. "hol_*""#)
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let Some(patterns) = raw.tools else {
            return Ok(AdapterGrant { restart: raw.restart, observes, ..AdapterGrant::own(server) });
        };
        let tools = patterns
            .iter()
            .enumerate()
            .map(|(i, p)| {
                ToolPattern::parse(p).map_err(|why| {
                    self.err(format!("{key}.tools[{i}]"), why, format!(r#"write "server/tool", e.g. "{server}/*""#))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(AdapterGrant { tools, restart: raw.restart, observes })
    }

    fn stdio(&self, key: &str, entry: &mut Map<String, Value>, base: &Path) -> Result<StdioLaunch, ConfigError> {
        let command =
            self.expand(&format!("{key}.command"), &self.string(&format!("{key}.command"), entry.remove("command"))?)?;
        if command.trim().is_empty() {
            return Err(self.err(
                format!("{key}.command"),
                "is empty",
                "name the program that starts the server, e.g. \"npx\" or \"/usr/local/bin/my-server\"",
            ));
        }
        // A relative path with a separator means "next to the config file"; a bare name is
        // looked up on PATH, as a client would.
        let command = if command.contains('/') && Path::new(&command).is_relative() {
            base.join(&command).to_string_lossy().into_owned()
        } else {
            command
        };
        let args = match entry.remove("args") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| {
                    let k = format!("{key}.args[{i}]");
                    let s = self.string(&k, Some(v))?;
                    self.expand(&k, &s)
                })
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(self.err(
                    format!("{key}.args"),
                    "must be an array of strings",
                    r#"write "args": ["--flag", "value"]"#,
                ));
            }
        };
        let env = self.string_map(&format!("{key}.env"), entry.remove("env"))?;
        let cwd = match entry.remove("cwd") {
            None | Some(Value::Null) => None,
            v => {
                let k = format!("{key}.cwd");
                let path = self.string(&k, v)?;
                Some(resolve(base, PathBuf::from(self.expand(&k, &path)?)))
            }
        };
        // A session's folder is known when its instance starts (and checked then).
        if let Some(cwd) = &cwd
            && !cwd.to_string_lossy().contains(SESSION_VAR)
            && !cwd.is_dir()
        {
            return Err(self.err(
                format!("{key}.cwd"),
                format!("{} is not a folder", cwd.display()),
                "create the folder or correct the path (relative paths start at the config file's folder)",
            ));
        }
        Ok(StdioLaunch { command, args, env, cwd })
    }

    fn http(&self, key: &str, entry: &mut Map<String, Value>) -> Result<HttpLaunch, ConfigError> {
        let k = format!("{key}.url");
        let url = self.expand(&k, &self.string(&k, entry.remove("url"))?)?;
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(self.err(
                k,
                // Not quoted: a URL read from the environment may carry a token.
                "is not an http(s) URL: it must start with http:// or https://",
                "write the server's full endpoint, e.g. \"https://host/mcp\"",
            ));
        }
        let headers = self.string_map(&format!("{key}.headers"), entry.remove("headers"))?;
        for (name, value) in &headers {
            let item = format!("{key}.headers.{name}");
            let Ok(parsed) = axum::http::HeaderName::try_from(name.as_str()) else {
                return Err(self.err(item, "is not a valid HTTP header name", "use letters, digits and `-` only"));
            };
            if RESERVED_HEADERS.contains(&parsed.as_str()) {
                return Err(self.err(
                    item,
                    "is set by the MCP transport itself",
                    "remove it; Rebound negotiates sessions and content types with the server",
                ));
            }
            if axum::http::HeaderValue::try_from(value.as_str()).is_err() {
                // The value may be a secret: never repeat it.
                return Err(self.err(
                    item,
                    "has a value that cannot be sent in a header",
                    "remove line breaks and control characters",
                ));
            }
        }
        Ok(HttpLaunch { url, headers })
    }

    fn http_settings(&self, mut http: HttpSettings) -> Result<HttpSettings, ConfigError> {
        http.auth_token = self.token(("REBOUND_AUTH_TOKEN", "rebound.http.auth_token"), http.auth_token.as_deref())?;
        let operator = ("REBOUND_OPERATOR_TOKEN", "rebound.http.operator_token");
        http.operator_token = self.token(operator, http.operator_token.as_deref())?;
        if http.operator_token.is_some() && http.operator_token == http.auth_token {
            return Err(self.err(
                operator.1,
                "is the clients' token (auth_token) too",
                "give the operator a token of its own: with the clients' token, every client could read it all",
            ));
        }
        for (i, origin) in http.allowed_origins.iter().enumerate() {
            if origin != "null" && !origin.contains("://") {
                return Err(self.err(
                    format!("rebound.http.allowed_origins[{i}]"),
                    format!("\"{origin}\" has no scheme"),
                    "write it as a browser sends it, e.g. \"https://app.example.com\" or \"http://localhost:*\"",
                ));
            }
        }
        self.trusted_proxies(&http.trusted_proxies)?;
        let n = |v: usize| Some(v as u64);
        self.within(
            "http.max_body_bytes",
            n(http.max_body_bytes),
            1..=1 << 30,
            "1 to 1073741824 (1 GiB)",
            "4194304, 4 MiB",
        )?;
        self.within(
            "http.max_concurrent_per_client",
            n(http.max_concurrent_per_client),
            1..=100_000,
            "1 to 100000",
            "32",
        )?;
        self.within("http.max_sessions", n(http.max_sessions), 1..=100_000, "1 to 100000", "256")?;
        let (idle, week) = (Some(http.session_idle_ms), 7 * 24 * 3_600_000);
        self.within(
            "http.session_idle_ms",
            idle,
            1_000..=week,
            "1000 (a second) to 604800000 (a week)",
            "1800000, half an hour",
        )?;
        let grace = Some(http.shutdown_grace_ms);
        self.within("http.shutdown_grace_ms", grace, 0..=600_000, "at most 600000 (ten minutes)", "5000")?;
        let threads = http.worker_threads.and_then(n);
        self.within("http.worker_threads", threads, 1..=256, "1 to 256", "half the cores, at least one")?;
        Ok(http)
    }

    /// `rebound.http.trusted_proxies`: few enough, each an address or a block, none of
    /// every address.
    fn trusted_proxies(&self, proxies: &[String]) -> Result<(), ConfigError> {
        if proxies.len() > MAX_TRUSTED_PROXIES {
            return Err(self.err(
                "rebound.http.trusted_proxies",
                format!("has {} entries", proxies.len()),
                format!(
                    "name at most {MAX_TRUSTED_PROXIES}: write a network's proxies as one block, e.g. \"10.0.0.0/8\""
                ),
            ));
        }
        for (i, proxy) in proxies.iter().enumerate() {
            let key = || format!("rebound.http.trusted_proxies[{i}]");
            match proxy_block(proxy) {
                None => {
                    return Err(self.err(
                        key(),
                        format!("\"{proxy}\" is not an IP address or a CIDR block"),
                        "write a proxy's address or its network, e.g. \"127.0.0.1\" or \"10.0.0.0/8\"",
                    ));
                }
                // Whatever connects from a trusted address names the client it likes.
                Some(block) if block.prefix_len() == 0 => {
                    return Err(self.err(
                        key(),
                        format!("\"{proxy}\" trusts every address: any client could name itself any other"),
                        "name only your proxies' addresses, or a network that holds nothing else",
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The bounds of the `rebound` settings that are numbers (those of `rebound.http` are
    /// checked with its other settings): a value past them would stop the gateway from
    /// working (every start failing at once, a server restarted in a loop) or is past
    /// what it can hold; it is refused, not quietly changed.
    fn bounded(&self, raw: &RawSettings) -> Result<(), ConfigError> {
        const DAY: u64 = 86_400_000;
        let r = &raw.restart;
        let checks: [Bounded; 12] = [
            ("init_timeout_ms", raw.init_timeout_ms, 1..=DAY, "1 to 86400000 (a day)", "60000"),
            ("startup_timeout_ms", raw.startup_timeout_ms, 1..=DAY, "1 to 86400000 (a day)", "30000"),
            ("plugin_timeout_ms", raw.plugin_timeout_ms, 1..=60_000, "1 to 60000 (a minute)", "200"),
            ("plugin_memory_mb", raw.plugin_memory_mb.map(|m| m as u64), 1..=64, "1 to 64", "32"),
            ("plugin_max_calls", raw.plugin_max_calls.map(u64::from), 1..=64, "1 to 64", "8"),
            ("plugin_compile_timeout_ms", raw.plugin_compile_timeout_ms, 1..=DAY, "1 to 86400000 (a day)", "60000"),
            (
                "errors_log_max_bytes",
                raw.errors_log_max_bytes,
                4096..=1 << 40,
                "4096 to 1099511627776 (1 TiB)",
                "10485760, 10 MiB",
            ),
            ("restart.max_delay_ms", Some(r.max_delay_ms), 1..=DAY, "1 to 86400000 (a day)", "30000"),
            (
                "restart.initial_delay_ms",
                Some(r.initial_delay_ms),
                1..=r.max_delay_ms.max(1),
                "1 to `restart.max_delay_ms`",
                "250",
            ),
            ("restart.crash_loop_limit", Some(u64::from(r.crash_loop_limit)), 1..=1_000_000, "at least 1", "5"),
            ("restart.crash_window_ms", Some(r.crash_window_ms), 1..=DAY, "1 to 86400000 (a day)", "60000"),
            (
                "restart.down_retry_ms",
                Some(r.down_retry_ms),
                1_000..=DAY,
                "1000 (a second) to 86400000 (a day)",
                "60000",
            ),
        ];
        for (key, value, range, says, default) in checks {
            self.within(key, value, range, says, default)?;
        }
        Ok(())
    }

    /// Whether `rebound.KEY`'s `value`, when set, is within `range`: the message says the
    /// range as `says`, the hint the default.
    fn within(
        &self,
        key: &str,
        value: Option<u64>,
        range: std::ops::RangeInclusive<u64>,
        says: &str,
        default: &str,
    ) -> Result<(), ConfigError> {
        if value.is_some_and(|v| !range.contains(&v)) {
            let hint = format!("leave it out for the default ({default})");
            return Err(self.err(format!("rebound.{key}"), format!("must be {says}"), hint));
        }
        Ok(())
    }

    /// A bearer token of the gateway's: variable `var` as it is, or the file's `key`,
    /// which may be `${VAR}`; at least 16 characters a header can carry.
    fn token(
        &self,
        (var, key): (&'static str, &'static str),
        in_file: Option<&str>,
    ) -> Result<Option<String>, ConfigError> {
        let (key, token) = match (self.env)(var).filter(|t| !t.is_empty()) {
            Some(token) => (var, token),
            None => {
                let Some(t) = in_file else { return Ok(None) };
                // An expansion error could quote part of the token: say only where it is,
                // unless the token is only `${VAR}`, whose error names VAR alone.
                let only_a_variable = t.strip_prefix("${").and_then(|t| t.strip_suffix('}')).is_some_and(|name| {
                    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                });
                let token = self.expand(key, t).map_err(|e| {
                    if only_a_variable {
                        return e;
                    }
                    let message = "has an unfinished `${`, or a variable that is not set";
                    self.err(key, message, "write `${VAR}` to read the token from VAR, and set VAR")
                })?;
                (key, token)
            }
        };
        if token.len() < 16 || axum::http::HeaderValue::try_from(format!("Bearer {token}")).is_err() {
            return Err(self.err(
                key,
                "is too short or has characters a header cannot carry",
                "use at least 16 printable characters, e.g. from `openssl rand -hex 32`",
            ));
        }
        Ok(Some(token))
    }

    fn string(&self, key: &str, value: Option<Value>) -> Result<String, ConfigError> {
        match value {
            Some(Value::String(s)) => Ok(s),
            Some(other) => {
                Err(self.err(key, format!("must be a string, found {}", kind_of(&other)), "quote the value"))
            }
            None => Err(self.err(key, "missing", "add it")),
        }
    }

    fn string_map(&self, key: &str, value: Option<Value>) -> Result<BTreeMap<String, String>, ConfigError> {
        match value {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(Value::Object(map)) => map
                .into_iter()
                .map(|(k, v)| {
                    let item = format!("{key}.{k}");
                    let s = match v {
                        Value::String(s) => s,
                        // Numbers and booleans are common in hand-written env blocks; a
                        // process environment only has strings, so take their text.
                        Value::Number(n) => n.to_string(),
                        Value::Bool(b) => b.to_string(),
                        other => {
                            return Err(self.err(
                                item,
                                format!("must be a string, found {}", kind_of(&other)),
                                "quote the value",
                            ));
                        }
                    };
                    Ok((k, self.expand(&item, &s)?))
                })
                .collect(),
            Some(other) => Err(self.err(
                key,
                format!("must be an object of strings, found {}", kind_of(&other)),
                r#"write {"NAME": "value"}"#,
            )),
        }
    }

    /// Expands `${VAR}` and `${VAR:-default}`.
    fn expand(&self, key: &str, text: &str) -> Result<String, ConfigError> {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                // Where, not the value: it may be a secret (an `env` or `headers` value).
                let at = text.len() - rest.len() + start;
                return Err(self.err(
                    key,
                    format!("has an unfinished `${{` (at byte {at})"),
                    "close it with `}`, e.g. ${HOME}",
                ));
            };
            let expr = &after[..end];
            let (name, default) = match expr.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (expr, None),
            };
            match ((self.env)(name), default) {
                // Known only when a session's instance starts (`ServerConfig::for_session`).
                _ if name == "REBOUND_SESSION" => out.push_str(SESSION_VAR),
                (Some(v), _) => {
                    let total = self.expanded_bytes.get().saturating_add(v.len());
                    if total > MAX_EXPANDED_BYTES {
                        return Err(self.err(
                            key,
                            format!(
                                "expands ${{{name}}} past the most the configuration's variables may expand to together, {} MiB",
                                MAX_EXPANDED_BYTES >> 20
                            ),
                            "refer to long variables less often, or write the value once in a file the server reads",
                        ));
                    }
                    self.expanded_bytes.set(total);
                    out.push_str(&v);
                    self.expanded.borrow_mut().push((name.to_owned(), v));
                }
                (None, Some(d)) => out.push_str(d),
                (None, None) => {
                    return Err(self.err(
                        key,
                        format!("refers to ${{{name}}}, which is not set"),
                        format!("set {name} in the environment, or give a default: ${{{name}:-value}}"),
                    ));
                }
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    fn check_adapter(&self, key: &str, name: &str, plugins_dir: &Path) -> Result<(), ConfigError> {
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(self.err(
                key,
                format!("\"{name}\" is not a plugin name"),
                "use the plugin's file name without `.wasm`, e.g. \"lean-fallback\"",
            ));
        }
        if plugins_dir.join(format!("{name}.wasm")).is_file() {
            return Ok(());
        }
        let mut known: Vec<String> = std::fs::read_dir(plugins_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".wasm").map(str::to_owned))
            .collect();
        known.sort();
        let available = if known.is_empty() {
            format!(
                "{} has no plugins; build them with `cargo xtask build-plugins` or set `rebound.plugins_dir`",
                plugins_dir.display()
            )
        } else {
            format!("available in {}: {}", plugins_dir.display(), known.join(", "))
        };
        Err(self.err(key, format!("unknown adapter \"{name}\": no {name}.wasm"), available))
    }

    /// Each number of `r` within its bounds: times past a day, and counts past what any
    /// server needs, are typos (a call would be held, and a replaced process kept for it,
    /// for years).
    fn check_bounds(&self, key: &str, r: &RecoveryConfig) -> Result<(), ConfigError> {
        const DAY: u64 = 86_400_000;
        let bounded = |k: &str, v: u64, max: u64, default: &str| {
            let (message, fix) = match v {
                0 => ("must be greater than 0".to_owned(), "give a positive number"),
                v if v > max => (format!("{v} is past the most it may be, {max}"), "give a smaller number"),
                _ => return Ok(()),
            };
            Err(self.err(format!("{key}.{k}"), message, format!("{fix}, or leave it out for the default ({default})")))
        };
        bounded("timeout_ms", r.timeout_ms, DAY, "60000")?;
        bounded("retry.max_attempts", r.retry.max_attempts.into(), 100, "3")?;
        bounded("retry.budget_reserve", r.retry.budget_reserve.into(), 1_000_000, "10")?;
        bounded("breaker.failure_threshold", r.breaker.failure_threshold.into(), 1_000_000, "5")?;
        bounded("breaker.success_threshold", r.breaker.success_threshold.into(), 1_000_000, "2")?;
        bounded("breaker.half_open_max_calls", r.breaker.half_open_max_calls.into(), 1_000_000, "1")?;
        if let Some(d) = r.deadline_ms {
            let derived = "timeout_ms × retry.max_attempts, plus the backoff cap and each fallback's timeout";
            bounded("deadline_ms", d, DAY, derived)?;
        }
        bounded("breaker.window_ms", r.breaker.window_ms, DAY, "60000")?;
        bounded("breaker.open_ms", r.breaker.open_ms.max(1), DAY, "60000")?;
        bounded("breaker.max_open_ms", r.breaker.max_open_ms, DAY, "600000")?;
        bounded("retry.max_delay_ms", r.retry.max_delay_ms.max(1), DAY, "60000")?;
        bounded("ping_timeout_ms", r.ping_timeout_ms.max(1), DAY, "30000; 0: never")?;
        for (tool, t) in &r.tools {
            if let Some(timeout) = t.timeout_ms {
                bounded(&format!("tools.{tool}.timeout_ms"), timeout, DAY, "the server's timeout_ms")?;
            }
        }
        Ok(())
    }

    /// The ratios and factors of `r`, each within its range.
    fn check_ratios(&self, key: &str, r: &RecoveryConfig) -> Result<(), ConfigError> {
        if !(r.retry.budget_ratio >= 0.0 && r.retry.budget_ratio.is_finite()) {
            return Err(self.err(
                format!("{key}.retry.budget_ratio"),
                format!("{} is not a ratio", r.retry.budget_ratio),
                "use a number of at least 0 (0.3 allows 30% more traffic for retries)",
            ));
        }
        if !(r.breaker.failure_rate > 0.0 && r.breaker.failure_rate <= 1.0) {
            return Err(self.err(
                format!("{key}.breaker.failure_rate"),
                format!("{} is not a fraction of calls", r.breaker.failure_rate),
                "use a number above 0 and at most 1 (0.5 opens at half the calls failing)",
            ));
        }
        if !(r.retry.multiplier.is_finite() && r.retry.multiplier >= 1.0) {
            return Err(self.err(
                format!("{key}.retry.multiplier"),
                format!("{} is not a growth factor", r.retry.multiplier),
                "use a number of at least 1.0 (2.0 doubles each delay)",
            ));
        }
        Ok(())
    }

    /// The keys of `r` that must agree with one another.
    fn check_relations(&self, key: &str, r: &RecoveryConfig) -> Result<(), ConfigError> {
        if r.breaker.max_open_ms < r.breaker.open_ms {
            return Err(self.err(
                format!("{key}.breaker.max_open_ms"),
                "is smaller than breaker.open_ms",
                "raise max_open_ms to at least open_ms (default 600000), or lower open_ms",
            ));
        }
        if r.retry.initial_delay_ms > r.retry.max_delay_ms {
            return Err(self.err(
                format!("{key}.retry.initial_delay_ms"),
                "is larger than retry.max_delay_ms",
                "lower initial_delay_ms or raise max_delay_ms",
            ));
        }
        Ok(())
    }
}

fn validate_server_name(ctx: &Ctx<'_>, key: &str, name: &str) -> Result<(), ConfigError> {
    // The name becomes a tool-name prefix (`server__tool`), so it must be usable there.
    if name.is_empty()
        || name.contains("__")
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(ctx.err(
            key,
            format!("\"{name}\" is not a usable server name"),
            "use letters, digits, `-`, `_` or `.`, without `__` (it separates server and tool in prefixed names)",
        ));
    }
    Ok(())
}

/// Deep-merges `over` into `base`: objects key by key, anything else replaced.
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o,
    }
}

fn resolve(base: &Path, p: PathBuf) -> PathBuf {
    if p.is_absolute() { p } else { base.join(p) }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// serde_json appends " at line L column C"; we print the position ourselves.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests;
