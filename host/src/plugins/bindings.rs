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

/// The contract versions a plugin may export, newest first.
pub const SUPPORTED: &[&str] = &["0.2.0", "0.1.0"];
