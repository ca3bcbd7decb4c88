//! The downstream side: the MCP server the client talks to, the merged catalogue, and the
//! hub that connects them to the upstream servers.

pub mod answered;
pub mod asked_tasks;
pub mod call;
pub mod catalogue;
pub mod downstreams;
pub mod early;
pub mod forward;
pub mod held;
pub mod http;
pub mod hub;
pub mod input;
pub mod metrics;
pub mod onward;
pub mod pins;
pub mod recent;
pub mod relay;
pub mod reload;
pub mod routing;
pub mod server;
pub mod session_servers;
pub mod sessions;
pub mod setup;
pub mod snapshot;
pub mod status;
pub mod stdio_client;
pub mod tally;
pub mod tasks;
pub mod tool_call;

pub use hub::Hub;
pub use server::Gateway;
