//! The resolved configuration types. Recovery defaults are the MCP error-handling
//! guidance's: 3 attempts, 1 s initial delay, 60 s cap, ×2; a breaker that opens after 5
//! consecutive failures, probes once after 60 s and closes after 2 successes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::Value;

/// A loaded, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from (absolute).
    pub source: PathBuf,
    /// Enabled servers, in file order.
    pub servers: IndexMap<String, ServerConfig>,
    pub settings: Settings,
    /// Things that are not errors but deserve a line in the log (unknown keys, disabled
    /// servers).
    pub warnings: Vec<String>,
    /// Every `${VAR}` the file used, with its value (wherever it was used: an argument
    /// too), for the redaction of secrets.
    pub expanded: Vec<(String, String)>,
}

impl Config {
    /// Logs each of its warnings, as `rebound check`, a start and a reload all do.
    pub fn log_warnings(&self) {
        for warning in &self.warnings {
            // On one line, escapes written out: they quote key names the file's author wrote.
            tracing::warn!("{}", crate::text::shown(warning, 4096));
        }
    }

    /// The deadline for one call of `tool` on `server` (see
    /// [`RecoveryConfig::deadline_for`]), its fallbacks on other servers given their own
    /// timeouts; `None` for a server not configured.
    pub fn deadline_for(&self, server: &str, tool: &str) -> Option<u64> {
        Some(self.servers.get(server)?.recovery.deadline_for(tool, |s, t| self.timeout_of(s, t)))
    }

    /// The longest a call of any of `server`'s tools may take.
    pub fn longest_deadline(&self, server: &str) -> Option<u64> {
        Some(self.servers.get(server)?.recovery.longest_deadline(|s, t| self.timeout_of(s, t)))
    }

    fn timeout_of(&self, server: &str, tool: &str) -> Option<u64> {
        Some(self.servers.get(server)?.recovery.timeout_for(tool))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub name: String,
    pub launch: Launch,
    /// Adapter plugin name (`lean-fallback` → `lean-fallback.wasm` in `plugins_dir`).
    pub adapter: Option<String>,
    pub recovery: RecoveryConfig,
    /// Opaque to the host; handed to the adapter.
    pub adapter_config: Value,
    /// What the adapter's plans may make the gateway do.
    pub adapter_allow: AdapterGrant,
    /// One process for every client, or one per client session.
    pub scope: Scope,
    /// How the gateway starts its connection to the server.
    pub protocol: Protocol,
}

/// Written in a `session`-scoped server's `command`, `args`, `env`, `cwd`, `url` or
/// `headers`, it is replaced by the client session's name when that session's instance
/// starts: storage of its own, for servers that keep state in files.
pub const SESSION_VAR: &str = "${REBOUND_SESSION}";

impl ServerConfig {
    /// Whether `SESSION_VAR` appears anywhere in how the server is launched.
    pub fn mentions_session(&self) -> bool {
        self.launch_strings().any(|s| s.contains(SESSION_VAR))
    }

    fn launch_strings(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        match &self.launch {
            Launch::Stdio(l) => Box::new(
                std::iter::once(l.command.as_str())
                    .chain(l.args.iter().map(String::as_str))
                    .chain(l.env.values().map(String::as_str))
                    .chain(l.cwd.iter().filter_map(|c| c.to_str())),
            ),
            Launch::Http(h) => Box::new(std::iter::once(h.url.as_str()).chain(h.headers.values().map(String::as_str))),
        }
    }

    /// This server's configuration for the instance of client session `session`.
    pub fn for_session(&self, session: &str) -> ServerConfig {
        let mut config = self.clone();
        let put = |s: &mut String| {
            if s.contains(SESSION_VAR) {
                *s = s.replace(SESSION_VAR, session);
            }
        };
        match &mut config.launch {
            Launch::Stdio(l) => {
                put(&mut l.command);
                l.args.iter_mut().for_each(put);
                l.env.values_mut().for_each(put);
                if let Some(cwd) = l.cwd.as_mut().and_then(|c| c.to_str().map(str::to_owned)) {
                    let mut cwd = cwd;
                    put(&mut cwd);
                    l.cwd = Some(cwd.into());
                }
            }
            Launch::Http(h) => {
                put(&mut h.url);
                h.headers.values_mut().for_each(put);
            }
        }
        config
    }
}

/// Who a server's process serves (`mcpServers.NAME.scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    /// One instance for every client of the gateway (the default).
    #[default]
    Shared,
    /// One instance per client session, started on its first use, stopped when the
    /// session ends: for servers that keep per-user state or ask the client things.
    Session,
}

