//! The adapter plugin host: WebAssembly components that carry one server's knowledge of
//! its failures (`wit/since_v0.2.0/adapter.wit`; adapters built against
//! `wit/since_v0.1.0` keep loading), run sandboxed in wasmtime.
//!
//! One [`Runtime`] (engine, linker, compiled-component cache) loads each adapter once
//! ([`load::load`]: checked, compiled or taken from the cache, pre-instantiated); every
//! call then runs in a fresh store with a memory cap and an epoch deadline, on the
//! caller's task until the guest first yields, then on the plugins' own thread
//! ([`adapter::Adapter`]). Faults are contained: logged with the plugin's stderr,
//! answered with "no opinion" (so the built-in classifier stands), and a plugin that keeps
//! faulting is quarantined for a while.

pub mod adapter;
mod bindings;
pub mod compiler;
mod kv;
pub mod load;
pub mod runtime;
mod state;

pub use adapter::{Adapter, Adapters};
pub use load::LoadError;
pub use runtime::Runtime;

use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;

/// The default adapter, used for servers that name none when its file is there.
pub const DEFAULT_ADAPTER: &str = "thanos-classify";

/// The adapters a configuration asks for, loaded (or why not).
pub struct Prepared {
    pub adapters: Adapters,
    /// Per server: the adapter it was meant to have and why it does not.
    pub failures: Vec<(String, String, String)>,
    /// By adapter name, the adapters loaded (kept for the next reload: see [`Before`]).
    pub loaded: Vec<(String, load::Loaded)>,
    pub runtime: Option<Arc<Runtime>>,
}

impl Prepared {
    /// What a reload may keep of these adapters.
    pub fn before(&self) -> Before {
        Before { runtime: self.runtime.clone(), loaded: self.loaded.clone(), adapters: self.adapters.clone() }
    }
}

/// The adapters a reload finds running, which it keeps where nothing they were made of
/// changed: a file of the same bytes is not compiled, instantiated and asked who it is
/// again, and a server's adapter with the same name, code, runtime, `adapter_config` and
/// clients ([`Adapter::introduced_as`]) is not asked again what it needs (`declare`). So a reload costs no adapter calls for what it
/// leaves alone, and an adapter that would fail to answer now (a hostile or flaky one)
/// cannot refuse a reload that does not touch it, a token's rotation among them.
#[derive(Clone, Default)]
pub struct Before {
    runtime: Option<Arc<Runtime>>,
    loaded: Vec<(String, load::Loaded)>,
    adapters: Adapters,
}

/// The adapter each server uses: its own, else the default when that file exists.
pub fn adapter_for<'a>(config: &'a Config, server: &'a crate::config::ServerConfig) -> Option<&'a str> {
    server.adapter.as_deref().or_else(|| {
        config.settings.plugins_dir.join(format!("{DEFAULT_ADAPTER}.wasm")).is_file().then_some(DEFAULT_ADAPTER)
    })
}

/// Loads every adapter `config` uses. Call it outside the async runtime: loading runs
/// each plugin once. A plugin that fails to load is reported and its servers use the
/// built-in classifier; nothing here fails the gateway.
pub fn prepare(config: &Config, clients: Clients) -> Prepared {
    prepare_reusing(config, Before::default(), clients)
}

/// How many clients a gateway's shared servers answer: one over stdio, any number over
/// HTTP. An adapter of a server shared by many is shown each client's failed calls to
/// classify and plan, and may read its store then but not write it: what it kept of one
/// client's call could reach another's plan. (A `scope: session` server's instance
/// serves one client on either front.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clients {
    One,
    Many,
}

