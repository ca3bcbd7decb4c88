//! Compiling an adapter in a process of its own. An adapter is a third party's code, and
//! compiling it is work it chooses: a component can be made to keep Cranelift busy, or
//! its memory growing, for as long as it likes. So the gateway hands the bytes to a
//! second `rebound` process (`rebound __compile OUT`, the binary itself with a hidden
//! word) that compiles them under a memory limit, writes the compiled code to `OUT` (a
//! cache entry) and exits; the gateway stops it past a deadline
//! (`rebound.plugin_compile_timeout_ms`), reports why, and loads the entry. The
//! compiler's working memory, threads and code pages never enter the gateway either.
//!
//! Only a program that enables it (`rebound serve` and `rebound check` do) compiles this
//! way, and only with a cache to write to; otherwise a component is compiled in memory.

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

static PROGRAM: OnceLock<PathBuf> = OnceLock::new();

/// Compiles adapters in processes of `program` (this binary) from now on.
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

/// Compiles `bytes` in a compiler process into the file `out`, within `timeout`.
pub fn compile_apart(bytes: &[u8], out: &Path, timeout: Duration) -> Result<(), CompileError> {
    let program = PROGRAM.get().ok_or_else(|| CompileError::Unavailable(std::io::ErrorKind::NotFound.into()))?;
    let mut child = Command::new(program)
        .arg(SUBCOMMAND)
        .arg(out)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(CompileError::Unavailable)?;
    // A compiler that dies early closes its input: what it says, below, is the reason.
    let _ = child.stdin.take().expect("stdin is piped").write_all(bytes);
    let Some(status) = wait_within(&mut child, timeout) else {
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_file(out);
        return Err(CompileError::Failed(format!(
            "its compiler was stopped after {} ms (`rebound.plugin_compile_timeout_ms`)",
            timeout.as_millis()
        )));
    };
    if status.success() {
        return Ok(());
    }
    let _ = std::fs::remove_file(out);
    let mut said = String::new();
    if let Some(stderr) = child.stderr.take() {
        let _ = stderr.take(ERROR_BYTES).read_to_string(&mut said);
    }
    Err(CompileError::Failed(failure(status, said.trim())))
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
    match (status.signal(), said) {
        (Some(signal), said) => format!(
            "the compiler process was stopped by signal {signal} (its memory is limited to {} MiB){}{said}",
            COMPILER_MEMORY >> 20,
            if said.is_empty() { "" } else { ": " }
        ),
        (None, "") => format!("the compiler process failed ({status})"),
        (None, said) => said.to_owned(),
    }
}

/// The compiler process itself: the component on stdin, its compiled code into `out`.
pub fn run(out: &Path) -> ExitCode {
    match compile_into(out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

fn compile_into(out: &Path) -> anyhow::Result<()> {
    // It ends with the gateway, even one killed while it compiles.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
    limit_memory()?;
    let mut bytes = Vec::new();
    std::io::stdin().lock().take(MAX_COMPONENT_BYTES + 1).read_to_end(&mut bytes)?;
    anyhow::ensure!(bytes.len() as u64 <= MAX_COMPONENT_BYTES, "larger than {} MiB", MAX_COMPONENT_BYTES >> 20);
    // The gateway's compilation settings; the instance allocator is not among them, and
    // nothing is instantiated here. Its own threads compile in parallel: they end with it.
    let mut config = super::runtime::compilation();
    config.parallel_compilation(true);
    let engine = wasmtime::Engine::new(&config)?;
    let component = wasmtime::component::Component::from_binary(&engine, &bytes)?;
    std::fs::write(out, component.serialize()?)?;
    Ok(())
}

/// Limits this process's data segment (heap and private mappings) to [`COMPILER_MEMORY`].
fn limit_memory() -> anyhow::Result<()> {
    use nix::sys::resource::{Resource, setrlimit};
    setrlimit(Resource::RLIMIT_DATA, COMPILER_MEMORY, COMPILER_MEMORY)?;
    Ok(())
}