/// How the gateway opens its connection to a server (`mcpServers.NAME.protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// Asks for MCP 2026-07-28 with `server/discover`; a server that does not know that
    /// request is initialised as before (the default).
    #[default]
    Auto,
    /// Only the `initialize` handshake (2025-11-25 and older): for a server that answers
    /// nothing, or breaks, when a request comes before `initialize`.
    Initialize,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::Session => "session",
        }
    }
}

/// What a server's adapter may ask the gateway to do (`mcpServers.NAME.adapter_allow`).
/// Nothing else: a side call, alternative or restart outside it is skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterGrant {
    /// Tools its plans may call, as `server/tool` patterns with `*` wildcards. Default:
    /// every tool of its own server (`NAME/*`).
    pub tools: Vec<ToolPattern>,
    /// Whether its plans may restart the server. Default: no.
    pub restart: bool,
    /// Over HTTP, the tools of a shared server (one instance for every client) whose
    /// successful calls the adapter is shown, among those it declares: every client's.
    /// Default: none. (A server serving one client, over stdio or `scope: session`,
    /// shows the adapter what it declares.)
    pub observes: Vec<ToolPattern>,
}

impl AdapterGrant {
    /// The default grant of `server`'s adapter: its own server's tools, no restart.
    pub fn own(server: &str) -> Self {
        let tools = vec![ToolPattern::parse(&format!("{server}/*")).expect("a valid pattern")];
        Self { tools, restart: false, observes: Vec::new() }
    }

    /// Whether, over HTTP, the adapter of `server`, shared, may be shown `tool`'s calls.
    pub fn observes_shared(&self, server: &str, tool: &str) -> bool {
        self.observes.iter().any(|p| p.matches(server, tool))
    }

    pub fn allows_tool(&self, server: &str, tool: &str) -> bool {
        self.tools.iter().any(|p| p.matches(server, tool))
    }

    /// Whether a pattern without `*` names `server/tool` itself.
    pub fn names_tool(&self, server: &str, tool: &str) -> bool {
        self.tools.iter().any(|p| p.server == server && p.tool == tool)
    }
}

/// A `server/tool` pattern; `*` in either part matches any run of characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPattern {
    server: String,
    tool: String,
}

impl ToolPattern {
    /// Parses `server/tool`; the first `/` separates them (server names have none).
    /// (An adapter's `declare` gives patterns too: what an error quotes is bounded first,
    /// and its control characters written out, `{:?}`.)
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.len() > 512 {
            return Err("a pattern is at most 512 characters".into());
        }
        let Some((server, tool)) = text.split_once('/') else {
            return Err(format!("{text:?} has no `/` between server and tool"));
        };
        if server.is_empty() || tool.is_empty() {
            return Err(format!("{text:?} needs both a server and a tool (use `*` for any)"));
        }
        Ok(Self { server: server.to_owned(), tool: tool.to_owned() })
    }

    pub fn matches(&self, server: &str, tool: &str) -> bool {
        glob(&self.server, server) && glob(&self.tool, tool)
    }

    /// Whether every tool `other` names is one this pattern names too, as far as can be
    /// told without enumerating: the same pattern, or a literal one this matches.
    pub fn covers(&self, other: &ToolPattern) -> bool {
        self == other || (!other.to_string().contains('*') && self.matches(&other.server, &other.tool))
    }

    /// The server part, as written.
    pub fn server(&self) -> &str {
        &self.server
    }
}

