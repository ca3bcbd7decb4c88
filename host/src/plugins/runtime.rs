//! The one wasmtime engine: pooling allocator sized for a small machine (on-demand
//! allocation when the reservation fails), epoch interruption driven by a ticker that
//! sleeps while no plugin runs, the linker with WASI and the contract's imports, and the
//! on-disk cache of compiled components.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::bindings;
use super::state::State;

/// How often the epoch advances while plugins run.
pub const TICK: Duration = Duration::from_millis(5);
/// Concurrent plugin instances the pool holds.
const POOL_INSTANCES: u32 = 32;
/// The largest linear memory a plugin may have.
const MAX_MEMORY: usize = 64 << 20;

/// Limits every plugin call runs under.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub memory: usize,
    pub timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self { memory: 32 << 20, timeout: Duration::from_millis(200) }
    }
}

pub struct Runtime {
    pub engine: Engine,
    pub linker: Linker<State>,
    pub limits: Limits,
    /// Whether the pooling allocator is in use (false: its reservation failed).
    pub pooling: bool,
    cache: Option<PathBuf>,
    ticker: Ticker,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("pooling", &self.pooling).field("cache", &self.cache).finish()
    }
}

impl Runtime {
    /// The engine and linker; `cache` is where compiled components are kept (none: always
    /// compile).
    pub fn new(limits: Limits, cache: Option<PathBuf>) -> anyhow::Result<Arc<Self>> {
        let mut config = Config::new();
        config
            .epoch_interruption(true)
            .memory_reservation(MAX_MEMORY as u64)
            .memory_guard_size(64 << 10)
            .memory_reservation_for_growth(0)
            .max_wasm_stack(512 << 10)
            // One-line trap messages in the log; the plugin's stderr says the rest.
            .wasm_backtrace_max_frames(None);
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(POOL_INSTANCES)
            .total_core_instances(POOL_INSTANCES * 8)
            .total_memories(POOL_INSTANCES)
            .total_tables(POOL_INSTANCES * 4)
            .total_stacks(POOL_INSTANCES)
            .max_memory_size(MAX_MEMORY)
            .max_component_instance_size(1 << 20)
            .max_core_instances_per_component(16)
            .max_memories_per_component(2)
            .max_tables_per_component(8);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let (engine, pooling) = match Engine::new(&config) {
            Ok(engine) => (engine, true),
            Err(e) => {
                tracing::warn!("the plugin pool could not reserve its memory ({e}); allocating on demand instead");
                config.allocation_strategy(InstanceAllocationStrategy::OnDemand);
                (Engine::new(&config)?, false)
            }
        };
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        bindings::v0_1::Plugin::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)?;
        let cache = cache.and_then(|dir| match private_dir(&dir) {
            Ok(()) => Some(dir),
            Err(e) => {
                tracing::warn!("no plugin cache at {}: {e}; plugins are compiled at every start", dir.display());
                None
            }
        });
        let ticker = Ticker::start(&engine);
        Ok(Arc::new(Self { engine, linker, limits, pooling, cache, ticker }))
    }

    /// The default cache folder: `$XDG_CACHE_HOME/rebound/plugins`, else
    /// `~/.cache/rebound/plugins`.
    pub fn default_cache() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(base.join("rebound").join("plugins"))
    }

    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache.as_deref()
    }

    /// Epoch ticks that make up the call timeout.
    pub fn deadline_ticks(&self) -> u64 {
        (self.limits.timeout.as_micros() / TICK.as_micros()).max(1) as u64 + 1
    }

    /// Keeps the epoch advancing while the guard lives.
    pub fn running(&self) -> TickGuard<'_> {
        self.ticker.enter()
    }
}

/// Creates `dir` readable by its owner only: cached components are machine code that
/// is loaded without verification, so nobody else may write there.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o022 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is writable by others (mode {:o})",
            dir.display(),
            mode & 0o777
        )));
    }
    Ok(())
}

/// Advances the engine's epoch every [`TICK`] while at least one plugin call is in
/// flight, and sleeps otherwise, so an idle gateway does not wake up for nothing.
struct Ticker {
    active: Arc<AtomicUsize>,
    thread: std::thread::Thread,
}

pub struct TickGuard<'a>(&'a Ticker);

impl Ticker {
    fn start(engine: &Engine) -> Self {
        let active = Arc::new(AtomicUsize::new(0));
        let weak = engine.weak();
        let busy = active.clone();
        let handle = std::thread::Builder::new()
            .name("rebound-epoch".into())
            .spawn(move || {
                loop {
                    if busy.load(Ordering::Acquire) == 0 {
                        std::thread::park();
                        continue;
                    }
                    std::thread::sleep(TICK);
                    match weak.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .expect("spawn the epoch thread");
        Self { active, thread: handle.thread().clone() }
    }

    fn enter(&self) -> TickGuard<'_> {
        if self.active.fetch_add(1, Ordering::AcqRel) == 0 {
            self.thread.unpark();
        }
        TickGuard(self)
    }
}

impl Drop for TickGuard<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}
