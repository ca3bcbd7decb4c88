//! Rebound: an MCP gateway that keeps an agent's tools working when the servers behind
//! them fail. See `ARCHITECTURE.md` at the repository root for the codemap.

pub mod config;
pub mod errors_log;
pub mod gateway;
pub mod lasting;
pub mod memory;
pub mod pace;
pub mod plugins;
pub mod recovery;
pub mod redact;
pub mod telemetry;
pub mod text;
pub mod transport;
pub mod weight;