impl std::fmt::Display for ToolPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.server, self.tool)
    }
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters (none
/// included) and everything else only itself. Linear in the inputs' sum (a pattern may be
/// an adapter's, and a tool name its plan's): the literal parts between the stars are
/// found in order, each at its leftmost place, which is where a match takes it if any does,
/// the first anchored at the start and the last at the end.
fn glob(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(last) = parts.next_back() else { return pattern == text };
    // (Taken off the text in turn, the two cannot overlap in it.)
    let Some(mut rest) = text.strip_prefix(first).and_then(|t| t.strip_suffix(last)) else { return false };
    for part in parts {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launch {
    Stdio(StdioLaunch),
    Http(HttpLaunch),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdioLaunch {
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Resolved against the config file's folder.
    pub cwd: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLaunch {
    pub url: String,
    pub headers: BTreeMap<String, String>,
}

/// How tools are named in the merged catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolNames {
    /// `server__tool` only where two servers publish the same name.
    #[default]
    Conditional,
    /// Always `server__tool`.
    Always,
    /// Never prefixed; a colliding name is served by the first server in file order.
    Never,
}

/// Gateway-wide settings (the `rebound` object).
#[derive(Debug, Clone)]
pub struct Settings {
    pub plugins_dir: PathBuf,
    pub errors_log: PathBuf,
    pub tool_names: ToolNames,
    /// How long `serve` waits for servers to initialise before answering the client's
    /// `initialize`; servers still starting join later with `list_changed`.
    pub startup_timeout_ms: u64,
    /// How long one adapter call may run.
    pub plugin_timeout_ms: u64,
    /// The most memory one adapter instance may use.
    pub plugin_memory_mb: usize,
    /// Side calls plus alternatives that adapters' plans may make for one client call.
    pub plugin_max_calls: u32,
    /// Where compiled adapters are cached (default `~/.cache/rebound/plugins`).
    pub plugin_cache_dir: Option<PathBuf>,
    /// How long compiling one adapter may take (in a compiler process of its own).
    pub plugin_compile_timeout_ms: u64,
    /// Whether the gateway offers its own tools and resources (`rebound_status`, …).
    pub gateway_tools: bool,
    /// The errors log is rotated (to `NAME.1`) when it grows past this.
    pub errors_log_max_bytes: u64,
    /// How long one start of a server may take, from spawn to an answered `initialize`.
    pub init_timeout_ms: u64,
    pub restart: RestartPolicy,
    /// `serve --http`: who may connect and how much they may ask.
    pub http: HttpSettings,
}

impl Settings {
    /// The settings a reload applies that differ between `self` and `new`, by key.
    pub fn applied_changes(&self, new: &Settings) -> Vec<&'static str> {
        let changed = [
            ("plugins_dir", self.plugins_dir != new.plugins_dir),
            ("tool_names", self.tool_names != new.tool_names),
            ("startup_timeout_ms", self.startup_timeout_ms != new.startup_timeout_ms),
            ("plugin_timeout_ms", self.plugin_timeout_ms != new.plugin_timeout_ms),
            ("plugin_memory_mb", self.plugin_memory_mb != new.plugin_memory_mb),
            ("plugin_max_calls", self.plugin_max_calls != new.plugin_max_calls),
            ("plugin_cache_dir", self.plugin_cache_dir != new.plugin_cache_dir),
            ("plugin_compile_timeout_ms", self.plugin_compile_timeout_ms != new.plugin_compile_timeout_ms),
            ("gateway_tools", self.gateway_tools != new.gateway_tools),
        ];
        changed.into_iter().filter_map(|(key, changed)| changed.then_some(key)).collect()
    }

    /// What a reload does not apply, as it runs (`running`'s): `rebound.http` but its
    /// tokens (which `reload::rotate_tokens` keeps or rotates), and the errors log's.
    pub fn keep_running(&mut self, running: &Settings) {
        let (auth_token, operator_token) = (self.http.auth_token.take(), self.http.operator_token.take());
        self.http = HttpSettings { auth_token, operator_token, ..running.http.clone() };
        self.errors_log.clone_from(&running.errors_log);
        self.errors_log_max_bytes = running.errors_log_max_bytes;
    }

    /// What in `new` a reload does not apply, each said as the operator should read it:
    /// it takes effect at the next start, or for servers started from now on. (The
    /// tokens' own rules are `reload::rotate_tokens`'.)
    pub fn held_back(&self, new: &Settings) -> Vec<String> {
        let mut held = Vec::new();
        let later = [
            ("rebound.http (but its tokens)", self.http.but_tokens() != new.http.but_tokens()),
            ("rebound.errors_log", self.errors_log != new.errors_log),
            ("rebound.errors_log_max_bytes", self.errors_log_max_bytes != new.errors_log_max_bytes),
        ];
        for (key, _) in later.into_iter().filter(|(_, changed)| *changed) {
            held.push(format!("{key} changed: that takes effect at the next start, not on reload"));
        }
        if self.restart != new.restart || self.init_timeout_ms != new.init_timeout_ms {
            held.push(
                "rebound.restart or init_timeout_ms changed: they apply to servers started from now on".to_owned(),
            );
        }
        held
    }
}

/// The streamable HTTP front (`rebound.http`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// Clients must send `Authorization: Bearer TOKEN`. `REBOUND_AUTH_TOKEN` overrides it.
    pub auth_token: Option<String>,
    /// When set, `/status` and `/metrics` (every client's errors, every server's counts)
    /// take this token instead of `auth_token`: a gateway shared by several people shows
    /// its operator what no client sees. `REBOUND_OPERATOR_TOKEN` overrides it.
    pub operator_token: Option<String>,
    /// `Host` values accepted (a name matches any port; `name:port` only that port).
    /// Loopback names only by default, against DNS rebinding.
    pub allowed_hosts: Vec<String>,
    /// `Origin` values accepted from browsers (`scheme://host[:port]`, `:*` for any port).
    /// Requests without an `Origin` are not browsers and pass. Loopback by default.
    pub allowed_origins: Vec<String>,
    /// The largest request body accepted (413 beyond it).
    pub max_body_bytes: usize,
    /// Requests one client may have in flight at once (429 beyond it). A client is its
    /// MCP session, or its address before it has one. Over stdio, the one client.
    pub max_concurrent_per_client: usize,
    /// MCP sessions kept at once; a new one past it closes one of the address holding
    /// the most (idle before busy, then the least recently used).
    pub max_sessions: usize,
    /// A session that sends nothing for this long is closed (with its `session`-scoped
    /// servers).
    pub session_idle_ms: u64,
    /// On SIGTERM, how long requests in flight get to finish before their calls are ended
    /// with an error.
    pub shutdown_grace_ms: u64,
    /// Proxies (addresses or CIDR blocks) whose `proxy_header` names the client: a
    /// request from one of them is counted against the client it names, not against the
    /// proxy. None by default: every request is its connection's address.
    pub trusted_proxies: Vec<String>,
    /// The header the trusted proxies write the client's address in.
    pub proxy_header: ProxyHeader,
    /// Threads serving HTTP: half the cores (at least one) when unset, leaving the rest to
    /// the servers behind the gateway. `1` serves every client on one thread, with no
    /// hand-off between threads on a call's path.
    pub worker_threads: Option<usize>,
}

/// The header trusted proxies name the client in (`rebound.http.proxy_header`). One only:
/// a proxy passes on the other as the client wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProxyHeader {
    /// `X-Forwarded-For: 198.51.100.4, 10.0.0.2` (nginx, Caddy, Traefik, Envoy, most).
    #[default]
    XForwardedFor,
    /// RFC 7239's `Forwarded: for=198.51.100.4, for="[2001:db8::7]:4711"`.
    Forwarded,
}

/// The most entries `rebound.http.trusted_proxies` may have.
pub const MAX_TRUSTED_PROXIES: usize = 256;

impl HttpSettings {
    /// These settings with no tokens: what a reload compares apart from them.
    pub fn but_tokens(&self) -> HttpSettings {
        HttpSettings { auth_token: None, operator_token: None, ..self.clone() }
    }

    /// The tokens set: the clients' and the operator's.
    pub fn tokens(&self) -> impl Iterator<Item = &str> {
        [&self.auth_token, &self.operator_token].into_iter().flatten().map(String::as_str)
    }

    /// `trusted_proxies` as blocks of addresses; an entry that is neither an address nor
    /// a block (which loading the config refuses) is left out.
    pub fn proxies(&self) -> Vec<ipnet::IpNet> {
        self.trusted_proxies.iter().filter_map(|p| proxy_block(p)).collect()
    }
}

/// A `trusted_proxies` entry: an address (`10.0.0.7`, `::1`) or a CIDR block (`10.0.0.0/8`).
/// IPv4 written as IPv6 (`::ffff:10.0.0.7`) is the IPv4 address or block, as a peer's
/// address is read.
pub fn proxy_block(entry: &str) -> Option<ipnet::IpNet> {
    let entry = entry.trim();
    let block = entry.parse().ok().or_else(|| entry.parse::<std::net::IpAddr>().ok().map(ipnet::IpNet::from))?;
    match block {
        ipnet::IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.network().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96).ok().map(ipnet::IpNet::V4),
            None => Some(block),
        },
        _ => Some(block),
    }
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            auth_token: None,
            operator_token: None,
            allowed_hosts: ["localhost", "127.0.0.1", "[::1]", "::1"].map(String::from).to_vec(),
            allowed_origins: [
                "http://localhost:*",
                "http://127.0.0.1:*",
                "http://[::1]:*",
                "https://localhost:*",
                "https://127.0.0.1:*",
                "https://[::1]:*",
            ]
            .map(String::from)
            .to_vec(),
            max_body_bytes: 4 << 20,
            max_concurrent_per_client: 32,
            max_sessions: 256,
            session_idle_ms: 30 * 60 * 1000,
            shutdown_grace_ms: 5_000,
            trusted_proxies: Vec::new(),
            proxy_header: ProxyHeader::default(),
            worker_threads: None,
        }
    }
}

