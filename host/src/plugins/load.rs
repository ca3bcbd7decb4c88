//! Loading an adapter: read, check that it is a component that speaks a contract version
//! this gateway supports and imports nothing it may not, compile it (or take it from the
//! cache), and pre-instantiate it.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use wasmtime::component::Component;

use super::bindings::{self, v0_1, v0_2};
use super::compiler::{self, CompileError, MAX_COMPONENT_BYTES};
use super::runtime::{Fault, Manifest, Pre, Reply, Request, Runtime};
use super::state::{CappedPipe, State};
use crate::config::ToolPattern;
use crate::text::shown;

/// Imports an adapter may have (interface names without `@version`). Everything a Rust
/// wasm32-wasip2 program imports through std is here, and granted nothing: no
/// environment, no preopened folders, no network. Sockets and HTTP are refused.
const ALLOWED_IMPORTS: &[&str] = &[
    "rebound:adapter/types",
    "rebound:adapter/host",
    "rebound:adapter/store",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
];

/// Why a plugin was not loaded. Each names the file and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "{path}: cannot read the plugin: {source}\nhint: build the plugins with `cargo xtask build-plugins`, or correct `rebound.plugins_dir`"
    )]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path}: not a WebAssembly component: {what}\nhint: build it for wasm32-wasip2 (`cargo rustc --target wasm32-wasip2 --release --crate-type cdylib`), which produces a component"
    )]
    NotComponent { path: PathBuf, what: String },
    #[error(
        "{path}: speaks {found}; this gateway speaks rebound:adapter@{supported}\nhint: rebuild the plugin against wit/since_v{newest}"
    )]
    Contract { path: PathBuf, found: String, supported: String, newest: String },
    #[error(
        "{path}: imports `{import}`, which adapters may not use\nhint: adapters get no network and no host APIs beyond the contract's; remove the code that needs it"
    )]
    Forbidden { path: PathBuf, import: String },
    #[error(
        "{path}: larger than {max_mib} MiB, the most an adapter may be\nhint: build it in release mode; the first-party adapters are under 200 KiB"
    )]
    TooLarge { path: PathBuf, max_mib: u64 },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// A loaded adapter, ready to instantiate.
#[derive(Clone)]
pub struct Loaded {
    pub path: PathBuf,
    /// SHA-256 of the file's bytes.
    pub digest: [u8; 32],
    pub pre: Pre,
    pub info: Info,
    pub bytes: usize,
    pub from_cache: bool,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded").field("path", &self.path).field("info", &self.info).finish()
    }
}

/// What an adapter says about itself.
/// The longest name, version, server or tool an adapter's `adapter-info` is shown with,
/// and the most servers and tools.
const MAX_INFO_BYTES: usize = 256;
const MAX_INFO_ITEMS: usize = 64;
/// The longest error an adapter's load ends with (a compiler's, its `declare`'s).
pub const MAX_ERROR_BYTES: usize = 4 << 10;

#[derive(Debug, Clone)]
pub struct Info {
    pub name: String,
    pub version: String,
    /// The contract version it speaks.
    pub contract: &'static str,
    pub needs: Needs,
    pub servers: Vec<String>,
    pub tools: Vec<String>,
}

/// Loads the adapter at `path`: read (bounded), compiled (or taken from the cache),
/// checked against what it may import and the contracts this host speaks, and asked who
/// it is.
pub fn load(runtime: &Runtime, path: &Path) -> Result<Loaded, LoadError> {
    load_unless_known(runtime, path, &[]).map(|(loaded, _)| loaded)
}

/// Whether a load compiled (or took from the cache), instantiated and asked its adapter,
/// or found the same bytes loaded before on the same runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fresh {
    Yes,
    No,
}

