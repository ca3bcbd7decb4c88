//! The one wasmtime engine: pooling allocator sized for a small machine (on-demand
//! allocation when the reservation fails), epoch interruption driven by a ticker that
//! sleeps while no plugin runs (`driver`, with the thread a call that yields goes on to),
//! the linker with WASI and the contract's imports, and the on-disk cache of compiled
//! components.

mod driver;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, UpdateDeadline};

use super::bindings::{self, v0_1, v0_2};
use super::state::State;
use crate::lasting::Locked;
use v0_1::rebound::adapter::types as wit;

pub use driver::{TICK, TickGuard};
/// Concurrent plugin instances the pool holds.
pub const POOL_INSTANCES: u32 = 32;
/// How much of each pooled memory and table stays mapped between instances: the pages
/// the last instance wrote (found with Linux's `PAGEMAP_SCAN`, 6.7 and later) are reset
/// with a `memset`, instead of an `madvise` and a page fault per page on the next use.
/// A fresh instance plus `classify` went from 20.9 µs to 8.2 µs at p50 (`benches/plugins.rs`);
/// at most 32 × 256 KiB stay resident once every slot of the pool has been used.
const KEEP_RESIDENT: usize = 256 << 10;
/// The largest linear memory a plugin may have.
const MAX_MEMORY: usize = 64 << 20;
/// The most bytes a guest may hand the host in one crossing (a host call's arguments, or
/// an export's result): wasmtime's "hostcall fuel", counted as values are lifted, so
/// aliased strings in a list cannot multiply it.
pub const HOSTCALL_FUEL: usize = 2 << 20;

/// What one adapter (with all its copies) may hold at once: a share of the pool's
/// instances, so that one slow adapter never starves the others, and of the plugins'
/// threads, so that its calls there never wait behind one another, and of the bytes its
/// stores hold and its successful calls waiting to be shown to it, for however many
/// servers it serves.
#[derive(Clone)]
pub struct Room {
    pub share: Arc<tokio::sync::Semaphore>,
    pub turns: Arc<tokio::sync::Semaphore>,
    /// The bytes held by the stores of every copy of the adapter, for every server it
    /// serves (`kv::MAX_ADAPTER_BYTES`).
    pub stored: Arc<std::sync::atomic::AtomicUsize>,
    /// The bytes of the calls waiting to be observed by every copy of the adapter, for
    /// every server it serves (`adapter::lane::QUEUE_BYTES`).
    pub observing: Arc<std::sync::atomic::AtomicUsize>,
    /// What the plans of every copy of the adapter weigh while calls run them
    /// (`adapter::MAX_PLANS_HELD`).
    pub planned: Arc<std::sync::atomic::AtomicUsize>,
}

/// One call into an adapter.
pub enum Request {
    Info,
    Declare,
    Classify(wit::Failure, wit::Classification),
    Plan(wit::Failure, wit::Classification),
    Observe(wit::CompletedCall),
}

impl Request {
    /// What the texts it shows the adapter (arguments, messages, a result) cost once read
    /// as JSON ([`crate::weight::json`]), as an adapter may read them.
    pub fn weight(&self) -> usize {
        let json = |text: &str| crate::weight::json(text.as_bytes());
        match self {
            Request::Info | Request::Declare => 0,
            Request::Classify(failure, _) | Request::Plan(failure, _) => {
                let outcome = match &failure.outcome {
                    wit::Outcome::Rpc(e) => json(&e.message).saturating_add(e.data.as_deref().map_or(0, json)),
                    wit::Outcome::ToolError(t)
                    | wit::Outcome::ConnectionLost(t)
                    | wit::Outcome::NotDelivered(t)
                    | wit::Outcome::Other(t) => json(t),
                    wit::Outcome::Timeout => 0,
                };
                json(&failure.arguments).saturating_add(outcome)
            }
            Request::Observe(call) => json(&call.arguments).saturating_add(json(&call.call_result)),
        }
    }
}

