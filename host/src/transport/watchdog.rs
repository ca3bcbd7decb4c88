//! Children die with the gateway, however it dies. A client may SIGKILL the gateway (the
//! official Python SDK does, 4 s after closing its stdin), and then no stop sequence
//! runs. So the gateway starts a watchdog: a second `rebound` process in its own process
//! group, told over a pipe the process group of every server it starts and reaps. When
//! the pipe closes — the gateway exited or was killed — the watchdog sends SIGTERM to every
//! group still listed, then SIGKILL a moment later, and exits. A server's helpers (npx →
//! node) are in its group, so they go too.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::lasting::Locked;

/// The subcommand that runs the watchdog (hidden from `--help`).
pub const SUBCOMMAND: &str = "__watchdog";

/// How long groups get between SIGTERM and SIGKILL once the gateway is gone.
const GRACE: Duration = Duration::from_millis(500);

struct Watchdog {
    pipe: Mutex<ChildStdin>,
    /// Kept so that it is reaped when it exits after us (it never does before).
    _child: Child,
}

static WATCHDOG: OnceLock<Watchdog> = OnceLock::new();

/// Starts the watchdog for this process. Without one (it could not start, or a library
/// user never started it), servers are still stopped on every orderly exit.
pub fn start() -> std::io::Result<()> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .arg(SUBCOMMAND)
        // Nothing of the gateway's environment (its tokens, the secrets its configuration
        // reads): the servers run as the same user, and could read the watchdog's.
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        // Its own group: a signal meant for the gateway's group (a Ctrl-C) does not reach
        // it, so it outlives the gateway and does its job.
        .process_group(0)
        .spawn()?;
    let pipe = child.stdin.take().expect("stdin is piped");
    let _ = WATCHDOG.set(Watchdog { pipe: Mutex::new(pipe), _child: child });
    Ok(())
}

/// Tells the watchdog that process group `pgid` is ours (`+`) or gone (`-`).
pub fn note(pgid: Pid, ours: bool) {
    if let Some(w) = WATCHDOG.get() {
        let line = format!("{}{}\n", if ours { '+' } else { '-' }, pgid.as_raw());
        // A short line on a pipe the watchdog keeps reading: never blocks for long. If the
        // watchdog is gone there is nobody to tell.
        let _ = w.pipe.locked().write_all(line.as_bytes());
    }
}

/// The watchdog itself: keeps the listed groups until its input ends, then stops them.
pub fn run(input: impl BufRead) {
    let mut groups = BTreeSet::new();
    // Bytes, not text: a line that is not UTF-8 is skipped, never the end of the input.
    for line in input.split(b'\n').map_while(Result::ok) {
        let line = String::from_utf8_lossy(&line);
        if let Some(p) = line.strip_prefix('+').and_then(|p| p.parse::<i32>().ok()).filter(|p| *p > 1) {
            groups.insert(p);
        } else if let Some(p) = line.strip_prefix('-').and_then(|p| p.parse::<i32>().ok()) {
            groups.remove(&p);
        }
    }
    if groups.is_empty() {
        return;
    }
    for signal in [Signal::SIGTERM, Signal::SIGKILL] {
        for pgid in &groups {
            // ESRCH: that group is gone already.
            let _ = killpg(Pid::from_raw(*pgid), signal);
        }
        if signal == Signal::SIGTERM {
            std::thread::sleep(GRACE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_stops_the_groups_still_listed_when_its_input_ends() {
        let mut listed = Command::new("sleep").arg("60").process_group(0).spawn().unwrap();
        let mut reaped = Command::new("sleep").arg("60").process_group(0).spawn().unwrap();
        let (a, b) = (listed.id(), reaped.id());
        // A garbage line and the gateway's own group (1 is init) are ignored.
        let mut input = format!("+{a}\n+{b}\n-{b}\nnonsense\n+1\né\n").into_bytes();
        input.extend(b"\xff\xfe\n+");
        run(std::io::Cursor::new(input));
        let status = listed.wait().unwrap();
        assert!(!status.success(), "the listed group was signalled: {status}");
        assert!(reaped.try_wait().unwrap().is_none(), "an unlisted group is left alone");
        let _ = reaped.kill();
        let _ = reaped.wait();
    }
}