/// [`load`], unless `known` (loaded before on `runtime`) holds the same bytes: then that
/// load, found at `path`, and nothing is asked of the adapter.
fn load_unless_known(runtime: &Runtime, path: &Path, known: &[(String, Loaded)]) -> Result<(Loaded, Fresh), LoadError> {
    let bytes = read(path)?;
    let digest: [u8; 32] = {
        use sha2::Digest;
        sha2::Sha256::digest(&bytes).into()
    };
    if let Some((_, before)) = known.iter().find(|(_, l)| l.digest == digest) {
        return Ok((Loaded { path: path.to_owned(), ..before.clone() }, Fresh::No));
    }
    // What the component makes the host say (a compiler's error names what it found in
    // the component; `declare`'s patterns) is shown bounded and on one line.
    let invalid =
        |message: String| LoadError::Invalid { path: path.to_owned(), message: shown(&message, MAX_ERROR_BYTES) };
    let (component, from_cache) = compile(runtime, &bytes).map_err(|e| invalid(format!("does not compile: {e:#}")))?;
    let version = contract(runtime, &component, path)?;
    let pre = runtime.linker.instantiate_pre(&component).map_err(|e| invalid(format!("cannot be linked: {e:#}")))?;
    let mismatch = |e: wasmtime::Error| invalid(format!("does not match the contract: {e:#}"));
    let pre = match version {
        "0.2.0" => Pre::V0_2(v0_2::PluginPre::new(pre).map_err(mismatch)?),
        _ => Pre::V0_1(v0_1::PluginPre::new(pre).map_err(mismatch)?),
    };
    let (info, manifest) = introduce(runtime, &pre).map_err(invalid)?;
    let needs = Needs::from_manifest(&manifest).map_err(|e| invalid(format!("declares {e}")))?;
    Ok((
        Loaded {
            path: path.to_owned(),
            digest,
            pre,
            // What it says of itself is shown to operators, bounded and on one line.
            info: Info {
                name: shown(&info.name, MAX_INFO_BYTES),
                version: shown(&info.version, MAX_INFO_BYTES),
                contract: version,
                servers: info.servers.iter().take(MAX_INFO_ITEMS).map(|s| shown(s, MAX_INFO_BYTES)).collect(),
                tools: info.tools.iter().take(MAX_INFO_ITEMS).map(|t| shown(t, MAX_INFO_BYTES)).collect(),
                needs,
            },
            bytes: bytes.len(),
            from_cache,
        },
        Fresh::Yes,
    ))
}

/// The bytes of the component at `path`, at most [`MAX_COMPONENT_BYTES`], which must be a
/// WebAssembly component.
fn read(path: &Path) -> Result<Vec<u8>, LoadError> {
    let bytes = open_file(path)
        .and_then(compiler::read_component)
        .map_err(|source| LoadError::Read { path: path.to_owned(), source })?;
    if bytes.len() as u64 > MAX_COMPONENT_BYTES {
        return Err(LoadError::TooLarge { path: path.to_owned(), max_mib: MAX_COMPONENT_BYTES >> 20 });
    }
    let not = |what: &str| LoadError::NotComponent { path: path.to_owned(), what: what.to_owned() };
    match bytes.get(..8) {
        Some([0, b'a', b's', b'm', 0x0d, 0, 1, 0]) => Ok(bytes),
        Some([0, b'a', b's', b'm', 1, 0, 0, 0]) => Err(not("it is a core WebAssembly module")),
        Some([0, b'a', b's', b'm', ..]) => Err(not("an unknown WebAssembly encoding")),
        _ if bytes.is_empty() => Err(not("the file is empty")),
        _ => Err(not("the file does not start with the WebAssembly magic number")),
    }
}

/// `path` opened for reading, if it is a regular file. What it is is asked of what was
/// opened, not of the path (which may have changed since it was checked), and opening
/// never waits: a FIFO put in the plugins folder would otherwise hold the load, and the
/// gateway's start or every later reload, until someone wrote to it.
fn open_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "it is not a regular file"));
    }
    Ok(file)
}

