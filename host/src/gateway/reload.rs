//! Hot reload. `rebound serve` watches its configuration file and `plugins_dir` (and
//! reloads on SIGHUP). A change is validated exactly as `rebound check` does, its
//! adapters compiled and checked; one that fails is refused with that message and the
//! running configuration keeps serving. One that passes is applied as a diff
//! ([`super::setup::Setup::next`]). `rebound.http` and the errors log's settings take
//! effect at the next start; sessions' own (`scope: session`) instances keep the
//! configuration their session started with.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher as _};
use tokio::sync::mpsc;

use super::hub::Hub;
use super::setup::Changes;
use crate::config;

/// Changes that come together (an editor writes, renames, touches) are applied once,
/// this long after the first.
const SETTLE: Duration = Duration::from_millis(300);

/// Why a reload was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("{0}")]
    Config(#[from] config::ConfigError),
    #[error("plugin {adapter} (for `{server}`) cannot be loaded: {reason}")]
    Plugin { server: String, adapter: String, reason: String },
    #[error("loading the plugins failed: {0}")]
    Loading(String),
}

/// Reloads the configuration at `path` now. On success, what changed.
pub async fn reload(hub: &Arc<Hub>, path: &Path) -> Result<Changes, Refused> {
    let outcome = attempt(hub, path).await;
    match &outcome {
        Ok(changes) => {
            tracing::info!("configuration reloaded from {}: {}", path.display(), changes.summary());
            hub.metrics.reloaded("applied");
        }
        Err(e) => {
            tracing::error!("configuration reload refused; the running configuration keeps serving: {e}");
            hub.metrics.reloaded("refused");
        }
    }
    outcome
}

async fn attempt(hub: &Arc<Hub>, path: &Path) -> Result<Changes, Refused> {
    let config = config::load(path)?;
    let current = hub.setup();
    if config.settings.http != current.config.settings.http
        || config.settings.errors_log != current.config.settings.errors_log
        || config.settings.errors_log_max_bytes != current.config.settings.errors_log_max_bytes
    {
        tracing::warn!("rebound.http and the errors log's settings take effect at the next start, not on reload");
    }
    let for_plugins = config.clone();
    let plugins = tokio::task::spawn_blocking(move || crate::plugins::prepare(&for_plugins))
        .await
        .map_err(|e| Refused::Loading(e.to_string()))?;
    if let Some((server, adapter, reason)) = plugins.failures.first() {
        return Err(Refused::Plugin { server: server.clone(), adapter: adapter.clone(), reason: reason.clone() });
    }
    Ok(hub.apply(config, plugins).await)
}

/// Watches `path` and the configured `plugins_dir`, and reloads on each change or when
/// `hangups` yields. Runs until the hub is gone.
pub fn watch(hub: &Arc<Hub>, path: PathBuf, mut hangups: mpsc::Receiver<()>) {
    // Events name paths under the folder watched: compare absolute paths.
    let path = std::path::absolute(&path).unwrap_or(path);
    let (tx, mut changed) = mpsc::channel::<()>(1);
    let plugins_dir = hub.setup().config.settings.plugins_dir.clone();
    let watched = [path.clone(), plugins_dir.clone()];
    let mut watcher = match notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        let relevant = !matches!(event.kind, EventKind::Access(_))
            && event.paths.iter().any(|p| p == &watched[0] || (p.starts_with(&watched[1]) && is_wasm(p)));
        if relevant {
            let _ = tx.try_send(());
        }
    }) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!("cannot watch the configuration ({e}); reload with SIGHUP");
            None
        }
    };
    if let Some(w) = watcher.as_mut() {
        // The folders, not the files: editors replace a file rather than write it.
        let folder = path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
        for dir in [folder, plugins_dir] {
            if let Err(e) = w.watch(&dir, RecursiveMode::NonRecursive) {
                tracing::debug!("not watching {}: {e}", dir.display());
            }
        }
    }
    let hub = Arc::downgrade(hub);
    tokio::spawn(async move {
        let _watcher = watcher;
        loop {
            tokio::select! {
                Some(()) = changed.recv() => {
                    tokio::time::sleep(SETTLE).await;
                    while changed.try_recv().is_ok() {}
                    tracing::info!("{} or its plugins changed; reloading", path.display());
                }
                Some(()) = hangups.recv() => tracing::info!("SIGHUP: reloading {}", path.display()),
                else => break,
            }
            let Some(hub) = hub.upgrade() else { break };
            let _ = reload(&hub, &path).await;
        }
    });
}

fn is_wasm(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "wasm")
}