/// A pre-instantiated adapter, of whichever contract version it speaks.
#[derive(Clone)]
pub enum Pre {
    V0_1(v0_1::PluginPre<State>),
    V0_2(v0_2::PluginPre<State>),
}

/// What an adapter declares it needs (0.2.0's `declare`); a 0.1.0 adapter needs nothing
/// beyond its own server's tools and observes every successful call, as 0.1.0 promised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub tools: Vec<String>,
    pub restart: bool,
    pub observes: Vec<String>,
}

impl Manifest {
    pub fn of_v0_1() -> Self {
        Self { tools: Vec::new(), restart: false, observes: vec!["*".into()] }
    }
}

/// Why a call got no answer.
#[derive(Debug, thiserror::Error)]
pub enum Fault {
    /// No instance was free within the deadline: the host's load, not the adapter's doing.
    #[error("no instance was free before the deadline")]
    Busy,
    /// The adapter trapped, ran past its deadline or broke the contract: the reason.
    #[error("{0}")]
    Failed(String),
}

/// What the adapter answered.
pub enum Reply {
    Info(wit::AdapterInfo),
    Declared(Manifest),
    Classify(Option<wit::Classification>),
    Plan(Option<Vec<wit::Step>>),
    Observed,
}

/// Limits every plugin call runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub memory: usize,
    pub timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self { memory: 32 << 20, timeout: Duration::from_millis(200) }
    }
}

/// How long a compiler process may take over one component by default (see `compiler`).
const COMPILE_TIMEOUT_MS: u64 = 60_000;

/// A temporary cache file this old was left by a gateway that did not finish with it.
const STALE: Duration = Duration::from_secs(3600);

pub struct Runtime {
    pub engine: Engine,
    pub linker: Linker<State>,
    pub limits: Limits,
    /// Whether the pooling allocator is in use (false: its reservation failed).
    pub pooling: bool,
    /// One permit per instance the pool holds: a call waits for one rather than failing,
    /// and holds it as long as its instance lives.
    pool: Arc<tokio::sync::Semaphore>,
    cache: Option<PathBuf>,
    /// How long compiling one component may take, in ms: set by each (re)load.
    compile_timeout_ms: AtomicU64,
    driver: driver::Driver,
    /// Each adapter's room, by its name ([`Runtime::room`]).
    rooms: std::sync::Mutex<std::collections::HashMap<Arc<str>, Room>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("pooling", &self.pooling).field("cache", &self.cache).finish()
    }
}

/// The engine's settings that compiled code depends on, shared with the compiler process
/// (`compiler`), whose output this engine then loads.
pub(super) fn compilation() -> Config {
    let mut config = Config::new();
    config
        .epoch_interruption(true)
        .memory_reservation(MAX_MEMORY as u64)
        .memory_guard_size(64 << 10)
        .memory_reservation_for_growth(0)
        .max_wasm_stack(512 << 10)
        // One-line trap messages in the log; the plugin's stderr says the rest.
        .wasm_backtrace_max_frames(None)
        // When a component is compiled in the gateway (no compiler process), it is on the
        // caller's thread: no idle compiler threads, nor their heaps, for the life of the
        // gateway (2.4 MB less resident at idle after compiling three adapters).
        .parallel_compilation(false);
    config
}

/// One call of a plugin's export, on either version's generated bindings: the two
/// versions' exports differ only in `declare`, the rest is the same code on two types.
macro_rules! answer {
    ($request:expr, $store:ident, $guest:expr, |$g:ident| $declare:expr) => {{
        let guest = $guest;
        wasmtime::Result::Ok(match $request {
            Request::Info => Reply::Info(guest.call_info(&mut $store).await?),
            Request::Declare => {
                let $g = guest;
                Reply::Declared($declare)
            }
            Request::Classify(f, b) => Reply::Classify(guest.call_classify(&mut $store, &f, &b).await?),
            Request::Plan(f, c) => Reply::Plan(guest.call_plan(&mut $store, &f, &c).await?),
            Request::Observe(c) => {
                guest.call_observe(&mut $store, &c).await?;
                Reply::Observed
            }
        })
    }};
}