/// The contract version `component` speaks, of those this host does, once it imports
/// nothing but what adapters may.
fn contract(runtime: &Runtime, component: &Component, path: &Path) -> Result<&'static str, LoadError> {
    let ty = component.component_type();
    let engine = &runtime.engine;
    for (name, _) in ty.imports(engine) {
        let interface = name.split('@').next().unwrap_or(name);
        if !ALLOWED_IMPORTS.contains(&interface) {
            return Err(LoadError::Forbidden { path: path.to_owned(), import: shown(name, MAX_INFO_BYTES) });
        }
    }
    let exported: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_owned()).collect();
    let contract = exported.iter().find_map(|n| n.strip_prefix("rebound:adapter/adapter@"));
    let unsupported = |found: String| LoadError::Contract {
        path: path.to_owned(),
        found: shown(&found, MAX_INFO_BYTES),
        supported: bindings::SUPPORTED.join(" and @"),
        newest: bindings::SUPPORTED[0].to_owned(),
    };
    match contract {
        Some(v) => bindings::SUPPORTED
            .iter()
            .find(|s| compatible(v, s))
            .copied()
            .ok_or_else(|| unsupported(format!("rebound:adapter@{v}"))),
        None if exported.is_empty() => Err(unsupported("no contract (it exports nothing)".into())),
        None => Err(unsupported(format!("no contract it knows (it exports {})", exported.join(", ")))),
    }
}

/// How many times loading asks an adapter who it is, or what it needs, before its
/// failure is taken for its own: on a machine loaded by other processes, a sound adapter
/// can be kept from its deadline once (its thread not run); a broken one fails each time.
pub(super) const LOAD_ATTEMPTS: usize = 3;

/// Asks the adapter who it is and what it needs, under the same limits as every call: a
/// plugin that cannot answer that ([`LOAD_ATTEMPTS`] times over) is broken (why, for its
/// error).
fn introduce(runtime: &Runtime, pre: &Pre) -> Result<(v0_1::rebound::adapter::types::AdapterInfo, Manifest), String> {
    let output = CappedPipe::new(4 << 10);
    let state = || {
        State::new(
            "loading".into(),
            "-".into(),
            "null".into(),
            Default::default(),
            std::sync::Arc::new(super::state::log_budget()),
            output.clone(),
            runtime.limits.memory,
        )
    };
    let ask = |request: fn() -> Request| async move {
        let busy = |r: &Result<Reply, Fault>| matches!(r, Err(Fault::Busy));
        let mut attempts = 1;
        loop {
            match while_busy(|| runtime.invoke(pre, state(), request()), busy).await {
                Err(Fault::Failed(_)) if attempts < LOAD_ATTEMPTS => attempts += 1,
                asked => return asked,
            }
        }
    };
    let asked = block_on(async { (ask(|| Request::Info).await, ask(|| Request::Declare).await) });
    match asked {
        Ok((Ok(Reply::Info(info)), Ok(Reply::Declared(manifest)))) => Ok((info, manifest)),
        Ok((Err(e), _) | (_, Err(e))) => {
            Err(format!("failed when asked who it is: {e}; its output: {}", output.text()))
        }
        Ok(_) => Err("answered who it is with something else".into()),
        Err(e) => Err(format!("could not be asked who it is: {e}")),
    }
}

/// What an adapter declared it needs, checked.
#[derive(Debug, Clone)]
pub struct Needs {
    /// Tools beyond its own server's that its plans may call.
    pub tools: Vec<ToolPattern>,
    pub restart: bool,
    /// Tools of its own server whose successes it observes (patterns on the tool name).
    pub observes: Vec<ToolPattern>,
}

/// The most patterns an adapter may declare in each list.
const MAX_DECLARED: usize = 64;

impl Needs {
    pub(crate) fn from_manifest(m: &Manifest) -> Result<Self, String> {
        if m.tools.len() > MAX_DECLARED || m.observes.len() > MAX_DECLARED {
            return Err(format!("more than {MAX_DECLARED} patterns"));
        }
        let tools = m.tools.iter().map(|p| ToolPattern::parse(p)).collect::<Result<_, _>>()?;
        let observes = m.observes.iter().map(|p| ToolPattern::parse(&format!("*/{p}"))).collect::<Result<_, _>>()?;
        Ok(Self { tools, restart: m.restart, observes })
    }

    /// Whether the adapter of `server` declared that it calls `target/tool`: its own
    /// server's tools it always may.
    pub fn tool(&self, server: &str, target: &str, tool: &str) -> bool {
        target == server || self.tools.iter().any(|p| p.matches(target, tool))
    }