/// Supervision of crashed stdio servers.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RestartPolicy {
    pub initial_delay_ms: u64,
    pub max_delay_ms: u64,
    /// Crashes within `crash_window_ms` after which the server is marked down.
    pub crash_loop_limit: u32,
    pub crash_window_ms: u64,
    /// While down, how often a fresh start is tried.
    pub down_retry_ms: u64,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            initial_delay_ms: 250,
            max_delay_ms: 30_000,
            crash_loop_limit: 5,
            crash_window_ms: 60_000,
            down_retry_ms: 60_000,
        }
    }
}

/// Per-server recovery policy (`mcpServers.NAME.recovery`, merged over
/// `rebound.defaults.recovery`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecoveryConfig {
    /// Per-attempt timeout.
    pub timeout_ms: u64,
    /// Overall deadline for one client call, all attempts and alternatives included.
    /// Defaults to `timeout_ms × retry.max_attempts` plus the backoff cap.
    pub deadline_ms: Option<u64>,
    /// Whether a progress notification from the server restarts the attempt's timer.
    pub progress_extends_timeout: bool,
    /// How long a server process whose request timed out, and which serves nothing else,
    /// has to answer a `ping` before it is taken for wedged and restarted; 0: never asked.
    pub ping_timeout_ms: u64,
    pub retry: RetryConfig,
    pub breaker: BreakerConfig,
    pub tools: BTreeMap<String, ToolRecovery>,
    /// Alternatives per tool, tried in order when recovery on the tool itself fails.
    pub fallbacks: BTreeMap<String, Vec<Alternative>>,
}

