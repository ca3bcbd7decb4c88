//! The `rebound` command line: `serve` the gateway, or `check` a configuration.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use rebound::config::{self, Launch};
use rebound::gateway::downstreams::Front;
use rebound::gateway::{Gateway, Hub};
use rebound::redact::Secrets;
use rmcp::ServiceExt;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing_appender::non_blocking::WorkerGuard;

#[derive(Parser)]
#[command(
    name = "rebound",
    version,
    about = "An MCP gateway that keeps an agent's tools working when the servers behind them fail"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve MCP on stdio in front of the configured servers.
    Serve {
        /// The configuration file (Claude-style `mcpServers`, plus Rebound's keys).
        #[arg(long, short)]
        config: PathBuf,
        /// Serve streamable HTTP at `http://ADDR/mcp` (e.g. 127.0.0.1:8080) instead of stdio.
        #[arg(long, value_name = "ADDR")]
        http: Option<std::net::SocketAddr>,
    },
    /// Validate a configuration without starting anything.
    Check {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Print the state of a running `serve --http` gateway as a table.
    Status {
        /// The gateway's address, e.g. http://127.0.0.1:8080 (its /mcp URL works too).
        #[arg(long)]
        url: String,
        /// The gateway's operator token, or its token when it has none (default:
        /// $REBOUND_OPERATOR_TOKEN, else $REBOUND_AUTH_TOKEN).
        #[arg(long)]
        token: Option<String>,
        /// Print the JSON document instead of the table.
        #[arg(long)]
        json: bool,
    },
}

/// Log lines waiting to be written to stderr at most.
const LOG_LINES_QUEUED: usize = 8192;

/// The log's writer thread, and the count of lines it dropped.
struct Log {
    dropped: tracing_appender::non_blocking::ErrorCounter,
    written: WorkerGuard,
}

impl Log {
    /// Says how many lines were dropped, then lets the writer finish, for at most
    /// `within`: its thread may be blocked on a stderr nobody reads, and the process must
    /// exit all the same.
    fn finish(self, within: Duration) {
        let dropped = self.dropped.dropped_lines();
        if dropped > 0 {
            tracing::warn!("{dropped} log lines were dropped: stderr was not read fast enough");
        }
        let (done, finished) = std::sync::mpsc::channel();
        let written = self.written;
        let _ = std::thread::Builder::new().name("rebound-log-end".into()).spawn(move || {
            drop(written);
            let _ = done.send(());
        });
        let _ = finished.recv_timeout(within);
    }
}

/// A panic (a bug; the gateway answers the call it was in with an error) is written to
/// the log as every line is: redacted, on one line, queued for stderr. The default hook
/// writes to stderr itself, and on a stderr the client does not read would stop the
/// panicking thread, and over stdio with it the whole gateway.
fn log_panic(info: &std::panic::PanicHookInfo<'_>) {
    let at = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
    let backtrace = std::backtrace::Backtrace::capture();
    let backtrace = match backtrace.status() {
        std::backtrace::BacktraceStatus::Captured => format!("; {backtrace}"),
        _ => String::new(),
    };
    tracing::error!(at, "Rebound panicked (a bug): {}{backtrace}", rebound::text::of_panic(info.payload()));
}

fn main() -> ExitCode {
    // The watchdog (see `transport::watchdog`) is this binary too, with a hidden word.
    if std::env::args().nth(1).as_deref() == Some(rebound::transport::watchdog::SUBCOMMAND) {
        rebound::transport::watchdog::run(std::io::stdin().lock());
        return ExitCode::SUCCESS;
    }
    // So is the adapter compiler (see `plugins::compiler`).
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == rebound::plugins::compiler::SUBCOMMAND) {
        return match (args.next(), args.next()) {
            (Some(out), Some(parent)) => {
                rebound::plugins::compiler::run(std::path::Path::new(&out), &parent.to_string_lossy())
            }
            _ => ExitCode::FAILURE,
        };
    }
    rebound::plugins::compiler::enable("/proc/self/exe".into());
    let cli = Cli::parse();
    // stdout is the protocol: every log line goes to stderr, written by a thread of its
    // own, so that a client that does not drain the gateway's stderr never stops the
    // runtime. Past LOG_LINES_QUEUED lines waiting (of at most MAX_LOG_LINE bytes each),
    // lines are dropped, not queued.
    let (log, written) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(LOG_LINES_QUEUED)
        .lossy(true)
        .thread_name("rebound-log")
        .finish(std::io::stderr());
    let log_written = Log { dropped: log.error_counter(), written };
    tracing_subscriber::fmt()
        // Each line is redacted, kept to one line and cut before it is queued.
        .with_writer(move || rebound::redact::LogLine(log.clone()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("REBOUND_LOG").unwrap_or_else(|_| "info,rmcp=warn".into()),
        )
        .with_ansi(false)
        .init();
    std::panic::set_hook(Box::new(log_panic));
    let result = match cli.command {
        Command::Serve { config, http } => serve(config, http, log_written),
        Command::Check { config } => check(config),
        Command::Status { url, token, json } => {
            let from = |var| std::env::var(var).ok().filter(|t| !t.is_empty());
            let token = token.or_else(|| from("REBOUND_OPERATOR_TOKEN")).or_else(|| from("REBOUND_AUTH_TOKEN"));
            status(&url, token.as_deref(), json)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprint_shown("error: ", &format!("{e:#}"), 16 << 10);
            ExitCode::FAILURE
        }
    }
}

