//! `cargo xtask …`: the one entry point for building plugins, testing, the demo and
//! benchmarks. Plain Rust so there are no shell scripts to keep in sync.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  test     install the test peers (npm, pip) and run every test
  demo     the gateway recovering real failures, end to end
  setup    install the test peers only
  bench    the benchmarks, with their targets from DESIGN.md";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = root();
    std::env::set_current_dir(&root)?;
    match args.first().map(String::as_str) {
        Some("test") => test(&root, &args[1..]),
        Some("demo") => demo(&root),
        Some("setup") => setup(&root),
        Some("bench") => bench(&args[1..]),
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
/// from npm (`tests/node`) and the official Python SDK in a virtualenv (`target/venv`).
fn setup(root: &Path) -> Result<()> {
    let node = root.join("tests/node");
    let lock = node.join("package-lock.json");
    let marker = node.join("node_modules/.package-lock.json");
    if !marker.exists() || modified(&lock)? > modified(&marker)? {
        let verb = if lock.exists() { "ci" } else { "install" };
        run(Command::new("npm").args([verb, "--no-audit", "--no-fund"]).current_dir(&node))?;
    }
    let venv = root.join("target/venv");
    let python = venv.join("bin/python");
    let requirements = root.join("tests/python/requirements.txt");
    let stamp = venv.join(".requirements");
    let wanted = std::fs::read_to_string(&requirements)?;
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(&wanted) {
        if !python.exists() {
            run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        }
        run(Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r"])
            .arg(&requirements))?;
        std::fs::write(&stamp, wanted)?;
    }
    Ok(())
}

fn modified(path: &Path) -> Result<std::time::SystemTime> {
    Ok(std::fs::metadata(path).and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH))
}

fn test(root: &Path, extra: &[String]) -> Result<()> {
    setup(root)?;
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo().args(["clippy", "--workspace", "--all-targets", "--quiet", "--", "-D", "warnings"]))?;
    // One build of everything first, so that the end-to-end tests find the binaries they
    // launch (`rebound`, the fault-injecting servers) next to them.
    run(cargo().args(["build", "--workspace", "--bins"]))?;
    run(cargo().args(["test", "--workspace"]).args(extra))?;
    run(Command::new(root.join("target/venv/bin/python"))
        .args(["-m", "pytest", "-q", "tests/python"])
        .env("REBOUND_BIN_DIR", root.join("target/debug")))?;
    Ok(())
}

fn demo(root: &Path) -> Result<()> {
    setup(root)?;
    run(cargo().args(["build", "--workspace", "--bins"]))?;
    run(Command::new(root.join("target/debug/rebound-demo")).current_dir(root))
}

fn bench(extra: &[String]) -> Result<()> {
    let extra = extra.strip_prefix(&["--".to_owned()]).unwrap_or(extra);
    run(cargo().args(["bench", "-p", "rebound", "--bench", "recovery", "--"]).args(extra))
}
