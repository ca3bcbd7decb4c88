//! Host bindings of every contract version this gateway speaks (one `bindgen!` per
//! frozen WIT folder), converted to the recovery engine's own types.

pub mod v0_1 {
    wasmtime::component::bindgen!({
        world: "plugin",
        path: "../wit/since_v0.1.0",
    });
}

/// The contract versions a plugin may export, newest first.
pub const SUPPORTED: &[&str] = &["0.1.0"];