/// How long `rebound status` waits for the gateway's whole answer.
const STATUS_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

fn status(url: &str, token: Option<&str>, json: bool) -> Result<()> {
    let base = url.trim_end_matches('/').trim_end_matches("/mcp");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let doc: serde_json::Value = runtime.block_on(async {
        // A wedged gateway, the one an operator most wants to look at, answers nothing:
        // the command says so rather than wait for ever.
        let mut request = reqwest::Client::new().get(format!("{base}/status")).timeout(STATUS_WITHIN);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let unanswered = |e: reqwest::Error| match e.is_timeout() {
            true => anyhow::anyhow!("the gateway at {base} did not answer within {} s", STATUS_WITHIN.as_secs()),
            false => anyhow::Error::new(e).context(format!("cannot reach the gateway at {base}")),
        };
        let response = request.send().await.map_err(unanswered)?;
        match response.status() {
            reqwest::StatusCode::UNAUTHORIZED => {
                anyhow::bail!(
                    "the gateway wants its token: pass --token or set REBOUND_OPERATOR_TOKEN (or REBOUND_AUTH_TOKEN, when it has no operator token)"
                )
            }
            s if !s.is_success() => anyhow::bail!("the gateway answered {s} for {base}/status"),
            _ => response.json().await.map_err(|e| match e.is_timeout() {
                true => unanswered(e),
                false => anyhow::Error::new(e).context("the gateway's status is not JSON"),
            }),
        }
    })?;
    if json {
        // The document quotes servers' errors: nothing in it drives the terminal.
        println!("{}", rebound::text::json_for_terminal(&serde_json::to_string_pretty(&doc)?));
    } else {
        print!("{}", rebound::gateway::status::table(&doc));
    }
    Ok(())
}

fn check(path: PathBuf) -> Result<()> {
    let config = config::load(&path)?;
    let secrets = Secrets::of(&config);
    rebound::redact::redact_logs(secrets.clone());
    println!("{}: {} server(s)", config.source.display(), config.servers.len());
    // What the file says is printed as a terminal shows it, not as it would obey it
    // (a key name or a command may hold escapes or line breaks), and redacted.
    let shown = |text: &str| rebound::text::shown(&secrets.redact(text), 4096);
    // In the report, where they are read, not in the log.
    for warning in &config.warnings {
        println!("  warning: {}", shown(warning));
    }
    for (name, server) in &config.servers {
        if let Some(warning) = command_missing(name, server) {
            println!("  warning: {}", shown(&warning));
        }
        let launch = match &server.launch {
            // A secret-named `${VAR}` may be in the arguments (`--token ${GITHUB_TOKEN}`).
            Launch::Stdio(s) => format!("stdio: {}", shown(&format!("{} {}", s.command, s.args.join(" ")))),
            Launch::Http(h) if h.headers.is_empty() => format!("streamable HTTP: {}", shown(&h.url)),
            // Header values are often credentials: names only.
            Launch::Http(h) => format!(
                "streamable HTTP: {} (headers: {})",
                shown(&h.url),
                shown(&h.headers.keys().map(String::as_str).collect::<Vec<_>>().join(", "))
            ),
        };
        let adapter = rebound::plugins::adapter_for(&config, server).unwrap_or("built-in classifier");
        println!(
            "  {name}: {launch}\n    adapter: {adapter}; timeout {} ms; {} attempts; breaker {}/{}",
            server.recovery.timeout_ms,
            server.recovery.retry.max_attempts,
            server.recovery.breaker.failure_threshold,
            server.recovery.breaker.open_ms,
        );
    }
    let plugins = rebound::plugins::prepare(&config, rebound::plugins::Clients::One);
    for (name, loaded) in &plugins.loaded {
        println!(
            "  plugin {name}: {} {} ({} KiB{}) ok",
            loaded.info.name,
            loaded.info.version,
            loaded.bytes / 1024,
            if loaded.from_cache { ", cached" } else { "" }
        );
    }
    for (server, adapter) in plugins.adapters.iter() {
        for line in grant_mismatches(&config.servers[&**server], &adapter.name, &adapter.declared()) {
            println!("  warning: {}", rebound::text::shown(&line, 4096));
        }
    }
    if !plugins.failures.is_empty() {
        let mut seen = std::collections::BTreeSet::new();
        for (_, name, e) in &plugins.failures {
            if seen.insert(name) {
                eprint_shown(&format!("error: plugin {name}: "), e, 4096);
            }
        }
        anyhow::bail!(
            "{} plugin(s) could not be loaded; `serve` would run those servers with the built-in classifier",
            seen.len()
        );
    }
    println!("ok");
    Ok(())
}

