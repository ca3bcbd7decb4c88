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

/// The contract versions a plugin may export, newest first.
pub const SUPPORTED: &[&str] = &["0.1.0"];