/// [`prepare`] at a reload, keeping what it may of `before`: its runtime when its limits
/// and cache are the ones `config` asks for (one engine, one instance pool, one epoch
/// thread), and on that runtime its adapters as [`Before`] says.
pub fn prepare_reusing(config: &Config, before: Before, clients: Clients) -> Prepared {
    let mut prepared =
        Prepared { adapters: Adapters::default(), failures: Vec::new(), loaded: Vec::new(), runtime: None };
    let wanted: Vec<(&str, &str)> =
        config.servers.values().filter_map(|s| Some((s.name.as_str(), adapter_for(config, s)?))).collect();
    if wanted.is_empty() {
        return prepared;
    }
    let runtime = match runtime_for(config, before.runtime.clone()) {
        Ok(r) => r,
        Err(e) => {
            // Each server's adapter failed with it: shown in the status, and a reload
            // refused (not taken with no adapters at all).
            let why = format!("the plugin runtime could not start: {e:#}");
            tracing::error!("{why}; every server uses the built-in classifier");
            prepared.failures = wanted
                .iter()
                .map(|(server, adapter)| ((*server).to_owned(), (*adapter).to_owned(), why.clone()))
                .collect();
            return prepared;
        }
    };
    runtime.set_compile_timeout(Duration::from_millis(config.settings.plugin_compile_timeout_ms));
    // What was loaded on this runtime before (its code is this runtime's engine's).
    let same = before.runtime.as_ref().is_some_and(|r| Arc::ptr_eq(r, &runtime));
    let (known, kept) = if same { (&before.loaded[..], &before.adapters) } else { (&[][..], &Adapters::default()) };
    let loads = load::load_all(&runtime, &config.settings.plugins_dir, wanted.iter().map(|(_, a)| *a), known);
    for (name, result) in &loads {
        match result {
            Ok((l, load::Fresh::No)) => tracing::debug!(adapter = %name, "{}: unchanged", l.path.display()),
            Ok((l, load::Fresh::Yes)) => {
                tracing::info!(adapter = %name, version = %l.info.version, "loaded {} ({} KiB{})", l.path.display(), l.bytes / 1024, if l.from_cache { ", compiled code from the cache" } else { "" });
            }
            Err(e) => tracing::error!(adapter = %name, "{e}"),
        }
    }
    let loads: Vec<_> = loads.into_iter().map(|(name, r)| (name, r.map(|(l, _)| l))).collect();
    introduce(&mut prepared, (&runtime, clients), config, &wanted, (&loads, kept));
    prepared.loaded = loads.into_iter().filter_map(|(name, r)| Some((name, r.ok()?))).collect();
    prepared.runtime = Some(runtime);
    prepared
}

/// The runtime `config`'s limits and cache ask for: `runtime` (a reload's previous one)
/// when they are its own, else a new one.
fn runtime_for(config: &Config, runtime: Option<Arc<Runtime>>) -> anyhow::Result<Arc<Runtime>> {
    let limits = runtime::Limits {
        memory: config.settings.plugin_memory_mb.saturating_mul(1 << 20),
        timeout: Duration::from_millis(config.settings.plugin_timeout_ms),
    };
    let cache = config.settings.plugin_cache_dir.clone().or_else(Runtime::default_cache);
    // (A cache the configuration names in the plugins folder is refused by `config`.)
    let cache = cache.filter(|c| {
        let apart = !crate::config::within(c, &config.settings.plugins_dir);
        if !apart {
            tracing::warn!(
                "not using the plugin cache at {}: it is in the plugins folder; plugins are compiled on every start",
                c.display()
            );
        }
        apart
    });
    // A cache folder refused before, and still refused, asks for no new runtime.
    let usable = cache.as_deref().filter(|c| runtime::private_dir(c).is_ok());
    match runtime {
        Some(r) if r.limits == limits && r.cache_dir() == usable => Ok(r),
        before => {
            let fresh = Runtime::new(limits, cache)?;
            if let Some(before) = before {
                fresh.count_on_from(&before);
            }
            Ok(fresh)
        }
    }
}

