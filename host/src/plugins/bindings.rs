//! Host bindings of every contract version this gateway speaks (one `bindgen!` per
//! frozen WIT folder), converted to the recovery engine's own types.

pub mod v0_1 {
    // Exports are called asynchronously, so that a deadline on the host side can stop a
    // call whatever the guest does (a loop, or a wait in WASI's `poll`); the contract's
    // own imports are quick and stay synchronous.
    wasmtime::component::bindgen!({
        world: "plugin",
        path: "../wit/since_v0.1.0",
        exports: { default: async },
    });
}

pub mod v0_2 {
    // 0.2.0's `types` are 0.1.0's, unchanged: one set of Rust types serves both (the
    // component model checks them structurally when a plugin is linked).
    wasmtime::component::bindgen!({
        world: "plugin",
        path: "../wit/since_v0.2.0",
        exports: { default: async },
        with: { "rebound:adapter/types@0.2.0": super::v0_1::rebound::adapter::types },
    });
}

/// A pre-instantiated adapter, of whichever contract version it speaks.
#[derive(Clone)]
pub enum Pre {
    V0_1(v0_1::PluginPre<super::state::State>),
    V0_2(v0_2::PluginPre<super::state::State>),
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

/// The contract versions a plugin may export, newest first.
pub const SUPPORTED: &[&str] = &["0.2.0", "0.1.0"];
