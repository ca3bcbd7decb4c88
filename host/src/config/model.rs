//! The resolved configuration types. Defaults follow seed 004 (3 attempts, 1 s initial
//! delay, 60 s cap, ×2; breaker 5/2/60 s/1).

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
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub name: String,
    pub launch: Launch,
    /// Adapter plugin name (`lean-fallback` → `lean-fallback.wasm` in `plugins_dir`).
    pub adapter: Option<String>,
    pub recovery: RecoveryConfig,
    /// Opaque to the host; handed to the adapter.
    pub adapter_config: Value,
}

#[derive(Debug, Clone)]
pub enum Launch {
    Stdio(StdioLaunch),
    Http(HttpLaunch),
}

#[derive(Debug, Clone)]
pub struct StdioLaunch {
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Resolved against the config file's folder.
    pub cwd: Option<PathBuf>,
}

#[derive(Debug, Clone)]
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
    /// Where compiled adapters are cached (default `~/.cache/rebound/plugins`).
    pub plugin_cache_dir: Option<PathBuf>,
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

/// The streamable HTTP front (`rebound.http`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// Clients must send `Authorization: Bearer TOKEN`. `REBOUND_AUTH_TOKEN` overrides it.
    pub auth_token: Option<String>,
    /// `Host` values accepted (a name matches any port; `name:port` only that port).
    /// Loopback names only by default, against DNS rebinding.
    pub allowed_hosts: Vec<String>,
    /// `Origin` values accepted from browsers (`scheme://host[:port]`, `:*` for any port).
    /// Requests without an `Origin` are not browsers and pass. Loopback by default.
    pub allowed_origins: Vec<String>,
    /// The largest request body accepted (413 beyond it).
    pub max_body_bytes: usize,
    /// Requests one client may have in flight at once (429 beyond it). A client is its
    /// MCP session, or its address before it has one.
    pub max_concurrent_per_client: usize,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            auth_token: None,
            allowed_hosts: ["localhost", "127.0.0.1", "[::1]", "::1"].map(String::from).to_vec(),
            allowed_origins: ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*", "https://localhost:*"]
                .map(String::from)
                .to_vec(),
            max_body_bytes: 4 << 20,
            max_concurrent_per_client: 32,
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

    /// The overall deadline for one call of `tool`.
    pub fn deadline_for(&self, tool: &str) -> u64 {
        self.deadline_ms.unwrap_or_else(|| {
            self.timeout_for(tool)
                .saturating_mul(u64::from(self.retry.max_attempts))
                .saturating_add(self.retry.max_delay_ms)
        })
    }
}