    pub fn observes(&self, tool: &str) -> bool {
        self.observes.iter().any(|p| p.matches("", tool))
    }
}

/// Runs `future` to completion on a runtime of its own, on a thread of its own, so that
/// loading works the same from inside an async runtime or outside one.
pub(crate) fn block_on<T: Send>(future: impl std::future::Future<Output = T> + Send) -> std::io::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
                Ok(rt.block_on(future))
            })
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the loading thread panicked")))
    })
}

/// How long loading an adapter waits for the instance pool while other adapters' calls
/// keep it busy: a reload must not drop an adapter because others held every instance.
const LOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// `attempt`, made again while what it ends with is `busy` (it found no instance free),
/// for up to [`LOAD_WAIT`].
pub(crate) async fn while_busy<T, F: Future<Output = T>>(
    mut attempt: impl FnMut() -> F,
    busy: impl Fn(&T) -> bool,
) -> T {
    let until = std::time::Instant::now() + LOAD_WAIT;
    loop {
        let done = attempt().await;
        if !busy(&done) || std::time::Instant::now() >= until {
            return done;
        }
    }
}

/// `found` can be served by the bindings of `supported`: same major (and, in 0.x,
/// minor) version.
fn compatible(found: &str, supported: &str) -> bool {
    let parts = |v: &str| v.split('.').map(|p| p.parse::<u64>().unwrap_or(u64::MAX)).collect::<Vec<_>>();
    let (f, s) = (parts(found), parts(supported));
    match (f.as_slice(), s.as_slice()) {
        ([0, fm, ..], [0, sm, ..]) => fm == sm,
        ([fmaj, ..], [smaj, ..]) => fmaj == smaj,
        _ => false,
    }
}

/// Compiles `bytes`, through the cache when there is one, in a compiler process of its
/// own when the program enabled that (`compiler`), else in memory.
fn compile(runtime: &Runtime, bytes: &[u8]) -> anyhow::Result<(Component, bool)> {
    let engine = &runtime.engine;
    let Some(dir) = runtime.cache_dir() else {
        return Ok((compile_uncached(runtime, bytes)?, false));
    };
    let file = dir.join(format!("{}.cwasm", cache_key(engine, bytes)));
    if let Ok(cached) = load_cached(engine, &file) {
        return Ok((cached, true));
    }
    // A name no other gateway sharing the folder picks, created afresh (never truncating
    // a file another may be loading), then renamed into place whole.
    let tmp = file.with_extension(format!("tmp-{}-{:016x}", std::process::id(), rand::random::<u64>()));
    if let Some(compiled) = compile_apart(runtime, bytes, &tmp, || install(engine, &tmp, &file))? {
        return Ok((compiled, false));
    }
    let component = Component::from_binary(engine, bytes)?;
    let Ok(serialized) = component.serialize() else { return Ok((component, false)) };
    if let Err(e) = compiler::create_private(&tmp).and_then(|mut f| std::io::Write::write_all(&mut f, &serialized)) {
        tracing::debug!("the compiled plugin {} is not cached: {e}", file.display());
        let _ = std::fs::remove_file(&tmp);
        return Ok((component, false));
    }
    // Loaded back from the cache: its code is then mapped from the file, as on every
    // later start, instead of held in memory of its own (1 MB resident for three adapters).
    Ok((install(engine, &tmp, &file).unwrap_or(component), false))
}

/// Why compiled code was not loaded.
#[derive(Debug, thiserror::Error)]
enum Unloaded {
    /// It was not stored or could not be read: nothing is said of the component.
    #[error("it could not be stored or read")]
    NotRead,
    /// wasmtime refused it: past what the gateway's engine allows (the instance pool's
    /// memories, tables and instances, which only the gateway's engine checks). The
    /// component's fault: compiling it again, in the gateway, would only be refused again
    /// once compiled, with none of the compiler process's bounds on the way.
    #[error("{0}")]
    Refused(wasmtime::Error),
}

