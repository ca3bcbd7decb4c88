//! The configuration file: Claude-style `mcpServers` plus Rebound's own keys, loaded
//! into resolved, validated types so nothing downstream re-checks or re-defaults.

mod error;
mod load;
mod model;

pub use error::ConfigError;
pub use load::{followed, load, parse, within};
pub use model::{
    AdapterGrant, Alternative, BreakerConfig, Config, HttpLaunch, HttpSettings, Launch, Protocol, ProxyHeader,
    RecoveryConfig, RestartPolicy, RetryConfig, SESSION_VAR, Scope, ServerConfig, Settings, StdioLaunch, ToolNames,
    ToolPattern, ToolRecovery, proxy_block,
};