/// Each server of `wanted` given its adapter from `loads`, introduced to the server (its
/// `declare` asked with the server's `adapter_config`); a failure is the server's.
fn introduce(
    prepared: &mut Prepared,
    (runtime, clients): (&Arc<Runtime>, Clients),
    config: &Config,
    wanted: &[(&str, &str)],
    (loads, kept): (&[load::Named<load::Loaded>], &Adapters),
) {
    let secrets = crate::redact::Secrets::of(config);
    for &(server, adapter) in wanted {
        // (A `scope: session` server's adapter serves through its forks, one client
        // each, `Adapter::fork`; itself, as many as the front has.)
        let entry = &config.servers[server];
        match loads.iter().find(|(n, _)| n == adapter).map(|(_, r)| r) {
            Some(Ok(loaded)) => {
                let serving = (server, clients);
                // The same code, asked with the same configuration, has declared already.
                let asked = kept
                    .get(server)
                    .filter(|old| old.introduced_as((runtime, loaded, adapter), serving, &entry.adapter_config));
                let made = match asked {
                    Some(old) => Ok(old.renewed(loaded, secrets.clone())),
                    None => {
                        Adapter::new(runtime.clone(), loaded, adapter, serving, &entry.adapter_config, secrets.clone())
                    }
                };
                match made {
                    Ok(a) => prepared.adapters.insert(server, a),
                    Err(e) => {
                        // Its `declare` may have chosen the words: bounded, on one line.
                        let e = format!("{}: {}", loaded.path.display(), crate::text::shown(&e, load::MAX_ERROR_BYTES));
                        tracing::error!(adapter, server, "{e}");
                        prepared.failures.push((server.to_owned(), adapter.to_owned(), e));
                    }
                }
            }
            Some(Err(e)) => prepared.failures.push((server.to_owned(), adapter.to_owned(), e.to_string())),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reload that asks for the same limits and cache keeps the runtime, even when the
    /// cache folder was refused (here, writable by others): refused again, it asks for no
    /// new engine, pool and epoch thread.
    #[tokio::test]
    async fn a_refused_cache_folder_keeps_the_runtime_across_reloads() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let text = serde_json::json!({"mcpServers": {}, "rebound": {"plugin_cache_dir": open.join("cache")}});
        let config = crate::config::parse(&text.to_string(), &dir.path().join("rebound.json"), &|_| None).unwrap();
        let first = runtime_for(&config, None).unwrap();
        assert_eq!(first.cache_dir(), None, "the cache was refused");
        let second = runtime_for(&config, Some(first.clone())).unwrap();
        assert!(Arc::ptr_eq(&first, &second), "a new runtime for the same settings");
    }

    /// New plugin limits make a new runtime, on which each adapter's stores, observe
    /// queues and plans count towards the bounds they counted towards before: adapters
    /// moved to it keep their stores, and the new ones' join them, not a second 64 MiB.
    #[tokio::test]
    async fn a_new_runtime_counts_on_what_the_adapters_held_on_the_one_before() {
        let dir = tempfile::tempdir().unwrap();
        let config = |memory: u64| {
            let text = serde_json::json!({"mcpServers": {}, "rebound": {"plugin_memory_mb": memory, "plugin_cache_dir": dir.path().join("cache")}});
            crate::config::parse(&text.to_string(), &dir.path().join("rebound.json"), &|_| None).unwrap()
        };
        let first = runtime_for(&config(16), None).unwrap();
        first.room("kept").stored.fetch_add(100, std::sync::atomic::Ordering::Relaxed);
        let second = runtime_for(&config(32), Some(first.clone())).unwrap();
        assert!(!Arc::ptr_eq(&first, &second), "new limits, a new runtime");
        let (before, after) = (first.room("kept"), second.room("kept"));
        assert!(Arc::ptr_eq(&before.stored, &after.stored) && Arc::ptr_eq(&before.observing, &after.observing));
        assert!(Arc::ptr_eq(&before.planned, &after.planned));
        assert_eq!(after.stored.load(std::sync::atomic::Ordering::Relaxed), 100);
        assert!(!Arc::ptr_eq(&before.share, &after.share), "the pool is the new runtime's");
        assert!(!Arc::ptr_eq(&first.room("new").stored, &second.room("new").stored), "none before: its own");
    }
}
