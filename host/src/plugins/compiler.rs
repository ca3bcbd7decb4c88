//! Compiling an adapter in a process of its own. An adapter is a third party's code, and
//! compiling it is work it chooses: a component can be made to keep Cranelift busy, or
//! its memory growing, for as long as it likes. So the gateway hands the bytes to a
//! second `rebound` process (`rebound __compile OUT PARENT`, the binary itself with a
//! hidden word) that compiles them under a memory limit, writes the compiled code to the
//! new file `OUT` (to become a cache entry) and exits; the gateway stops it past a deadline
//! (`rebound.plugin_compile_timeout_ms`), reports why, and loads the entry. The
//! compiler's working memory, threads and code pages stay out of the gateway too.
//!
//! Only a program that enables it (the `rebound` binary does) compiles this way; without a
//! cache, into a private temporary folder. Otherwise, or when the process cannot run or get
//! ready, or its output cannot be installed, a component is compiled in memory
//! (`load::compile`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The subcommand that compiles one component (hidden from `--help`).
pub const SUBCOMMAND: &str = "__compile";

/// The largest component file the gateway reads, and a compiler process accepts.
pub const MAX_COMPONENT_BYTES: u64 = 32 << 20;

/// The most memory a compiler process may allocate (its data segment, `RLIMIT_DATA`).
/// Compiling a first-party adapter peaks at about 23 MB resident, 60 ms.
const COMPILER_MEMORY: u64 = 1 << 30;

/// What a compiler process may say on stderr that is kept for the error.
const ERROR_BYTES: u64 = 4 << 10;

/// The exit code of a compiler process that could not get ready (not the adapter's fault).
const SETUP_FAILED: i32 = 2;

/// The most compiled code one component may make: eight times the largest component.
pub const MAX_COMPILED_BYTES: usize = 8 * MAX_COMPONENT_BYTES as usize;

/// The most threads a compiler process compiles on.
const MAX_THREADS: usize = 4;

static PROGRAM: OnceLock<PathBuf> = OnceLock::new();

/// Compiles adapters in processes of `program` (this binary: `/proc/self/exe`, which
/// stays this binary even when its file is replaced or removed) from now on.
pub fn enable(program: PathBuf) {
    let _ = PROGRAM.set(program);
}

/// Whether adapters are compiled in processes of their own.
pub fn enabled() -> bool {
    PROGRAM.get().is_some()
}

/// Why a compiler process did not deliver.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// It could not be run at all: compile in memory instead.
    #[error("the compiler process could not run: {0}")]
    Unavailable(#[source] std::io::Error),
    /// It ran and refused the component, ran out of time or memory, or died: the reason.
    #[error("{0}")]
    Failed(String),
}

/// Compiles `bytes` in a compiler process into the new file `out`, within `timeout`.
pub fn compile_apart(bytes: &[u8], out: &Path, timeout: Duration) -> Result<(), CompileError> {
    let program = PROGRAM.get().ok_or_else(|| CompileError::Unavailable(std::io::ErrorKind::NotFound.into()))?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS));
    let mut child = Command::new(program)
        .arg(SUBCOMMAND)
        .arg(out)
        .arg(std::process::id().to_string())
        // Nothing of the gateway's environment (where the servers' `${VAR}` secrets come
        // from) reaches the process that reads what a plugin's author wrote, but the one
        // variable wasmtime's settings read, which its compiled code must match.
        .env_clear()
        .envs(std::env::vars_os().filter(|(name, _)| name == "WASMTIME_BACKTRACE_DETAILS"))
        // Its compiler threads' stacks count towards its memory limit.
        .env("RAYON_NUM_THREADS", threads.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(CompileError::Unavailable)?;
    // Both pipes on threads of their own, so that neither a compiler that stops reading
    // nor one that says a lot holds the gateway past the deadline. A compiler that dies
    // early closes its input: what it says is the reason. Both threads end with it.
    let mut input = child.stdin.take().expect("stdin is piped");
    let mut stderr = child.stderr.take().expect("stderr is piped");
    std::thread::scope(|threads| {
        threads.spawn(move || input.write_all(bytes));
        let said = threads.spawn(move || {
            let mut kept = Vec::new();
            let _ = (&mut stderr).take(ERROR_BYTES).read_to_end(&mut kept);
            let _ = std::io::copy(&mut stderr, &mut std::io::sink());
            String::from_utf8_lossy(&kept).trim().to_owned()
        });
        let Some(status) = wait_within(&mut child, timeout) else {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(out);
            return Err(CompileError::Failed(format!(
                "its compiler was stopped after {} ms (`rebound.plugin_compile_timeout_ms`)",
                timeout.as_millis()
            )));
        };
        let said = said.join().unwrap_or_default();
        if status.success() {
            return Ok(());
        }
        let _ = std::fs::remove_file(out);
        match status.code() {
            Some(SETUP_FAILED) => Err(CompileError::Unavailable(std::io::Error::other(said))),
            _ => Err(CompileError::Failed(failure(status, &said))),
        }
    })
}

