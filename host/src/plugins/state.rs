//! What one plugin call's store holds: a WASI context that grants nothing, captured
//! output, resource limits, and the host side of the `host` and `store` imports.

use std::sync::{Arc, Mutex};

use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::bindings::v0_1::rebound::adapter::{host, store, types};
use super::bindings::v0_2::rebound::adapter as v0_2;
use super::kv::Kv;
use crate::lasting::Locked;
pub use crate::pace::LogBudget;
use crate::text::shown;

/// The longest `host.log` line kept; the rest is cut.
pub const MAX_LOG_LINE: usize = 4 << 10;
/// `host.log` lines one adapter may write per [`LOG_WINDOW`] on one server (its sessions'
/// own instances included); the rest are dropped and counted.
pub const MAX_LOG_LINES: u32 = 100;
pub const LOG_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);
/// The most table elements (function references) a plugin's tables may hold.
const MAX_TABLE_ELEMENTS: usize = 64 << 10;
/// The most bytes of randomness one WASI call may ask for.
const MAX_RANDOM_BYTES: u64 = 64 << 10;
/// The most WASI resources (streams, pollables) one instance may hold at once.
const MAX_RESOURCES: usize = 1024;
/// The most component handles one store may hold at once: the WASI resources it was
/// given (which reach their own bound first) and resources of its own, which no host
/// code sees made (`resource.new`) but the host's memory holds.
pub const MAX_HANDLES: usize = 2 * MAX_RESOURCES;

/// What one store (one plugin call) may hold: at most `memory` bytes of linear memory in
/// all (`StoreLimits` bounds each memory on its own, so a component with two would get
/// twice the cap), and wasmtime's bounds on the rest.
pub struct Bounds {
    counts: StoreLimits,
    memory: usize,
    /// Bytes of linear memory the store's memories hold together.
    used: usize,
    /// The last growth allowed, undone if it failed after all.
    growing: usize,
}

impl Bounds {
    pub fn new(memory: usize) -> Self {
        let counts = StoreLimitsBuilder::new()
            .memory_size(memory)
            .table_elements(MAX_TABLE_ELEMENTS)
            .instances(32)
            .tables(32)
            .memories(4)
            .build();
        Self { counts, memory, used: 0, growing: 0 }
    }
}

impl ResourceLimiter for Bounds {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let used = self.used.saturating_sub(current).saturating_add(desired);
        if used > self.memory || !self.counts.memory_growing(current, desired, maximum)? {
            return Ok(false);
        }
        (self.used, self.growing) = (used, desired.saturating_sub(current));
        Ok(true)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.used = self.used.saturating_sub(std::mem::take(&mut self.growing));
        self.counts.memory_grow_failed(error)
    }

    fn table_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.counts.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.counts.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.counts.instances()
    }

    fn tables(&self) -> usize {
        self.counts.tables()
    }

    fn memories(&self) -> usize {
        self.counts.memories()
    }
}

pub struct State {
    wasi: WasiCtx,
    table: ResourceTable,
    pub limits: Bounds,
    /// `adapter_config` as JSON text.
    config: Arc<str>,
    kv: Kv,
    /// The adapter's name, for its log lines.
    name: Arc<str>,
    server: Arc<str>,
    log: Arc<LogBudget>,
}

/// How many `host.log` lines an adapter may still write in this window ([`MAX_LOG_LINES`]
/// a [`LOG_WINDOW`]), and how many it lost; shared by all of its calls.
pub fn log_budget() -> LogBudget {
    LogBudget::new(MAX_LOG_LINES, LOG_WINDOW)
}

impl State {
    pub fn new(
        name: Arc<str>,
        server: Arc<str>,
        config: Arc<str>,
        kv: Kv,
        log: Arc<LogBudget>,
        output: CappedPipe,
        memory: usize,
    ) -> Self {
        // Nothing is inherited: no environment, arguments, files or network; stdin is
        // closed; stdout and stderr go to a capped buffer for the log; the clocks stand
        // still at the epoch, so a plugin cannot read the time. (It can still wait, on
        // the host's real clock, within its deadline: whether a wait is over tells it
        // roughly how long its own work took, nothing more.)
        let wasi = WasiCtxBuilder::new()
            .stdout(output.clone())
            .stderr(output)
            .wall_clock(Frozen)
            .monotonic_clock(Frozen)
            // The host allocates what `get-random-bytes` asks for before the guest sees it.
            .max_random_size(MAX_RANDOM_BYTES)
            .build();
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES);
        let limits = Bounds::new(memory);
        Self { wasi, table, limits, config, kv, name, server, log }
    }
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl types::Host for State {}