/// A fresh instance of `pre` in `store`, and its answer to `request`.
async fn answer(pre: Pre, mut store: Store<State>, request: Request) -> wasmtime::Result<Reply> {
    match pre {
        Pre::V0_1(pre) => {
            let plugin = pre.instantiate_async(&mut store).await?;
            answer!(request, store, plugin.rebound_adapter_adapter(), |_g| Manifest::of_v0_1())
        }
        Pre::V0_2(pre) => {
            let plugin = pre.instantiate_async(&mut store).await?;
            answer!(request, store, plugin.rebound_adapter_adapter(), |g| {
                let m = g.call_declare(&mut store).await?;
                Manifest { tools: m.tools, restart: m.restart, observes: m.observes }
            })
        }
    }
}

impl Runtime {
    /// The engine and linker; `cache` is where compiled components are kept (none: always
    /// compile).
    pub fn new(limits: Limits, cache: Option<PathBuf>) -> anyhow::Result<Arc<Self>> {
        let mut config = compilation();
        // Room in the pool for POOL_INSTANCES instances of the largest component allowed:
        // an instance is admitted by the semaphore alone, so no adapter's components can
        // take the memories or tables another's need (its instantiation would fail, and
        // count against it). Only addresses are reserved, not memory.
        let (core_instances, memories, tables) = (16, 2, 8);
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(POOL_INSTANCES)
            .total_core_instances(POOL_INSTANCES * core_instances)
            .total_memories(POOL_INSTANCES * memories)
            .total_tables(POOL_INSTANCES * tables)
            .total_stacks(POOL_INSTANCES)
            .max_memory_size(MAX_MEMORY)
            .max_component_instance_size(1 << 20)
            .max_core_instances_per_component(core_instances)
            .max_memories_per_component(memories)
            .max_tables_per_component(tables)
            .linear_memory_keep_resident(KEEP_RESIDENT)
            .table_keep_resident(KEEP_RESIDENT)
            .pagemap_scan(wasmtime::Enabled::Auto);
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
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        bindings::v0_1::Plugin::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)?;
        bindings::v0_2::Plugin::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)?;
        let cache = cache.and_then(|dir| match private_dir(&dir) {
            Ok(()) => Some(dir),
            Err(e) => {
                tracing::warn!(
                    "not using the plugin cache at {}: {e}; plugins are compiled on every start",
                    dir.display()
                );
                None
            }
        });
        let driver = driver::Driver::start(&engine)?;
        let pool = Arc::new(tokio::sync::Semaphore::new(POOL_INSTANCES as usize));
        match &cache {
            Some(dir) => remove_stale(dir),
            None => remove_stale_compiles(&std::env::temp_dir()),
        }
        let compile_timeout_ms = AtomicU64::new(COMPILE_TIMEOUT_MS);
        let rooms = std::sync::Mutex::default();
        Ok(Arc::new(Self { engine, linker, limits, pooling, pool, cache, compile_timeout_ms, driver, rooms }))
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

    /// How long compiling one component may take (`rebound.plugin_compile_timeout_ms`).
    pub fn compile_timeout(&self) -> Duration {
        Duration::from_millis(self.compile_timeout_ms.load(Ordering::Relaxed))
    }

    pub fn set_compile_timeout(&self, timeout: Duration) {
        self.compile_timeout_ms.store(timeout.as_millis().try_into().unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Keeps the epoch advancing while the guard lives.
    pub fn running(&self) -> TickGuard {
        self.driver.running()
    }

    /// The adapter `name`'s room: its share of the pool's instances and of the plugins'
    /// threads, one for every server it serves (and every copy of it), so that an adapter
    /// configured for many servers takes no more than one.
    pub fn room(&self, name: &str) -> Room {
        let mut rooms = self.rooms.locked();
        rooms.entry(name.into()).or_insert_with(|| self.new_room()).clone()
    }

    /// Takes up the bytes `before` (the runtime this one replaces at a reload) counts for
    /// each adapter: the stores, observe queues and plans its adapters still hold, which
    /// adapters moved here keep (`Adapter::moved_to`), count towards the same bounds as
    /// those of its new adapters, not towards a second set of them. Call it before any
    /// room here is taken.
    pub fn count_on_from(&self, before: &Runtime) {
        let mut rooms = self.rooms.locked();
        for (name, old) in before.rooms.locked().iter() {
            let room = Room {
                stored: old.stored.clone(),
                observing: old.observing.clone(),
                planned: old.planned.clone(),
                ..self.new_room()
            };
            rooms.insert(name.clone(), room);
        }
    }

    /// A room of its own, for a call no adapter's room bounds.
    fn new_room(&self) -> Room {
        let share = Arc::new(tokio::sync::Semaphore::new(POOL_INSTANCES as usize / 2));
        let turns = Arc::new(tokio::sync::Semaphore::new(self.driver.per_adapter()));
        Room { share, turns, stored: Arc::default(), observing: Arc::default(), planned: Arc::default() }
    }

    /// Runs `request` in a fresh instance of `pre` whose store holds `state`, and stops it
    /// at the runtime's deadline whatever the guest does: a CPU loop is interrupted at the
    /// next epoch tick, and a wait in a WASI call (a clock subscription, `poll`) is
    /// abandoned, its instance dropped back into the pool. Fails with the reason, for the
    /// fault log.
    pub async fn invoke(&self, pre: &Pre, state: State, request: Request) -> Result<Reply, Fault> {
        let end = std::time::Instant::now() + self.limits.timeout;
        self.invoke_by(pre, state, request, (end, Duration::ZERO), ((), &self.new_room())).await
    }

    /// [`Self::invoke`], with `end` for its deadline: what a caller waited for before
    /// (its share of the pool, the adapter's earlier calls) counts against the one
    /// deadline. Of that, `waited` was for others. `held` (the adapter's share of the
    /// pool) is kept as long as the call's instance, wherever the call runs: a call given
    /// up on gives its instance back before its share. `room` is its adapter's.
    pub async fn invoke_by(
        &self,
        pre: &Pre,
        state: State,
        request: Request,
        (end, waited): (std::time::Instant, Duration),
        (held, room): (impl Send + 'static, &Room),
    ) -> Result<Reply, Fault> {
        let limit = self.limits.timeout;
        // An instance from the pool, waiting for one at most until the deadline.
        let asked = std::time::Instant::now();
        let pooled = tokio::time::timeout_at(end.into(), self.pool.clone().acquire_owned()).await;
        let Ok(Ok(instance)) = pooled else { return Err(Fault::Busy) };
        let waited = waited + asked.elapsed();
        let store = self.store_until(state, end);
        let running = self.running();
        let pre = pre.clone();
        // It owns what it needs (its instance's permit, the ticking) wherever it runs.
        // Declared first, they are dropped last, whether it ends or is dropped on the way:
        // its store gives the instance back to the pool before the permit goes to another
        // call (the other way round, that call found the pool's instances all taken).
        let call = async move {
            let _held = (instance, held, running);
            answer(pre, store, request).await
        };
        let remaining = end.saturating_duration_since(std::time::Instant::now());
        let queued = Arc::new(std::sync::atomic::AtomicU64::new(0));
        // Stopped at the deadline after more than half of it went on waiting for others
        // (the pool, its share, a turn on the plugins' threads; not its own earlier
        // calls), the adapter is not at fault: busy, as when it gets no instance at all.
        let past = || match waited + Duration::from_nanos(queued.load(Ordering::Relaxed)) > limit / 2 {
            true => Fault::Busy,
            false => Fault::Failed(format!("it ran past its {} ms deadline", limit.as_millis())),
        };
        if remaining.is_zero() {
            return Err(past()); // an instance given at the deadline runs nothing
        }
        match tokio::time::timeout(remaining, self.driver.run(call, room.turns.clone(), queued.clone())).await {
            Ok(Some(ended)) => ended.map_err(|e| fault_of(&e, past)),
            Ok(None) => Err(Fault::Failed("its call panicked in the host".into())),
            Err(_) => Err(past()),
        }
    }

    /// A store for one call holding `state`, within its bounds, that yields to the
    /// runtime at every epoch tick (so that the call's deadline can fire and the worker
    /// thread serves others meanwhile) and traps once `end` has passed.
    fn store_until(&self, state: State, end: std::time::Instant) -> Store<State> {
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        store.set_hostcall_fuel(HOSTCALL_FUEL);
        // wasmtime allows 100 000, each held in the host's memory outside the limiter's.
        store.set_max_component_handles(super::state::MAX_HANDLES);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            Ok(if std::time::Instant::now() >= end { UpdateDeadline::Interrupt } else { UpdateDeadline::Yield(1) })
        });
        store
    }
}

