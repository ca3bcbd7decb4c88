//! `cargo xtask …`: the one entry point for building plugins, testing, the demo and
//! benchmarks. Plain Rust so there are no shell scripts to keep in sync.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  test                      install the test peers (npm, pip) and run every test
  demo                      the gateway recovering real failures, end to end
  build-plugins [--release] build plugins/* for wasm32-wasip2 into target/plugins/NAME.wasm
  new-plugin NAME [--dir D] scaffold a third-party adapter in D/NAME (default plugins/NAME)
  conformance               the official MCP conformance suite against `serve --http`
  chaos [SECONDS]            fault-injecting servers, several clients, a burst of large calls:
                            answered, recovered, failed, latency, memory, orphans (default 30 s)
  setup                     install the test peers only
  bench    the benchmarks, each checked against its target";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = root();
    std::env::set_current_dir(&root)?;
    match args.first().map(String::as_str) {
        Some("test") => test(&root, &args[1..]),
        Some("demo") => demo(&root),
        Some("setup") => setup(&root),
        Some("build-plugins") => build_plugins(&root, args.iter().any(|a| a == "--release")).map(|_| ()),
        Some("new-plugin") => {
            let name = args.get(1).context("usage: cargo xtask new-plugin NAME [--dir DIR]")?;
            let dir = match args.iter().position(|a| a == "--dir") {
                Some(i) => PathBuf::from(args.get(i + 1).context("--dir needs a folder")?),
                None => root.join("plugins"),
            };
            new_plugin(&root, name, &dir).map(|_| ())
        }
        Some("bench") => bench(&root, &args[1..]),
        Some("chaos") => {
            run(cargo().args(["build", "--workspace", "--bins"]))?;
            run(Command::new(root.join("target/debug/chaos")).args(args.get(1)))
        }
        Some("conformance") => {
            setup_node(&root)?;
            run(cargo().args(["build", "-p", "rebound", "--bin", "rebound"]))?;
            conformance(&root)
        }
        Some("-h" | "--help" | "help") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// Runs `cmd`, failing with its command line if it does not succeed.
fn run(cmd: &mut Command) -> Result<()> {
    let line = format!("{cmd:?}");
    eprintln!("$ {line}");
    let status = cmd.status().with_context(|| format!("cannot start {line}"))?;
    if !status.success() {
        bail!("{line} failed with {status}");
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Installs what the end-to-end tests talk to: real third-party MCP servers and clients
/// from npm (`tests/node`), the official Python SDK in a virtualenv (`target/venv`), and
/// Debian's Chromium for the status page.
fn setup(root: &Path) -> Result<()> {
    setup_node(root)?;
    setup_python(root)?;
    setup_chromium()
}

/// Debian's Chromium, which the status page test drives headless (Playwright downloads no
/// browser of its own here).
fn setup_chromium() -> Result<()> {
    if Path::new(CHROMIUM).exists() {
        return Ok(());
    }
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", "chromium"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !install() {
        run(Command::new("apt-get").arg("update"))?;
        run(Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", "chromium"])
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    anyhow::ensure!(Path::new(CHROMIUM).exists(), "installing chromium did not give {CHROMIUM}");
    Ok(())
}

const CHROMIUM: &str = "/usr/bin/chromium";

/// The npm packages: real third-party MCP servers, the SDK and the conformance suite.
fn setup_node(root: &Path) -> Result<()> {
    npm_ci(&root.join("tests/node"))
}

/// `npm ci` in `dir`, unless its lock file is already installed.
fn npm_ci(dir: &Path) -> Result<()> {
    let lock = dir.join("package-lock.json");
    let marker = dir.join("node_modules/.package-lock.json");
    if !marker.exists() || modified(&lock)? > modified(&marker)? {
        let verb = if lock.exists() { "ci" } else { "install" };
        run(Command::new("npm").args([verb, "--no-audit", "--no-fund"]).current_dir(dir))?;
    }
    Ok(())
}

/// The official Python MCP SDK and pytest, in a virtualenv under target/.
fn setup_python(root: &Path) -> Result<()> {
    venv(&root.join("target/venv"), &root.join("tests/python/requirements.txt"))
}

/// A virtualenv at `dir` with `requirements` installed (again only when they change).
fn venv(dir: &Path, requirements: &Path) -> Result<()> {
    let python = dir.join("bin/python");
    let stamp = dir.join(".requirements");
    let wanted = std::fs::read_to_string(requirements)?;
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(&wanted) {
        if !python.exists() {
            run(Command::new("python3").args(["-m", "venv"]).arg(dir))?;
        }
        run(Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r"])
            .arg(requirements))?;
        std::fs::write(&stamp, wanted)?;
    }
    Ok(())
}

fn modified(path: &Path) -> Result<std::time::SystemTime> {
    Ok(std::fs::metadata(path).and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH))
}

fn test(root: &Path, extra: &[String]) -> Result<()> {
    setup(root)?;
    build_plugins(root, true)?;
    build_wasm_crates(root, &root.join("tests/plugins"), &root.join("target/test-plugins"), true)?;
    check_scaffold(root)?;
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo().args(["clippy", "--workspace", "--all-targets", "--quiet", "--", "-D", "warnings"]))?;
    // One build of everything first, so that the end-to-end tests find the binaries they
    // launch (`rebound`, the fault-injecting servers) next to them.
    run(cargo().args(["build", "--workspace", "--bins"]))?;
    run(cargo().args(["test", "--workspace"]).args(extra))?;
    // The plugins' own unit tests: their logic, natively, without a host.
    run(cargo().args(["test", "--manifest-path", "plugins/Cargo.toml", "--target-dir", "target"]))?;
    run(Command::new(root.join("target/venv/bin/python"))
        .args(["-m", "pytest", "-q", "tests/python"])
        .env("REBOUND_BIN_DIR", root.join("target/debug")))?;
    conformance(root)
}

/// The official conformance suite (`@modelcontextprotocol/conformance`, on the Node 22
/// it needs, both from npm) against `rebound serve --http`, with the suite's fixture
/// server (`tests/node/conformance-fixture.mjs`) behind the gateway over stdio. Every
/// active server scenario must pass with no warning: the baseline of expected failures is
/// empty.
fn conformance(root: &Path) -> Result<()> {
    use std::io::{BufRead, BufReader};
    let node_dir = root.join("tests/node");
    let node = node_dir.join("node_modules/.bin/node");
    let suite = node_dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    let out = root.join("target/conformance");
    std::fs::create_dir_all(&out)?;
    let config = out.join("rebound.json");
    let fixture = node_dir.join("conformance-fixture.mjs");
    let servers = format!(
        r#"{{"mcpServers": {{"fixture": {{"command": {node:?}, "args": [{fixture:?}]}}}},
            "rebound": {{"errors_log": "errors.jsonl", "plugins_dir": {plugins:?}}}}}"#,
        plugins = root.join("target/plugins"),
    );
    std::fs::write(&config, servers)?;
    let baseline = out.join("expected-failures.yml");
    std::fs::write(&baseline, "server: []\n")?;

    let log = std::fs::File::create(out.join("rebound.log"))?;
    eprintln!("$ rebound serve --http 127.0.0.1:0 --config {} (log: target/conformance/rebound.log)", config.display());
    let mut gateway = Command::new(root.join("target/debug/rebound"))
        .args(["serve", "--http", "127.0.0.1:0", "--config"])
        .arg(&config)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("cannot start target/debug/rebound")?;
    let stderr = gateway.stderr.take().context("stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let mut url = None;
    for line in lines.by_ref() {
        let line = line?;
        if let Some(u) = line.strip_prefix("rebound: listening on ") {
            url = Some(u.replace("127.0.0.1", "localhost"));
            break;
        }
    }
    // The rest of the log goes to the file, off this thread.
    std::thread::spawn(move || {
        use std::io::Write;
        let mut log = log;
        for line in lines.map_while(Result::ok) {
            let _ = writeln!(log, "{line}");
        }
    });
    let result = match url {
        // The suite's DNS-rebinding scenario needs a localhost URL.
        Some(url) => run(Command::new(&node)
            .arg(&suite)
            .args(["server", "--suite", "active", "--url", &url, "--expected-failures"])
            .arg(&baseline)
            .arg("-o")
            .arg(out.join("results"))),
        None => Err(anyhow::anyhow!("rebound exited before listening; see target/conformance/rebound.log")),
    };
    // SIGTERM, so that the gateway stops the fixture as it exits.
    let _ = Command::new("kill").arg(gateway.id().to_string()).status();
    let _ = gateway.wait();
    result
}

fn demo(root: &Path) -> Result<()> {
    setup_node(root)?;
    build_plugins(root, true)?;
    run(cargo().args(["build", "--workspace", "--bins"]))?;
    run(Command::new(root.join("target/debug/rebound-demo")).current_dir(root))
}

fn bench(root: &Path, extra: &[String]) -> Result<()> {
    let extra = extra.strip_prefix(&["--".to_owned()]).unwrap_or(extra);
    build_plugins(root, true)?;
    run(cargo().args(["build", "--release", "--bins", "-p", "rebound", "-p", "rebound-tests"]))?;
    run(&mut Command::new(root.join("target/release/bench-stdio")))?;
    // The same round trip as one user feels it: the official Python SDK and a real server.
    setup_node(root)?;
    setup_python(root)?;
    run(Command::new(root.join("target/venv/bin/python"))
        .arg(root.join("tests/bench/stdio_python.py"))
        .arg(root.join("target/release/rebound"))
        .arg(root.join("tests/node/node_modules/.bin/mcp-server-everything"))
        .arg(root.join("target/plugins"))
        .arg(root.join("target/release/line-relay")))?;
    // The HTTP peers: supergateway (npm) and mcp-proxy (PyPI), each in its best mode
    // (stateful sessions; one stdio server), and server-everything's own HTTP transport.
    npm_ci(&root.join("tests/bench"))?;
    let bench_venv = root.join("target/bench-venv");
    venv(&bench_venv, &root.join("tests/bench/requirements.txt"))?;
    let supergateway = root.join("tests/bench/node_modules/supergateway/dist/index.js");
    run(Command::new(root.join("target/release/bench-http"))
        .arg("--everything")
        .arg(root.join("tests/node/node_modules/.bin/mcp-server-everything"))
        .args(["--peer", "supergateway", "node"])
        .arg(&supergateway)
        .args(["--stdio", "{server}", "--outputTransport", "streamableHttp", "--stateful", "--port", "{port}"])
        .args(["--logLevel", "none", "--peer", "mcp-proxy"])
        .arg(bench_venv.join("bin/mcp-proxy"))
        .args(["--host", "127.0.0.1", "--port", "{port}", "--log-level", "WARNING", "--", "{server-argv}"]))?;
    run(cargo().args(["bench", "-p", "rebound", "--bench", "plugins"]))?;
    run(cargo().args(["bench", "-p", "rebound", "--bench", "recovery", "--"]).args(extra))
}

const WASM_TARGET: &str = "wasm32-wasip2";

/// Adds the wasm target to the toolchain when it is missing.
fn ensure_wasm_target() -> Result<()> {
    let installed = Command::new("rustup").args(["target", "list", "--installed"]).output();
    match installed {
        Ok(out) if String::from_utf8_lossy(&out.stdout).lines().any(|l| l.trim() == WASM_TARGET) => Ok(()),
        Ok(_) => run(Command::new("rustup").args(["target", "add", WASM_TARGET])),
        // No rustup: the toolchain may still have the target; cargo will say if not.
        Err(_) => Ok(()),
    }
}

/// Builds every crate under `plugins/` into `target/plugins/NAME.wasm`.
fn build_plugins(root: &Path, release: bool) -> Result<Vec<PathBuf>> {
    build_wasm_crates(root, &root.join("plugins"), &root.join("target/plugins"), release)
}

/// Builds each crate in a folder of `dir` as a component into `out/NAME.wasm`.
fn build_wasm_crates(root: &Path, dir: &Path, out: &Path, release: bool) -> Result<Vec<PathBuf>> {
    ensure_wasm_target()?;
    std::fs::create_dir_all(out)?;
    let mut crates: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    crates.sort();
    let profile = if release { "release" } else { "debug" };
    let mut built = Vec::new();
    for krate in crates {
        let name = krate.file_name().and_then(|n| n.to_str()).context("crate folder name")?.to_owned();
        let mut cmd = cargo();
        cmd.arg("rustc").arg("--manifest-path").arg(krate.join("Cargo.toml"));
        cmd.args(["--target", WASM_TARGET, "--crate-type", "cdylib", "--quiet", "--target-dir"])
            .arg(root.join("target"));
        if release {
            cmd.arg("--release");
        }
        run(&mut cmd)?;
        let artifact =
            root.join("target").join(WASM_TARGET).join(profile).join(format!("{}.wasm", name.replace('-', "_")));
        let dest = out.join(format!("{name}.wasm"));
        std::fs::copy(&artifact, &dest).with_context(|| format!("cannot copy {}", artifact.display()))?;
        eprintln!("  {} ({} KiB)", dest.display(), std::fs::metadata(&dest)?.len() / 1024);
        built.push(dest);
    }
    Ok(built)
}

/// Scaffolds a third-party adapter: a standalone crate with its own copy of the
/// contract, an example implementation and a test of its logic.
fn new_plugin(root: &Path, name: &str, dir: &Path) -> Result<PathBuf> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
        bail!("`{name}` is not a plugin name\nhint: use lowercase letters, digits and `-`, e.g. `my-server-adapter`");
    }
    let krate = dir.join(name);
    if krate.exists() {
        bail!("{} already exists\nhint: pick another name or remove it", krate.display());
    }
    std::fs::create_dir_all(krate.join("src"))?;
    std::fs::create_dir_all(krate.join("wit"))?;
    std::fs::copy(root.join("wit/since_v0.2.0/adapter.wit"), krate.join("wit/adapter.wit"))?;
    let ident = name.replace('-', "_");
    std::fs::write(krate.join("Cargo.toml"), SCAFFOLD_MANIFEST.replace("{name}", name))?;
    std::fs::write(krate.join("src/lib.rs"), SCAFFOLD_LIB.replace("{name}", name).replace("{ident}", &ident))?;
    eprintln!(
        "created {}\n  build: cargo xtask build-plugins --release (or cargo rustc --target wasm32-wasip2 --release --crate-type cdylib)\n  test:  cargo test --manifest-path {}",
        krate.display(),
        krate.join("Cargo.toml").display()
    );
    Ok(krate)
}

/// Scaffolds an adapter in target/, runs its test and builds it, as a newcomer would.
fn check_scaffold(root: &Path) -> Result<()> {
    let dir = root.join("target/scaffold-check");
    let _ = std::fs::remove_dir_all(&dir);
    let krate = new_plugin(root, "scaffold-probe", &dir)?;
    run(cargo()
        .arg("test")
        .arg("--quiet")
        .arg("--manifest-path")
        .arg(krate.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(root.join("target")))?;
    build_wasm_crates(root, &dir, &root.join("target/test-plugins"), true)?;
    Ok(())
}

const SCAFFOLD_MANIFEST: &str = r#"[package]
name = "{name}"
description = "A Rebound adapter"
version = "0.1.0"
edition = "2024"

# Standalone: not part of any other workspace.
[workspace]

[dependencies]
wit-bindgen = { version = "0.61", default-features = false, features = ["macros", "realloc"] }

# Components are shipped small: build with
#   cargo rustc --target wasm32-wasip2 --release --crate-type cdylib
[profile.release]
opt-level = "z"
lto = true
codegen-units = 1
panic = "abort"
strip = true
"#;

const SCAFFOLD_LIB: &str = r#"//! {name}: a Rebound adapter. The contract is `wit/adapter.wit`; see PLUGINS.md.

wit_bindgen::generate!({ world: "plugin", path: "wit", additional_derives: [PartialEq] });

use exports::rebound::adapter::adapter::{Guest, Manifest};
use rebound::adapter::types::{AdapterInfo, Category, Classification, CompletedCall, Failure, Outcome, Step};

struct Adapter;

/// Your server's knowledge of its failures, as plain functions you can test natively.
pub fn classify_failure(failure: &Failure, builtin: &Classification) -> Option<Classification> {
    match &failure.outcome {
        // Example: this server says "busy" when it is overloaded; that is worth a retry.
        Outcome::ToolError(text) if text.contains("busy") => Some(Classification {
            category: Category::ServerUnavailable,
            retryable: true,
            message: Some("the server was busy".into()),
            ..builtin.clone()
        }),
        _ => None,
    }
}

pub fn plan_recovery(failure: &Failure, class: &Classification) -> Option<Vec<Step>> {
    // Example: retry a busy server once after 500 ms, then give up with advice.
    (class.category == Category::ServerUnavailable).then(|| {
        let mut steps = Vec::new();
        if failure.attempt == 1 {
            steps.push(Step::Retry(Some(500)));
        }
        steps.push(Step::GiveUp("the server stayed busy; try again later".into()));
        steps
    })
}

impl Guest for Adapter {
    fn info() -> AdapterInfo {
        AdapterInfo { name: "{name}".into(), version: env!("CARGO_PKG_VERSION").into(), servers: vec![], tools: vec![] }
    }

    /// What this adapter needs from the gateway. Its own server's tools need no
    /// declaration; list other servers' tools (`server/tool`, `*` wildcards) and restarts
    /// here, and grant them in the gateway's configuration (`adapter_allow`): a step runs
    /// only when both say yes. `observes` names the tools whose successes `observe` sees.
    fn declare() -> Manifest {
        Manifest { tools: vec![], restart: false, observes: vec![] }
    }

    fn classify(failure: Failure, builtin: Classification) -> Option<Classification> {
        classify_failure(&failure, &builtin)
    }

    fn plan(failure: Failure, class: Classification) -> Option<Vec<Step>> {
        plan_recovery(&failure, &class)
    }

    fn observe(_call: CompletedCall) {
        // Learn from successful calls of the tools `declare` names in `observes`; keep
        // what you learn with rebound::adapter::store::set, since every call runs in a
        // fresh instance.
    }
}

export!(Adapter);

#[cfg(test)]
mod tests {
    use super::*;
    use rebound::adapter::types::Severity;

    fn busy(attempt: u32) -> Failure {
        Failure {
            server: "example".into(),
            tool: "query".into(),
            arguments: "{}".into(),
            attempt,
            elapsed_ms: 0,
            outcome: Outcome::ToolError("server busy, try later".into()),
        }
    }

    fn builtin() -> Classification {
        Classification {
            category: Category::ToolExecution,
            retryable: false,
            retry_after_ms: None,
            counts_for_breaker: false,
            not_delivered: false,
            severity: Severity::Medium,
            message: None,
        }
    }

    #[test]
    fn a_busy_server_is_retried_once() {
        let class = classify_failure(&busy(1), &builtin()).expect("recognised");
        assert!(class.retryable);
        assert_eq!(plan_recovery(&busy(1), &class).unwrap()[0], Step::Retry(Some(500)));
        assert!(matches!(plan_recovery(&busy(2), &class).unwrap()[..], [Step::GiveUp(_)]));
    }
}
"#;