/// `text` on stderr after `first`, each of its lines `shown` (at most `max` bytes): a
/// configuration's key names and an adapter's words are in it, and none may drive the
/// terminal of whoever reads them.
fn eprint_shown(first: &str, text: &str, max: usize) {
    for (n, line) in text.lines().enumerate() {
        let line = rebound::text::shown(line, max);
        if n == 0 { eprintln!("{first}{line}") } else { eprintln!("{line}") }
    }
}

/// Where a server's grant (`adapter_allow`) and what its adapter declared differ. A step
/// runs only when both allow it, so either side's extra is dead weight or a refusal.
fn grant_mismatches(
    server: &rebound::config::ServerConfig,
    adapter: &str,
    declared: &rebound::config::AdapterGrant,
) -> Vec<String> {
    let name = &server.name;
    let grant = &server.adapter_allow;
    let mut out = Vec::new();
    for (i, p) in grant.tools.iter().enumerate() {
        if p.server() != name.as_str() && !declared.tools.iter().any(|d| d.covers(p)) {
            out.push(format!(
                "mcpServers.{name}.adapter_allow.tools[{i}] grants \"{p}\", which adapter {adapter} does not ask for"
            ));
        }
    }
    for p in declared.tools.iter().filter(|p| p.server() != name.as_str()) {
        if !grant.tools.iter().any(|g| g.covers(p)) {
            out.push(format!(
                "adapter {adapter} asks for \"{p}\", which mcpServers.{name}.adapter_allow.tools does not grant: those steps will be refused"
            ));
        }
    }
    if server.scope == rebound::config::Scope::Shared && !declared.observes.is_empty() && grant.observes.is_empty() {
        out.push(format!(
            "adapter {adapter} observes calls of `{name}`, a shared server: over HTTP, where it serves every client, it is shown none unless mcpServers.{name}.adapter_allow.observes grants them (or the server is \"scope\": \"session\")"
        ));
    }
    match (grant.restart, declared.restart) {
        (true, false) => out.push(format!(
            "mcpServers.{name}.adapter_allow.restart grants restarts, which adapter {adapter} does not ask for"
        )),
        (false, true) => out.push(format!(
            "adapter {adapter} asks to restart `{name}`, which mcpServers.{name}.adapter_allow.restart does not grant: its restarts will be refused"
        )),
        _ => {}
    }
    out
}

/// Why `server`'s command will not start, if it is not there: looked up as its process
/// will be, on the `PATH` of its environment (the configuration's `env`, else Rebound's),
/// from its working directory.
fn command_missing(name: &str, server: &rebound::config::ServerConfig) -> Option<String> {
    let Launch::Stdio(s) = &server.launch else { return None };
    if s.command.contains(rebound::config::SESSION_VAR) {
        return None;
    }
    let path = s.env.get("PATH").cloned().or_else(|| std::env::var("PATH").ok()).unwrap_or_default();
    let cwd = s.cwd.clone().or_else(|| std::env::current_dir().ok()).unwrap_or_default();
    match which::which_in(&s.command, Some(&path), &cwd) {
        Ok(_) => None,
        Err(_) if s.command.contains('/') => Some(format!(
            "mcpServers.{name}.command: {} is not an executable file (hint: check the path, or install the server)",
            s.command
        )),
        Err(_) => Some(format!(
            "mcpServers.{name}.command: `{}` is not found on PATH (hint: install it, or give its full path)",
            s.command
        )),
    }
}