/// What an adapter's call that ended in `error` did: stopped at its deadline (`past`
/// says whose fault that is), trapped, or failed otherwise.
fn fault_of(error: &wasmtime::Error, past: impl FnOnce() -> Fault) -> Fault {
    match error.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::Interrupt) => past(),
        Some(trap) => Fault::Failed(format!("it trapped ({trap})")),
        None => Fault::Failed(format!("{error:#}")),
    }
}

/// The prefix of the temporary folders adapters are compiled in without a cache
/// (`load::compile_uncached`), before the gateway's process id.
pub const COMPILE_FOLDER: &str = "rebound-compile-";

/// Removes the folders in `tmp` that a gateway compiling without a cache left behind (it
/// was killed while compiling): this user's alone, once an hour old, and never one of a
/// gateway still running (a compile may take up to a day), as far as this PID namespace
/// sees: another container sharing the folder is not seen. A folder whose process id
/// another process has taken since waits for that one to end.
fn remove_stale_compiles(tmp: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(tmp) else { return };
    let me = nix::unistd::geteuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(COMPILE_FOLDER) else { continue };
        let pid = rest.split('-').next().and_then(|p| p.parse::<i32>().ok());
        // A process of that id exists (another user's too: EPERM), in this PID namespace.
        let alive = |pid| {
            matches!(
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
                Ok(()) | Err(nix::errno::Errno::EPERM)
            )
        };
        if pid.is_some_and(alive) {
            continue; // its gateway may still run
        }
        // Not followed if a link: only a folder of this user's own.
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else { continue };
        let age = meta.modified().ok().and_then(|t| t.elapsed().ok());
        if meta.is_dir() && meta.uid() == me && age.is_some_and(|age| age > STALE) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Removes the temporary files in the cache folder `dir` that a gateway left behind (it
/// was killed while storing a compiled component), once they are old enough that no
/// gateway can still be writing them.
fn remove_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let stale = entry.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok());
        if entry.file_name().to_string_lossy().contains(".tmp-") && stale.is_some_and(|age| age > STALE) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Creates `dir` (owner only) if it is missing, and checks that nobody but this user can
/// put files in it: cached components are machine code, loaded without verification. The
/// folder must be a real folder (not a symbolic link) owned by this user and writable by
/// nobody else; every folder above it must be owned by this user or by root (as OpenSSH
/// asks of `~/.ssh`), and none may be writable by others unless it is sticky (as `/tmp`
/// is: others can add entries there but not replace ours).
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let refuse = |why: String| Err(std::io::Error::other(why));
    let me = nix::unistd::geteuid().as_raw();
    // The folders above it as they are: one reached through a link is checked where the
    // link leads, and so are all of that one's parents.
    let dir = std::path::absolute(dir)?;
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return refuse(format!("{} is no folder a cache can be made in", dir.display()));
    };
    let parent = crate::config::followed(parent);
    let dir = parent.join(name);
    for ancestor in parent.ancestors() {
        let meta = match std::fs::metadata(ancestor) {
            Ok(meta) => meta,
            // Not there yet: created below, by this user.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return refuse(format!("{} cannot be checked: {e}", ancestor.display())),
        };
        if meta.uid() != me && meta.uid() != 0 {
            return refuse(format!(
                "{} is owned by user {}, neither this user nor root",
                ancestor.display(),
                meta.uid()
            ));
        }
        if meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0 {
            return refuse(format!("{} is writable by others (mode {:o})", ancestor.display(), meta.mode() & 0o7777));
        }
    }
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
    let meta = std::fs::symlink_metadata(&dir)?;
    if meta.file_type().is_symlink() {
        return refuse(format!("{} is a symbolic link", dir.display()));
    }
    if !meta.is_dir() {
        return refuse(format!("{} is not a folder", dir.display()));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return refuse(format!("{} is owned by user {}, not by this user ({me})", dir.display(), meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return refuse(format!("{} is writable by others (mode {:o})", dir.display(), meta.mode() & 0o777));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::{COMPILE_FOLDER, Limits, Runtime, STALE, compilation, private_dir, remove_stale_compiles};

    /// A component that makes `n` resources of a type of its own and keeps them all,
    /// with no host code in the loop (`resource.new`), and says how many it made.
    const HOARDER: &str = r#"
        (component
          (type $pile (resource (rep i32)))
          (core func $new (canon resource.new $pile))
          (core module $m
            (import "" "new" (func $new (param i32) (result i32)))
            (func (export "hoard") (param $n i32) (result i32)
              (local $made i32)
              (block $done
                (loop $more
                  (br_if $done (i32.ge_u (local.get $made) (local.get $n)))
                  (drop (call $new (local.get $made)))
                  (local.set $made (i32.add (local.get $made) (i32.const 1)))
                  (br $more)))
              (local.get $made)))
          (core instance $i (instantiate $m (with "" (instance (export "new" (func $new))))))
          (func (export "hoard") (param "n" u32) (result u32) (canon lift (core func $i "hoard"))))
    "#;

    /// A guest's own resources are bounded like the host's it holds: one store holds at
    /// most `MAX_HANDLES` handles (wasmtime's default is 100 000, in host memory that the
    /// plugin's memory limit does not count); past it the call traps.
    #[tokio::test]
    async fn a_guest_holds_at_most_max_handles() {
        use super::super::state::{CappedPipe, MAX_HANDLES, State, log_budget};
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        let component = wasmtime::component::Component::new(&runtime.engine, wat::parse_str(HOARDER).unwrap()).unwrap();
        let linker = wasmtime::component::Linker::<State>::new(&runtime.engine);
        let hoard = |n: usize| {
            let (runtime, component, linker) = (&runtime, &component, &linker);
            async move {
                let state = State::new(
                    "a".into(),
                    "s".into(),
                    "{}".into(),
                    Default::default(),
                    std::sync::Arc::new(log_budget()),
                    CappedPipe::new(64),
                    1 << 20,
                );
                let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
                let mut store = runtime.store_until(state, end);
                let instance = linker.instantiate_async(&mut store, component).await.unwrap();
                let hoard = instance.get_typed_func::<(u32,), (u32,)>(&mut store, "hoard").unwrap();
                hoard.call_async(&mut store, (n as u32,)).await.map(|(made,)| made as usize)
            }
        };
        assert_eq!(hoard(MAX_HANDLES).await.unwrap(), MAX_HANDLES);
        let error = hoard(MAX_HANDLES + 1).await.expect_err("one handle more than a store may hold");
        assert!(format!("{error:#}").contains("handle"), "{error:#}");
    }

    /// The compiler process builds its engine from `compilation()` alone; the gateway
    /// loads what it writes only if their compiled-code settings hash the same (the cache
    /// entry's name includes that hash too).
    #[test]
    fn the_compiler_process_compiles_what_the_gateway_loads() {
        use std::hash::{DefaultHasher, Hash, Hasher};
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        assert!(runtime.pooling, "the pool reserved its room");
        let mut config = compilation();
        config.parallel_compilation(true);
        let apart = wasmtime::Engine::new(&config).unwrap();
        let hash = |engine: &wasmtime::Engine| {
            let mut h = DefaultHasher::new();
            engine.precompile_compatibility_hash().hash(&mut h);
            h.finish()
        };
        assert_eq!(hash(&runtime.engine), hash(&apart));
    }

    /// One adapter's calls share one room (of the pool, of the threads) whatever servers
    /// it serves: configured for two, it still takes at most half of the pool.
    #[test]
    fn an_adapter_has_one_room_for_all_its_servers() {
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        let (first, again, other) = (runtime.room("lean"), runtime.room("lean"), runtime.room("hol"));
        assert!(
            std::sync::Arc::ptr_eq(&first.share, &again.share) && std::sync::Arc::ptr_eq(&first.turns, &again.turns)
        );
        assert!(!std::sync::Arc::ptr_eq(&first.share, &other.share));
        assert_eq!(first.share.available_permits(), super::POOL_INSTANCES as usize / 2);
    }

    /// What a gateway killed while compiling left behind is removed once old; a folder in
    /// use (recent, or of a gateway still running), anything else, and a link named like
    /// one (which is not followed) stay.
    #[test]
    fn folders_left_by_a_killed_compile_are_removed_once_old() {
        let tmp = tempfile::tempdir().unwrap();
        let old = std::time::SystemTime::now() - STALE - std::time::Duration::from_secs(60);
        let make = |name: &str, aged: bool| {
            let dir = tmp.path().join(name);
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("plugin.cwasm"), b"x").unwrap();
            if aged {
                std::fs::File::open(&dir).unwrap().set_modified(old).unwrap();
            }
            dir
        };
        let left = make(&format!("{COMPILE_FOLDER}999999999-left"), true);
        let busy = make(&format!("{COMPILE_FOLDER}999999999-busy"), false);
        let running = make(&format!("{COMPILE_FOLDER}{}-long", std::process::id()), true);
        let other = make("someone-else", true);
        let target = make("target", true);
        let link = tmp.path().join(format!("{COMPILE_FOLDER}link"));
        std::os::unix::fs::symlink(&target, &link).unwrap();
        remove_stale_compiles(tmp.path());
        assert!(!left.exists());
        assert!(busy.exists() && running.exists() && other.exists() && target.join("plugin.cwasm").exists());
    }

    fn mode(path: &std::path::Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn the_cache_folder_must_be_private() {
        let base = tempfile::tempdir().unwrap();
        mode(base.path(), 0o700);
        let fine = base.path().join("a/b/cache");
        private_dir(&fine).unwrap();
        assert_eq!(std::fs::metadata(&fine).unwrap().permissions().mode() & 0o777, 0o700);

        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        mode(&open, 0o777);
        let e = private_dir(&open).unwrap_err().to_string();
        assert!(e.contains("writable by others"), "{e}");
        let e = private_dir(&open.join("inside")).unwrap_err().to_string();
        assert!(e.contains("writable by others"), "a parent others can write: {e}");
        mode(&open, 0o1777);
        private_dir(&open.join("sticky")).expect("a sticky parent, as /tmp, is fine");

        let link = base.path().join("link");
        std::os::unix::fs::symlink(&fine, &link).unwrap();
        let e = private_dir(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");

        // A parent reached through a link is checked where it leads, its parents too.
        let shared = base.path().join("shared");
        std::fs::create_dir_all(shared.join("mine")).unwrap();
        mode(&shared, 0o777);
        let via = base.path().join("via");
        std::os::unix::fs::symlink(shared.join("mine"), &via).unwrap();
        let e = private_dir(&via.join("cache")).unwrap_err().to_string();
        assert!(e.contains("writable by others") && e.contains("shared"), "{e}");
    }
}