/// Waits for `child` until `timeout`, polling: `None` if it is still running then.
fn wait_within(child: &mut std::process::Child, timeout: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + timeout;
    let mut pause = Duration::from_micros(200);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < end => {
                std::thread::sleep(pause.min(end.saturating_duration_since(Instant::now())));
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            // Still running at the deadline, or it cannot be waited for: it is stopped.
            _ => return None,
        }
    }
}

/// What a compiler process's end says, for the error: what it said, or how it ended.
fn failure(status: ExitStatus, said: &str) -> String {
    use std::os::unix::process::ExitStatusExt;
    let Some(signal) = status.signal() else {
        return if said.is_empty() { format!("the compiler process failed ({status})") } else { said.to_owned() };
    };
    let name = nix::sys::signal::Signal::try_from(signal).map_or_else(|_| signal.to_string(), |s| s.to_string());
    let memory = if said.contains("memory allocation") {
        format!(" (its memory is limited to {} MiB)", COMPILER_MEMORY >> 20)
    } else {
        String::new()
    };
    let said = if said.is_empty() { String::new() } else { format!(": {said}") };
    format!("the compiler process was stopped by {name}{said}{memory}")
}

/// The compiler process itself: the component on stdin, its compiled code into the new
/// file `out`; `parent` is the gateway's pid. Only the compiling is the adapter's doing,
/// and how much code it compiles to (at most [`MAX_COMPILED_BYTES`]); code of more than
/// [`COMPILED_IN_GATEWAY`] that does not fit where it is written (a full disk, a quota)
/// is refused too, without blame, since the gateway would hold as much compiling it in
/// its own memory, unbounded: anything else that fails (its limits, its input, the file)
/// exits with [`SETUP_FAILED`], and the gateway compiles it.
pub fn run(out: &Path, parent: &str) -> ExitCode {
    let setup = |e: anyhow::Error| {
        eprintln!("{e:#}");
        ExitCode::from(SETUP_FAILED as u8)
    };
    let bytes = match prepare(parent).and_then(|()| Ok(read_component(std::io::stdin().lock())?)) {
        Ok(bytes) => bytes,
        Err(e) => return setup(e),
    };
    let compiled = match compile(&bytes) {
        Ok(compiled) => compiled,
        Err(e) => {
            eprintln!("{e:#}");
            return ExitCode::FAILURE;
        }
    };
    match deliver(&compiled, out, MAX_COMPILED_BYTES) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Undelivered::TooLarge(why)) => {
            eprintln!("{why}");
            ExitCode::FAILURE
        }
        Err(Undelivered::NoRoom(e)) if compiled.len() > COMPILED_IN_GATEWAY => {
            let folder = out.parent().unwrap_or(out).display();
            eprintln!(
                "its {} MiB of compiled code do not fit in {folder} ({e}); it is not compiled in the gateway instead, which would hold as much in its memory (free room there, or set `rebound.plugin_cache_dir` to a folder with room)",
                compiled.len().div_ceil(1 << 20)
            );
            ExitCode::FAILURE
        }
        Err(Undelivered::Unwritten(e) | Undelivered::NoRoom(e)) => {
            setup(anyhow::Error::new(e).context(format!("cannot write {}", out.display())))
        }
    }
}