impl host::Host for State {
    fn config(&mut self) -> String {
        self.config.to_string()
    }

    fn log(&mut self, level: host::Level, message: String) {
        if !self.log.take() {
            return;
        }
        let message = shown(&message, MAX_LOG_LINE);
        let (adapter, server) = (&*self.name, &*self.server);
        match level {
            host::Level::Debug => tracing::debug!(target: "rebound::plugin", adapter, server, "{message}"),
            host::Level::Info => tracing::info!(target: "rebound::plugin", adapter, server, "{message}"),
            host::Level::Warn => tracing::warn!(target: "rebound::plugin", adapter, server, "{message}"),
            host::Level::Error => tracing::error!(target: "rebound::plugin", adapter, server, "{message}"),
        }
    }
}

impl store::Host for State {
    fn get(&mut self, key: String) -> Option<String> {
        self.kv.get(&key)
    }

    fn set(&mut self, key: String, value: String) -> bool {
        self.kv.set(key, value)
    }

    fn delete(&mut self, key: String) {
        self.kv.delete(&key)
    }

    fn keys(&mut self, prefix: String) -> Vec<String> {
        self.kv.keys(&prefix)
    }
}

// 0.2.0's imports are 0.1.0's, under the new package's name.
impl v0_2::host::Host for State {
    fn config(&mut self) -> String {
        host::Host::config(self)
    }

    fn log(&mut self, level: v0_2::host::Level, message: String) {
        let level = match level {
            v0_2::host::Level::Debug => host::Level::Debug,
            v0_2::host::Level::Info => host::Level::Info,
            v0_2::host::Level::Warn => host::Level::Warn,
            v0_2::host::Level::Error => host::Level::Error,
        };
        host::Host::log(self, level, message)
    }
}

impl v0_2::store::Host for State {
    fn get(&mut self, key: String) -> Option<String> {
        store::Host::get(self, key)
    }

    fn set(&mut self, key: String, value: String) -> bool {
        store::Host::set(self, key, value)
    }

    fn delete(&mut self, key: String) {
        store::Host::delete(self, key)
    }

    fn keys(&mut self, prefix: String) -> Vec<String> {
        store::Host::keys(self, prefix)
    }
}

/// A plugin's stdout and stderr: kept up to a cap, the rest dropped. (A pipe that
/// reports "full" would make the guest's `println!` panic: a chatty plugin must not trap.)
#[derive(Clone)]
pub struct CappedPipe {
    buf: Arc<Mutex<Vec<u8>>>,
    cap: usize,
}

impl CappedPipe {
    pub fn new(cap: usize) -> Self {
        Self { buf: Arc::default(), cap }
    }

    /// What was written, lossily as text on one line ([`shown`]), with a note when some
    /// was dropped.
    pub fn text(&self) -> String {
        let buf = self.buf.locked();
        let mut t = shown(String::from_utf8_lossy(&buf).trim(), usize::MAX);
        if buf.len() >= self.cap {
            t.push_str(" …(truncated)");
        }
        t
    }
}

impl wasmtime_wasi::cli::IsTerminal for CappedPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl wasmtime_wasi::cli::StdoutStream for CappedPipe {
    fn p2_stream(&self) -> Box<dyn wasmtime_wasi::p2::OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(tokio::io::sink())
    }
}

#[wasmtime_wasi::async_trait]
impl wasmtime_wasi::p2::Pollable for CappedPipe {
    async fn ready(&mut self) {}
}

impl wasmtime_wasi::p2::OutputStream for CappedPipe {
    fn write(&mut self, bytes: bytes::Bytes) -> wasmtime_wasi::p2::StreamResult<()> {
        let mut b = self.buf.locked();
        let room = self.cap.saturating_sub(b.len());
        b.extend_from_slice(&bytes[..bytes.len().min(room)]);
        Ok(())
    }

