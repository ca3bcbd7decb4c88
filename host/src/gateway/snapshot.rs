//! The gateway's state at one moment, as plain values: what `/metrics` reports. Taken
//! from the hub by `status::snapshot`, so that the metrics need not know the hub.

use crate::recovery::engine::Denial;
use crate::transport::Status;

/// Every server's state now, and the errors log's losses.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub servers: Vec<ServerSnapshot>,
    pub errors_dropped: u64,
}

#[derive(Debug, Clone)]
pub struct ServerSnapshot {
    pub name: String,
    /// The status of each of its instances: the one of a shared server, one per session
    /// of a `scope: session` server.
    pub statuses: Vec<Status>,
    /// `closed`, `half-open` or `open`; none for a `scope: session` server, whose
    /// breakers are its sessions' own.
    pub breaker: Option<&'static str>,
    /// The breakers of tools with recent failures, by tool.
    pub tool_breakers: Vec<(String, &'static str)>,
    /// How many clients breakers of their own shed now (a shared server's).
    pub clients_shed: Option<usize>,
    pub counters: Counts,
    /// Refused steps of the adapter's plans, by [`Denial`] (in `Denial::ALL` order).
    pub denied: [u64; Denial::ALL.len()],
    pub adapter: Option<AdapterSnapshot>,
}

/// The engine's counters for one server.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    pub attempts: u64,
    pub retries: u64,
    pub fallbacks: u64,
    pub recovered: u64,
    pub shed: u64,
    pub failures: u64,
}

#[derive(Debug, Clone)]
pub struct AdapterSnapshot {
    pub name: String,
    pub faults: u64,
    pub quarantined: bool,
}