/// Without a cache, still in a compiler process where the program enabled that, with its
/// bounds: into a temporary folder of this user's alone, gone once the code is read.
fn compile_uncached(runtime: &Runtime, bytes: &[u8]) -> anyhow::Result<Component> {
    if compiler::enabled() {
        let private = tempfile::Builder::new()
            .prefix(&format!("{}{}-", super::runtime::COMPILE_FOLDER, std::process::id()))
            .tempdir()
            .and_then(|dir| super::runtime::private_dir(dir.path()).map(|()| dir));
        match private {
            Ok(dir) => {
                let file = dir.path().join("plugin.cwasm");
                let load = || read_compiled(&runtime.engine, &file);
                if let Some(compiled) = compile_apart(runtime, bytes, &file, load)? {
                    return Ok(compiled);
                }
            }
            Err(e) => {
                tracing::warn!("no temporary folder to compile a plugin in ({e}); compiling in the gateway instead")
            }
        }
    }
    Ok(Component::from_binary(&runtime.engine, bytes)?)
}

/// Compiles `bytes` in a compiler process into the new file `tmp`, and loads what it wrote
/// with `load`: the component's fault if the compiler refused it, ran out of time or
/// memory, or the gateway's engine refused what it compiled; `None` when the process
/// could not deliver for any other reason (then it is compiled in memory) or in a
/// program that does not compile this way.
fn compile_apart(
    runtime: &Runtime,
    bytes: &[u8],
    tmp: &Path,
    load: impl FnOnce() -> Result<Component, Unloaded>,
) -> anyhow::Result<Option<Component>> {
    if !compiler::enabled() {
        return Ok(None);
    }
    match compiler::compile_apart(bytes, tmp, runtime.compile_timeout()) {
        Ok(()) => match load() {
            Ok(loaded) => Ok(Some(loaded)),
            Err(Unloaded::Refused(e)) => {
                Err(anyhow::Error::from(e).context("compiled, it is past what the plugin runtime allows"))
            }
            Err(Unloaded::NotRead) => {
                tracing::warn!(
                    "the compiled plugin {} could not be stored and loaded; compiling in the gateway instead",
                    tmp.display()
                );
                Ok(None)
            }
        },
        Err(CompileError::Failed(reason)) => anyhow::bail!(reason),
        Err(e) => {
            tracing::warn!("{e}; compiling in the gateway instead");
            Ok(None)
        }
    }
}

/// Puts the compiled code written to `tmp` in the cache as `file` (whole, by a rename),
/// and loads it from there; with `tmp` gone if either fails.
fn install(engine: &wasmtime::Engine, tmp: &Path, file: &Path) -> Result<Component, Unloaded> {
    let installed = match std::fs::rename(tmp, file) {
        Ok(()) => load_cached(engine, file),
        Err(_) => Err(Unloaded::NotRead),
    };
    if installed.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    installed
}

/// The compiled code a compiler process wrote to `file`, in a temporary folder of this
/// user's alone, or a cache entry that could not be mapped: read into memory, not mapped
/// from the file (a temporary folder is often on a filesystem where code cannot be mapped
/// to run, `noexec`).
fn read_compiled(engine: &wasmtime::Engine, file: &Path) -> Result<Component, Unloaded> {
    if !cached_entry_is_ours(file) {
        return Err(Unloaded::NotRead);
    }
    let compiled = std::fs::read(file).map_err(|_| Unloaded::NotRead)?;
    // SAFETY: the file is a regular file of this user's (checked right above) in a folder
    // made for this compile that only this user can enter, or in the cache, a folder only
    // this user can write (`load_cached`), written by a compiler process (this same
    // binary, `compiler::run`) or by `compile`, with `Component::serialize` for this
    // engine's settings; wasmtime checks the header against this engine too.
    #[allow(unsafe_code, reason = "loading the component our own compiler process compiled")]
    let loaded = unsafe { Component::deserialize(engine, &compiled) };
    loaded.map_err(Unloaded::Refused)
}

