//! lean-fallback: retry once, then alternatives, for lean-lsp-mcp's failing searches.
//!
//! An `AbortError` (`-32001`, a request timeout, often from several lean-lsp-mcp
//! instances contending for one machine) is retried once after a delay (5 s, or
//! `adapter_config.retry_delay_ms`), then answered by alternative tools (another search
//! such as `lean_loogle` or `lean_leanfinder`, `lean_goal`, `lean_hammer_premise`), with
//! the arguments mapped to each tool's real schema. A rate-limited search goes to
//! `lean_local_search`, which has no rate limit. Works with the 0.30 and 0.31 tool sets:
//! the host skips alternatives the server does not have.

wit_bindgen::generate!({ world: "plugin", path: "../../wit/since_v0.2.0", additional_derives: [PartialEq] });

mod logic;

use exports::rebound::adapter::adapter::{Guest, Manifest};
use rebound::adapter::types::{AdapterInfo, Classification, CompletedCall, Failure, Step};

struct LeanFallback;

impl Guest for LeanFallback {
    fn info() -> AdapterInfo {
        AdapterInfo {
            name: "lean-fallback".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            servers: vec!["lean*".into()],
            tools: vec!["lean_*".into()],
        }
    }

    fn declare() -> Manifest {
        // Its alternatives are its own server's tools; it learns nothing from successes.
        Manifest { tools: vec![], restart: false, observes: vec![] }
    }

    fn classify(failure: Failure, builtin: Classification) -> Option<Classification> {
        logic::classify(&failure, &builtin)
    }

    fn plan(failure: Failure, class: Classification) -> Option<Vec<Step>> {
        let config = logic::Config::from_json(&rebound::adapter::host::config());
        logic::plan(&config, &failure, &class)
    }

    fn observe(_call: CompletedCall) {}
}

export!(LeanFallback);