/// SIGHUP, as a stream of reload requests.
fn hangups() -> Result<tokio::sync::mpsc::Receiver<()>> {
    let mut hup = signal(SignalKind::hangup())?;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let _ = tx.try_send(());
        }
    });
    Ok(rx)
}

/// The one client on stdin and stdout, until its input ends.
async fn serve_stdio(hub: Arc<Hub>, max_in_flight: usize, shutdown: CancellationToken) -> Result<()> {
    // Non-blocking pipes where stdin and stdout are pipes (as under every MCP client):
    // tokio's `stdin()` hands each read to a blocking thread, which cost a quarter of the
    // round trip (cargo xtask bench).
    let (read, write) = rmcp::transport::stdio_pipes();
    // (After `run` took the signals: from here on, one ends the gateway cleanly.)
    tracing::info!("serving one client over stdio");
    use rebound::gateway::stdio_client;
    let transport = stdio_client::StdioClient::new(read, write, stdio_client::MAX_LINE, max_in_flight);
    let (ended, all_answered) = (transport.ended(), transport.all_answered());
    // A signal before the client's `initialize` ends the wait for it.
    let running = tokio::select! {
        running = Gateway::new(hub.clone()).into_service().serve(transport) => {
            running.context("the client did not complete the MCP handshake")?
        }
        () = shutdown.cancelled() => return Ok(()),
    };
    // Kept, not dropped, until the answers are written: dropping the service cancels
    // every request in flight, as if the client had.
    let waiting = running.waiting();
    tokio::pin!(waiting);
    // When the client's input ends, the servers are stopped at once: rmcp would first
    // wait up to 5 s for calls in flight, past the 4 s clients allow.
    tokio::select! {
        _ = &mut waiting => {}
        () = ended.cancelled() => {}
        () = shutdown.cancelled() => {
            // The calls in flight are answered that the gateway shut down (they may have
            // run), not cancelled as if the client had asked, and the answers written
            // before the servers stop.
            hub.stop_calls();
            let _ = tokio::time::timeout(Duration::from_secs(1), all_answered).await;
        }
    }
    Ok(())
}

/// The async runtime: for `http`, on half the cores unless `worker_threads` says
/// otherwise.
fn runtime(http: bool, worker_threads: Option<usize>) -> Result<tokio::runtime::Runtime> {
    // One client over stdio asks one call at a time or a few: a single thread serves it
    // with no hand-off between threads on the call's path (`cargo xtask bench`, the
    // official Python SDK over stdio: 1.55× direct on the multi-threaded runtime, 1.35×
    // on this one). Over HTTP, half the cores: the servers behind the gateway run on the
    // same machine and do the tools' work, and a call's hops between the gateway's tasks
    // cost more as hand-offs between threads than a second thread gives back (on two
    // cores, one thread served more calls/s than two at 1 and at 16 sessions in every pass
    // of docs/benchmarks.md's 2026-11-28 runs). Adapters yield at each epoch tick (a thread
    // of their own), and compiling one on reload runs on the blocking pool, so neither
    // holds a thread for long.
    let threads = worker_threads.unwrap_or_else(|| half_the_cores(std::thread::available_parallelism()));
    if !http || threads == 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build()
    }
    .context("cannot start the async runtime")
}

/// The HTTP front's threads by default: half the cores, at least one.
fn half_the_cores(cores: std::io::Result<std::num::NonZeroUsize>) -> usize {
    cores.map_or(1, |n| (n.get() / 2).max(1))
}

