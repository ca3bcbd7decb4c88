//! hol-cursor: the HOL4 server's knowledge of its own failures.
//!
//! hol4-mcp keeps its sessions in memory: they survive the agent's context but not a
//! server restart. This adapter learns, from successful calls, each session's workdir
//! (`hol_start`) and the proof cursor's file and theorem (`hol_cursor_init`,
//! `hol_cursor_goto`), and keeps them in the host's store. Then:
//!
//! - a timed-out `hol_send` gets `hol_interrupt` for its session and a report, never a
//!   blind replay (the tactic may still be running, or may have changed the proof state);
//! - a call on a session the server does not know (dead, or lost in a restart) gets
//!   `hol_start` replayed with the learned workdir and name, the cursor re-entered at the
//!   remembered theorem where the server has cursor tools, and the call retried (it did
//!   not run, so that is safe);
//! - a failed `holmake` points the agent at the theory's log (`hol_log`).

wit_bindgen::generate!({ world: "plugin", path: "../../wit/since_v0.2.0", additional_derives: [PartialEq] });

mod logic;

use exports::rebound::adapter::adapter::{Guest, Manifest};
use rebound::adapter::types::{AdapterInfo, Classification, CompletedCall, Failure, Step};

struct HolCursor;

/// The host's store, as the logic sees it.
struct HostStore;

impl logic::Store for HostStore {
    fn get(&self, key: &str) -> Option<String> {
        rebound::adapter::store::get(key)
    }

    fn set(&mut self, key: &str, value: &str) {
        if !rebound::adapter::store::set(key, value) {
            rebound::adapter::host::log(rebound::adapter::host::Level::Warn, &format!("store full: `{key}` not kept"));
        }
    }

    fn delete(&mut self, key: &str) {
        rebound::adapter::store::delete(key);
    }
}

impl Guest for HolCursor {
    fn info() -> AdapterInfo {
        AdapterInfo {
            name: "hol-cursor".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            servers: vec!["hol*".into()],
            tools: vec!["hol_*".into(), "holmake".into()],
        }
    }

    fn declare() -> Manifest {
        // Its side calls are its own server's; it learns sessions and cursors from these.
        Manifest {
            tools: vec![],
            restart: false,
            observes: [
                "hol_start",
                "hol_restart",
                "hol_stop",
                "hol_cursor_init",
                "hol_cursor_goto",
                "hol_state_at",
                "hol_check_proof",
                "hol_file_status",
            ]
            .map(String::from)
            .to_vec(),
        }
    }

    fn classify(failure: Failure, builtin: Classification) -> Option<Classification> {
        logic::classify(&failure, &builtin)
    }

    fn plan(failure: Failure, class: Classification) -> Option<Vec<Step>> {
        logic::plan(&HostStore, &failure, &class)
    }

    fn observe(call: CompletedCall) {
        logic::observe(&mut HostStore, &call);
    }
}

export!(HolCursor);
