//! Upstream MCP servers: launching them, speaking to them as a client, and supervising
//! their processes.

pub mod http_client;
pub mod id_scan;
pub mod lines;
pub mod listen;
pub mod malformed;
pub mod process;
pub mod supervisor;
pub mod tasks;
pub mod typed;
pub mod upstream;
pub mod watchdog;

pub use supervisor::{Kicker, ServerHandle, Session, Status, spawn_supervisor};
pub use upstream::{Asker, Offered, Relay, UpstreamEvent, UpstreamRequest};