/// Serves clients over `http` or stdio until the clients go or a signal comes: SIGTERM
/// and SIGINT stop new calls and answer those in flight first (over HTTP within
/// `shutdown_grace_ms`; over stdio at once, that the gateway shut down). A second signal
/// meanwhile ends the wait: the gateway exits at once, and the watchdog stops its
/// servers.
async fn run(
    hub: &Arc<Hub>,
    http: Option<std::net::SocketAddr>,
    max_in_flight: usize,
    tokens: rebound::gateway::reload::TokenCell,
) -> Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let shutdown = CancellationToken::new();
    let serving = async {
        match http {
            Some(addr) => rebound::gateway::http::serve(hub.clone(), addr, tokens, shutdown.clone()).await,
            None => serve_stdio(hub.clone(), max_in_flight, shutdown.clone()).await,
        }
    };
    tokio::pin!(serving);
    tokio::select! {
        r = &mut serving => return r,
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
    shutdown.cancel();
    let again = tokio::select! {
        r = &mut serving => return r,
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    // At once: not even the servers' stop sequence, which the watchdog takes over when
    // this process is gone, nor the log's flush (so said on stderr itself).
    eprintln!(
        "rebound: a second {again}: exiting without waiting for the calls in flight; the watchdog stops the servers"
    );
    std::process::exit(1)
}

/// `log` is the log's writer: finished (so flushed) before the process exits.
fn serve(path: PathBuf, http: Option<std::net::SocketAddr>, log: Log) -> Result<()> {
    rebound::memory::return_large_blocks();
    // The servers run as the gateway's user: without this, any of them could read the
    // gateway's environment (its tokens, the secrets its configuration reads) and memory
    // from `/proc`, whatever their own environment leaves out. Reset on `exec`, so the
    // servers themselves are as they would be (and the gateway dumps no core).
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        tracing::warn!("the gateway's /proc entries stay readable to its servers ({e})");
    }
    let read = rebound::gateway::reload::Stamp::of(&path);
    let config = config::load(&path)?;
    rebound::redact::redact_logs(Secrets::of(&config));
    config.log_warnings();
    if let Err(e) = rebound::transport::watchdog::start() {
        tracing::warn!("no watchdog ({e}): if the gateway is killed, its servers may outlive it");
    }
    let runtime = runtime(http.is_some(), config.settings.http.worker_threads)?;
    // Taken from the start: compiling adapters below can take a while, and SIGHUP's
    // default action would end the gateway meanwhile. One that comes reloads once serving.
    let hangups = {
        let _in = runtime.enter();
        hangups()?
    };
    // Outside the async runtime: loading runs each plugin once, synchronously; the OTLP
    // exporter's client blocks on a thread of its own.
    // The adapters as they are before they are read (the file's stamp was taken before it).
    let read = read.with_plugins(&config.settings.plugins_dir);
    let front = if http.is_some() { Front::Http } else { Front::Stdio };
    let plugins = rebound::plugins::prepare(&config, front.clients());
    // An adapter compiled in the gateway (when no compiler process could: see
    // `plugins::compiler`) leaves the compiler's working memory in the heap arenas (3 MB
    // of the 36 resident at idle, with three adapters), and loading leaves some too.
    rebound::memory::trim();
    match rebound::telemetry::init() {
        Ok(true) => tracing::info!("exporting traces over OTLP"),
        Ok(false) => {}
        Err(e) => tracing::warn!("{e}; no traces will be exported"),
    }
    let max_in_flight = config.settings.http.max_concurrent_per_client;
    let tokens = tokio::sync::watch::Sender::new(rebound::gateway::reload::Tokens::of(&config.settings.http));
    let outcome = runtime.block_on(async {
        let hub = Hub::start(config, plugins, front);
        rebound::gateway::reload::watch(&hub, path.clone(), read, hangups, tokens.clone());
        let outcome = run(&hub, http, max_in_flight, tokens).await;
        // Calls still running (their client gone) end as shut down, in the errors log.
        hub.stop_calls();
        hub.shutdown().await;
        tracing::info!("all servers stopped");
        outcome
    });
    rebound::telemetry::shutdown();
    // Through the log, whose writer never blocks the exit (stderr may be full).
    if let Err(e) = &outcome {
        tracing::error!("{e:#}");
    }
    log.finish(Duration::from_secs(1));
    // A blocking read of stdin cannot be cancelled: exit rather than wait for the runtime
    // to drop it.
    std::process::exit(i32::from(outcome.is_err()))
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    #[test]
    fn the_http_front_takes_half_the_cores_and_at_least_one() {
        let cores = |n| Ok(NonZeroUsize::new(n).unwrap());
        assert_eq!(super::half_the_cores(cores(1)), 1);
        assert_eq!(super::half_the_cores(cores(2)), 1);
        assert_eq!(super::half_the_cores(cores(3)), 1);
        assert_eq!(super::half_the_cores(cores(16)), 8);
        assert_eq!(super::half_the_cores(Err(std::io::Error::other("unknown"))), 1);
    }
}