/// A tool that answers the same question as another.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Alternative {
    /// The tool, as its server names it.
    pub tool: String,
    /// Its server, when not the same as the failed tool's.
    #[serde(default)]
    pub server: Option<String>,
    /// The alternative's arguments: a string `"$name"` copies the original argument
    /// `name`; anything else is taken literally. Absent: the original arguments as they are.
    #[serde(default)]
    pub arguments: Option<serde_json::Map<String, Value>>,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        Self {
            timeout_ms: 60_000,
            deadline_ms: None,
            progress_extends_timeout: true,
            ping_timeout_ms: 30_000,
            retry: RetryConfig::default(),
            breaker: BreakerConfig::default(),
            tools: BTreeMap::new(),
            fallbacks: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    pub initial_delay_ms: u64,
    pub max_delay_ms: u64,
    pub multiplier: f64,
    /// Retries a server may get per call, on average (0.3: at most 30% more traffic).
    pub budget_ratio: f64,
    /// Retries in hand before any call has been made, and the most the budget holds.
    pub budget_reserve: u32,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            initial_delay_ms: 1_000,
            max_delay_ms: 60_000,
            multiplier: 2.0,
            budget_ratio: 0.3,
            budget_reserve: 10,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker.
    pub failure_threshold: u32,
    /// Successful probes that close it again.
    pub success_threshold: u32,
    /// How long it stays open the first time; doubled on each reopening.
    pub open_ms: u64,
    /// The cap on the growing open time.
    pub max_open_ms: u64,
    pub half_open_max_calls: u32,
    /// It also opens when at least `failure_rate` of the calls in the last `window_ms`
    /// failed, once there were `min_calls` of them.
    pub failure_rate: f64,
    pub window_ms: u64,
    pub min_calls: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            success_threshold: 2,
            open_ms: 60_000,
            max_open_ms: 600_000,
            half_open_max_calls: 1,
            failure_rate: 0.5,
            window_ms: 60_000,
            min_calls: 20,
        }
    }
}

/// Per-tool overrides (`recovery.tools.NAME`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolRecovery {
    pub timeout_ms: Option<u64>,
    /// Marks a tool safe to replay even without `idempotentHint`/`readOnlyHint`, or
    /// (`false`) unsafe even with them.
    pub idempotent: Option<bool>,
}

impl RecoveryConfig {
    /// The per-attempt timeout for `tool`.
    pub fn timeout_for(&self, tool: &str) -> u64 {
        self.tools.get(tool).and_then(|t| t.timeout_ms).unwrap_or(self.timeout_ms)
    }