/// The cache entry `file`, if it is ours and loads; one that fails to load is removed.
fn load_cached(engine: &wasmtime::Engine, file: &Path) -> Result<Component, Unloaded> {
    if !cached_entry_is_ours(file) {
        if std::fs::symlink_metadata(file).is_ok() {
            tracing::warn!(
                "not loading the cached plugin {}: not a file of this user's that only it can write",
                file.display()
            );
        }
        return Err(Unloaded::NotRead);
    }
    // SAFETY: the file is a regular file in a folder only this user can write (checked
    // when the runtime started, and `cached_entry_is_ours` right above), named by the
    // SHA-256 of the component, of this gateway's version (which fixes wasmtime's) and of
    // the engine's settings, and was written by `Component::serialize` in `compile` or
    // in a compiler process (this same binary, `compiler::run`). wasmtime checks the
    // header against this engine too, and an entry that fails to load is compiled afresh.
    #[allow(unsafe_code, reason = "loading our own cached, compiled component")]
    let cached = unsafe { Component::deserialize_file(engine, file) };
    // Mapped from the file where it can be, else read into memory (a cache on a
    // `noexec` file system cannot be mapped to run): refused only when that fails too.
    cached.or_else(|_| read_compiled(engine, file)).inspect_err(|e| {
        tracing::warn!("discarding the cached plugin {}: {e}", file.display());
        let _ = std::fs::remove_file(file);
    })
}

/// Whether `file` is a regular file (not a link) of this user's that nobody else can
/// write: checked again right before it is loaded, not only when the folder was.
fn cached_entry_is_ours(file: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(file)
        .is_ok_and(|m| m.file_type().is_file() && m.uid() == nix::unistd::geteuid().as_raw() && m.mode() & 0o022 == 0)
}

/// The cache entry's name: SHA-256 over the component's bytes, this gateway's version
/// and the engine's compatibility hash (wasmtime's version, target and settings).
fn cache_key(engine: &wasmtime::Engine, bytes: &[u8]) -> String {
    use sha2::Digest;
    /// Feeds what `Hash` writes into SHA-256, for a hash stable across Rust releases.
    struct Feed(sha2::Sha256);
    impl Hasher for Feed {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
    }
    let mut feed = Feed(sha2::Sha256::new());
    feed.0.update(sha2::Sha256::digest(bytes));
    feed.0.update(env!("CARGO_PKG_VERSION").as_bytes());
    engine.precompile_compatibility_hash().hash(&mut feed);
    feed.0.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// An adapter file's load (or why not), by the adapter's name.
pub type Named<T> = (String, Result<T, LoadError>);

/// Loads every adapter file the configuration names, keyed by adapter name; a file whose
/// bytes `known` (loaded before on `runtime`) holds is that load again ([`Fresh::No`]).
pub fn load_all<'a>(
    runtime: &Arc<Runtime>,
    dir: &Path,
    names: impl IntoIterator<Item = &'a str>,
    known: &[(String, Loaded)],
) -> Vec<Named<(Loaded, Fresh)>> {
    let mut seen = std::collections::BTreeSet::new();
    names
        .into_iter()
        .filter(|n| seen.insert(n.to_string()))
        .map(|n| (n.to_owned(), load_unless_known(runtime, &dir.join(format!("{n}.wasm")), known)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{LoadError, compatible, read};

    #[test]
    fn only_a_regular_file_is_read_and_a_fifo_does_not_hold_the_load() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("x.wasm");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let Err(LoadError::Read { source, .. }) = read(&fifo) else { panic!("a FIFO was read") };
        assert!(source.to_string().contains("not a regular file"), "{source}");
        let Err(LoadError::Read { .. }) = read(dir.path()) else { panic!("a folder was read") };
        std::fs::write(dir.path().join("y.wasm"), b"\0asm\x0d\0\x01\0").unwrap();
        assert_eq!(read(&dir.path().join("y.wasm")).unwrap().len(), 8);
    }

    #[test]
    fn contract_versions() {
        assert!(compatible("0.1.0", "0.1.0"));
        assert!(compatible("0.1.3", "0.1.0"));
        assert!(!compatible("0.2.0", "0.1.0"));
        assert!(!compatible("9.0.0", "0.1.0"));
        assert!(compatible("1.4.0", "1.0.0"));
        assert!(!compatible("junk", "0.1.0"));
    }
}