/// Why compiled code was not written.
#[derive(Debug)]
enum Undelivered {
    /// More than the most one component may make: the component's doing.
    TooLarge(String),
    /// No room for it where it goes (the disk is full, a quota or a file size limit).
    NoRoom(std::io::Error),
    /// The file could not be made or written otherwise: not the component's doing.
    Unwritten(std::io::Error),
}

/// Writes `compiled` into the new file `out` if it is at most `most` bytes.
fn deliver(compiled: &[u8], out: &Path, most: usize) -> Result<(), Undelivered> {
    if compiled.len() > most {
        let mib = |n: usize| n.div_ceil(1 << 20);
        return Err(Undelivered::TooLarge(format!(
            "it compiles to {} MiB of code, more than {} MiB",
            mib(compiled.len()),
            mib(most)
        )));
    }
    let file = create_private(out).map_err(Undelivered::Unwritten)?;
    written(file, compiled)
}

/// The most compiled code the gateway compiles in its own memory when it finds no room
/// on disk (the first-party adapters' is a few MiB).
const COMPILED_IN_GATEWAY: usize = 16 << 20;

/// `compiled` written whole into `file`, and on its disk (where some file systems say
/// they have no room).
fn written(mut file: std::fs::File, compiled: &[u8]) -> Result<(), Undelivered> {
    file.write_all(compiled).and_then(|()| file.sync_all()).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => Undelivered::NoRoom(e),
        _ => Undelivered::Unwritten(e),
    })
}

/// Ends with the gateway (even one killed while it compiles, or before this ran) and
/// limits its memory.
fn prepare(parent: &str) -> anyhow::Result<()> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
    anyhow::ensure!(nix::unistd::getppid().as_raw().to_string() == parent, "the gateway that started it is gone");
    limit_memory()
}

/// A component from `from`, read up to one byte past [`MAX_COMPONENT_BYTES`] (so that a
/// larger one is seen to be larger): the gateway's read of the file and this process's
/// of its input.
pub(super) fn read_component(from: impl Read) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    from.take(MAX_COMPONENT_BYTES + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The component's compiled code, serialized.
fn compile(bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
    anyhow::ensure!(bytes.len() as u64 <= MAX_COMPONENT_BYTES, "larger than {} MiB", MAX_COMPONENT_BYTES >> 20);
    // The gateway's compilation settings; the instance allocator is not among them, and
    // nothing is instantiated here. Its own threads compile in parallel: they end with it.
    let mut config = super::runtime::compilation();
    config.parallel_compilation(true);
    let engine = wasmtime::Engine::new(&config)?;
    Ok(wasmtime::component::Component::from_binary(&engine, bytes)?.serialize()?)
}

/// Creates the new file `path`, readable and writable by this user only (whatever the
/// umask), failing if anything is there already.
pub(super) fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)
}

/// Limits this process's data segment (heap and private mappings) to [`COMPILER_MEMORY`],
/// or to the hard limit it was given when that is lower.
fn limit_memory() -> anyhow::Result<()> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_DATA)?;
    let limit = COMPILER_MEMORY.min(hard);
    setrlimit(Resource::RLIMIT_DATA, limit, hard)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Code past the most a component may make is refused as the component's doing, and
    /// nothing is written; a file that cannot be made is not its doing.
    #[test]
    fn compiled_code_is_written_only_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("code");
        let code = vec![7u8; 3 << 20];
        let Err(Undelivered::TooLarge(why)) = deliver(&code, &out, 2 << 20) else { panic!("past the bound") };
        assert_eq!(why, "it compiles to 3 MiB of code, more than 2 MiB");
        assert!(!out.exists(), "nothing written");
        deliver(&code, &out, code.len()).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), code);
        assert!(matches!(deliver(&code, &out, code.len()), Err(Undelivered::Unwritten(_))), "never over a file");
        // A full disk (every write to /dev/full fails with ENOSPC) is no room, not a
        // reason to compile in the gateway.
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        assert!(matches!(written(full, &code), Err(Undelivered::NoRoom(_))));
    }
}