    /// The overall deadline for one call of `tool`: by default, time for every attempt,
    /// the backoff cap, and each of its fallbacks' timeouts, so that retries need not give
    /// way to them. `elsewhere(server, tool)` is the timeout of a fallback on another
    /// server (`None`: a server not configured, whose tool is given this server's).
    pub fn deadline_for(&self, tool: &str, elsewhere: impl Fn(&str, &str) -> Option<u64>) -> u64 {
        self.deadline_ms.unwrap_or_else(|| {
            let timeout = |alt: &Alternative| match &alt.server {
                Some(server) => elsewhere(server, &alt.tool).unwrap_or_else(|| self.timeout_for(&alt.tool)),
                None => self.timeout_for(&alt.tool),
            };
            let fallbacks = self.fallbacks.get(tool).into_iter().flatten();
            let fallbacks = fallbacks.fold(0u64, |sum, alt| sum.saturating_add(timeout(alt)));
            self.timeout_for(tool)
                .saturating_mul(u64::from(self.retry.max_attempts))
                .saturating_add(self.retry.max_delay_ms)
                .saturating_add(fallbacks)
        })
    }

    /// The longest a call of any of the server's tools may take: its own default, or a
    /// tool's with a longer timeout of its own.
    pub fn longest_deadline(&self, elsewhere: impl Fn(&str, &str) -> Option<u64>) -> u64 {
        let tools = self.tools.keys().chain(self.fallbacks.keys());
        tools.map(|tool| self.deadline_for(tool, &elsewhere)).fold(self.deadline_for("", &elsewhere), u64::max)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn patterns() {
        let p = |t: &str| ToolPattern::parse(t).unwrap();
        assert!(p("lean/*").matches("lean", "lean_loogle"));
        assert!(!p("lean/*").matches("hol", "hol_send"));
        assert!(p("*/lean_*").matches("any", "lean_goal"));
        assert!(!p("*/lean_*").matches("any", "hol_lean"));
        assert!(p("hol/hol_interrupt").matches("hol", "hol_interrupt"));
        assert!(!p("hol/hol_interrupt").matches("hol", "hol_interrupt2"));
        assert!(p("s/a/b*").matches("s", "a/bc"), "tools may contain `/`");
        assert!(p("s/*x*y").matches("s", "axbxy"));
        assert!(ToolPattern::parse("lean").is_err());
        assert!(ToolPattern::parse("/tool").is_err());
        assert!(ToolPattern::parse("lean/").is_err());
        // What an error quotes (a pattern may come from an adapter) is short, on one line.
        let junk = "\n\u{1b}[2J".repeat(1 << 20);
        for text in [&junk[..400], &junk] {
            let error = ToolPattern::parse(text).unwrap_err();
            assert!(error.len() < 2048 && !error.chars().any(char::is_control), "{error:?}");
        }
        assert!(AdapterGrant::own("lean").allows_tool("lean", "x"));
        assert!(!AdapterGrant::own("lean").allows_tool("lean2", "x"));
    }

    /// A reference matcher: the literal parts between stars, found in order by
    /// backtracking, the first anchored at the start and the last at the end.
    fn by_parts(pattern: &str, text: &str) -> bool {
        fn go(parts: &[&str], text: &str, anchored: bool) -> bool {
            match parts.split_first() {
                None => text.is_empty(),
                Some((p, rest)) if anchored => text.strip_prefix(p).is_some_and(|t| go(rest, t, false)),
                Some((p, rest)) => (0..=text.len())
                    .filter(|i| text.is_char_boundary(*i))
                    .any(|i| text[i..].strip_prefix(p).is_some_and(|t| go(rest, t, false))),
            }
        }
        go(&pattern.split('*').collect::<Vec<_>>(), text, true)
    }

    proptest! {
        #[test]
        fn glob_agrees_with_a_reference(pattern in "[ab*é]{0,8}", text in "[abé]{0,10}") {
            prop_assert_eq!(glob(&pattern, &text), by_parts(&pattern, &text), "{} vs {}", pattern, text);
        }

        #[test]
        fn a_literal_pattern_matches_only_itself(server in "[a-z]{1,6}", tool in "[a-z_/]{1,10}", other in "[a-z_/]{1,10}") {
            let p = ToolPattern::parse(&format!("{server}/{tool}")).unwrap();
            prop_assert!(p.matches(&server, &tool));
            prop_assert_eq!(p.matches(&server, &other), tool == other);
        }
    }
}