    fn flush(&mut self) -> wasmtime_wasi::p2::StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> wasmtime_wasi::p2::StreamResult<usize> {
        Ok(64 << 10)
    }
}

/// A clock that always reads zero.
struct Frozen;

impl wasmtime_wasi::HostWallClock for Frozen {
    fn resolution(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }

    fn now(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

impl wasmtime_wasi::HostMonotonicClock for Frozen {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }

    fn now(&self) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use wasmtime::{Engine, Instance, Module, Store};

    use super::*;

    /// A core module with `count` linear memories of `pages` 64 KiB pages each.
    fn memories(count: u8, pages: u8) -> Vec<u8> {
        assert!(pages < 0x80, "one LEB128 byte");
        let mut module = b"\0asm\x01\0\0\0".to_vec();
        module.extend([5, 1 + 2 * count, count]);
        for _ in 0..count {
            module.extend([0, pages]); // no maximum, `pages` to start with
        }
        module
    }

    #[test]
    fn the_memory_cap_is_for_all_of_a_stores_memories_together() {
        let engine = Engine::default();
        let instantiate = |count| {
            let module = Module::new(&engine, memories(count, 100)).unwrap();
            let mut store = Store::new(&engine, Bounds::new(10 << 20));
            store.limiter(|limits| limits);
            Instance::new(&mut store, &module, &[]).map(|_| ())
        };
        instantiate(1).expect("one memory of 6.25 MiB fits in 10");
        assert!(instantiate(2).is_err(), "two of them do not, though each would alone");
    }

    #[test]
    fn an_adapters_pipe_is_shown_on_one_line() {
        let pipe = CappedPipe::new(64);
        use std::io::Write as _;
        pipe.buf.lock().unwrap().write_all(b"line one\nline two\n").unwrap();
        assert_eq!(pipe.text(), "line one\\nline two");
    }

    /// A guest asks the host to allocate randomness and resources for it: both bounded,
    /// past which the call fails (inside the guest), and a log line is cut.
    #[test]
    fn what_a_guest_has_the_host_hold_is_bounded() {
        use wasmtime_wasi::p2::bindings::random::random::Host as _;
        let (kv, log) = (Kv::default(), Arc::new(log_budget()));
        let mut state = State::new("a".into(), "s".into(), "{}".into(), kv, log, CappedPipe::new(64), 1 << 20);
        let random = state.wasi.random();
        assert_eq!(random.get_random_bytes(MAX_RANDOM_BYTES).unwrap().len(), MAX_RANDOM_BYTES as usize);
        assert!(random.get_random_bytes(MAX_RANDOM_BYTES + 1).is_err(), "more randomness than a call may ask");
        for _ in 0..MAX_RESOURCES {
            state.table.push(0u8).unwrap();
        }
        assert!(state.table.push(0u8).is_err(), "one resource more than an instance may hold");
        assert!(shown(&"y".repeat(MAX_LOG_LINE * 4), MAX_LOG_LINE).len() <= MAX_LOG_LINE + 4, "a line is cut");
        let escapes = shown(&"\u{1b}".repeat(MAX_LOG_LINE), MAX_LOG_LINE);
        assert!(escapes.len() <= MAX_LOG_LINE + 4 && escapes.starts_with("\\u{1b}"), "cut once written out");
        assert_eq!(shown("a\nbcdefgh", 4), "a\\nb…");
        assert_eq!(shown("a\nb", 4), "a\\nb", "not cut");
    }

    #[test]
    fn a_growth_that_failed_is_not_counted() {
        let mut limits = Bounds::new(10 << 20);
        assert!(limits.memory_growing(0, 8 << 20, None).unwrap());
        limits.memory_grow_failed(wasmtime::Error::msg("the system had none")).unwrap();
        assert!(limits.memory_growing(0, 8 << 20, None).unwrap(), "the failed 8 MiB are not held");
        assert!(!limits.memory_growing(0, 4 << 20, None).unwrap(), "the 8 that grew are");
    }
}
