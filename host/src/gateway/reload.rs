//! Hot reload. `rebound serve` watches its configuration file and `plugins_dir` (each
//! also when mounted from a Kubernetes ConfigMap or Secret), and reloads on SIGHUP. A
//! change is validated exactly as `rebound check` does, its adapters compiled and
//! checked; one that fails is refused with that message and the running configuration
//! keeps serving. One that passes is applied as a diff ([`super::setup::Setup::next`]).
//! `rebound.http`'s tokens rotate ([`rotate_tokens`]); its other settings and the errors
//! log's take effect at the next start. Running sessions' own (`scope: session`)
//! instances are brought in line as the shared servers are.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::ModifyKind;
use notify::{EventKind, RecursiveMode, Watcher as _};
use tokio::sync::{mpsc, watch};

use super::hub::Hub;
use super::setup::Changes;
use crate::config;
use crate::config::HttpSettings;
use crate::lasting::{Locked, ReadWrite};

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
    #[error("the gateway is shutting down")]
    ShuttingDown,
    #[error(
        "`rebound.http.operator_token` would be the clients' token (`auth_token`) too, with the token the gateway keeps until its next start (one is set or removed by the file): give the operator a token of its own"
    )]
    SameTokens,
}

/// The HTTP front's bearer tokens: the configuration's at start, then as each reload
/// rotates them, once nothing but a shutdown can refuse it (not once its new servers are
/// up: a token rotated because it leaked stops opening the gateway at once; reloads are
/// serial, so one still applying goes first). No `Debug`: they are secrets.
#[derive(Clone, PartialEq, Eq)]
pub struct Tokens {
    /// `rebound.http.auth_token`, the clients'.
    pub clients: Option<String>,
    /// `rebound.http.operator_token`.
    pub operator: Option<String>,
}

impl Tokens {
    pub fn of(http: &HttpSettings) -> Self {
        Tokens { clients: http.auth_token.clone(), operator: http.operator_token.clone() }
    }
}

/// Where a reload puts the tokens it rotates, and the HTTP front reads them.
pub type TokenCell = watch::Sender<Tokens>;

/// The most warnings of a reload kept for the status (the log has them all): the status
/// may go to a model.
const MAX_RELOAD_WARNINGS: usize = 8;

/// A reload's outcome, and when.
#[derive(Debug, Clone)]
pub struct Reloaded {
    pub at: std::time::SystemTime,
    pub outcome: ReloadOutcome,
}

#[derive(Debug, Clone)]
pub enum ReloadOutcome {
    /// Applied: what changed, in words, and what the file has that was not used (unknown
    /// keys, disabled servers), as `rebound check` warns of it.
    Applied { changes: String, warnings: Vec<String> },
    /// Refused: why; the running configuration keeps serving.
    Refused(String),
}

/// The last reload's outcome, for the status: over stdio the client hides the gateway's
/// log, so an edit refused would otherwise go unseen.
#[derive(Debug, Default)]
pub struct LastReload(std::sync::Mutex<Option<Reloaded>>);

impl LastReload {
    /// Notes a reload's outcome, its text capped (the status may go to a model), and
    /// redacted as it is cut so that no cut leaves the start of a secret.
    pub fn record(&self, outcome: ReloadOutcome, secrets: &crate::redact::Secrets) {
        let capped = |text: &str, max| secrets.redact_capped(text, max);
        let cap = |text: String| capped(&text, 2 << 10);
        let outcome = match outcome {
            ReloadOutcome::Applied { changes, warnings } => {
                let warnings = warnings.into_iter().take(MAX_RELOAD_WARNINGS).map(|w| capped(&w, 512)).collect();
                ReloadOutcome::Applied { changes: cap(changes), warnings }
            }
            ReloadOutcome::Refused(why) => ReloadOutcome::Refused(cap(why)),
        };
        let reloaded = Reloaded { at: std::time::SystemTime::now(), outcome };
        *self.0.locked() = Some(reloaded);
    }

    /// The last reload's outcome, if there was one.
    pub fn get(&self) -> Option<Reloaded> {
        self.0.locked().clone()
    }
}

/// Reloads the configuration at `path` now. On success, what changed.
pub async fn reload(hub: &Arc<Hub>, path: &Path, tokens: &TokenCell) -> Result<Changes, Refused> {
    match attempt(hub, path, tokens).await {
        Ok((changes, warnings)) => {
            let summary = changes.summary();
            tracing::info!("configuration reloaded from {}: {summary}", path.display());
            hub.metrics.reloaded("applied");
            hub.last_reload().record(ReloadOutcome::Applied { changes: summary, warnings }, &hub.setup().secrets);
            Ok(changes)
        }
        // Not the file's fault: no refusal to count or show.
        Err(Refused::ShuttingDown) => {
            tracing::info!("reload skipped: the gateway is shutting down");
            Err(Refused::ShuttingDown)
        }
        Err(e) => {
            tracing::error!("configuration reload refused; the running configuration keeps serving: {e}");
            hub.metrics.reloaded("refused");
            hub.last_reload().record(ReloadOutcome::Refused(e.to_string()), &hub.setup().secrets);
            Err(e)
        }
    }
}

/// A reload, and the new file's warnings (as `rebound check` gives them), logged.
async fn attempt(hub: &Arc<Hub>, path: &Path, tokens: &TokenCell) -> Result<(Changes, Vec<String>), Refused> {
    // Off the runtime's threads (over stdio, and over HTTP on up to three cores, it has
    // one): reading a file can wait on a disk.
    let file = path.to_path_buf();
    let loaded = tokio::task::spawn_blocking(move || config::load(&file)).await;
    let failed =
        |e: tokio::task::JoinError| config::ConfigError::Read { path: path.into(), source: std::io::Error::other(e) };
    let mut config = loaded.map_err(failed)??;
    let current = hub.setup();
    let (rotated, held_tokens) = rotate_tokens(&current.config.settings.http, &mut config.settings.http)?;
    // What loading its plugins logs (an adapter's fault may quote its configuration) is
    // redacted with the new file's secrets too, applied or not.
    let secrets = current.secrets.union(&crate::redact::Secrets::of(&config));
    crate::redact::redact_logs(secrets.clone());
    config.log_warnings();
    // What the file says that this reload does not apply is shown with its outcome too
    // (`rebound_status` is where a stdio client's operator sees it), first, so that a cap
    // on them leaves out the file's own warnings rather than these; and what runs stays
    // the configuration's, which the next reload compares against (the tokens kept, by
    // `rotate_tokens`).
    let mut held = held_tokens;
    held.extend(current.config.settings.held_back(&config.settings));
    for held in &held {
        tracing::warn!("reload: {held}");
    }
    config.settings.keep_running(&current.config.settings);
    let warnings: Vec<String> = held.into_iter().chain(config.warnings.iter().cloned()).collect();
    let for_plugins = config.clone();
    let before = current.plugins.before();
    let clients = hub.downstreams.front().clients();
    // Then what loading left in the heap arenas goes back (`memory`), the compiler's
    // working memory included if an adapter was compiled in the gateway.
    let plugins = tokio::task::spawn_blocking(move || {
        let plugins = crate::plugins::prepare_reusing(&for_plugins, before, clients);
        crate::memory::trim();
        plugins
    })
    .await
    .map_err(|e| Refused::Loading(e.to_string()))?;
    let mut warnings = warnings;
    if hub.downstreams.front() == super::downstreams::Front::Http {
        let unseen = super::setup::unobserved(&config, &plugins.adapters);
        unseen.iter().for_each(|w| tracing::warn!("reload: {w}"));
        warnings.extend(unseen);
    }
    if let Some((server, adapter, reason)) = plugins.failures.first() {
        // The refusal is logged and shown: hidden in it is what is secret in either file.
        let reason = secrets.redact(reason).into_owned();
        return Err(Refused::Plugin { server: server.clone(), adapter: adapter.clone(), reason });
    }
    // Nothing but a shutdown refuses the reload from here: the tokens rotate now, before
    // the new servers it starts are up (a shutdown meanwhile leaves them rotated while the
    // gateway drains), the new ones hidden from the errors log first.
    if !rotated.is_empty() && !hub.closing().is_cancelled() {
        hub.errors.set_secrets(secrets.clone());
        tokens.send_replace(Tokens::of(&config.settings.http));
        for key in &rotated {
            tracing::info!("reload: rebound.http.{key} rotated: requests from now on need the new one");
        }
    }
    // Loading may take a while: shutdown may have begun meanwhile.
    let mut changes = hub.apply(config, plugins).await.ok_or(Refused::ShuttingDown)?;
    changes
        .settings
        .extend(rotated.iter().map(|key| if *key == "auth_token" { "http.auth_token" } else { "http.operator_token" }));
    Ok((changes, warnings))
}

/// A reload rotates the HTTP front's tokens: a new `auth_token` or `operator_token` is the
/// one that opens the gateway to requests from then on ([`Tokens`]; the streams the old
/// one opened end: `http::revoked`).
/// One set where there was none, or removed, would open the gateway, or lock its clients
/// out, while it serves: that takes effect at the next start, and until then `new` keeps
/// the token the gateway has (a token from the environment is the same one again). The
/// tokens that rotate, and what is held back; refused if the operator's would then be the
/// clients' (the file's own check passed before a kept token came back).
fn rotate_tokens(old: &HttpSettings, new: &mut HttpSettings) -> Result<(Vec<&'static str>, Vec<String>), Refused> {
    let tokens = [
        ("auth_token", &old.auth_token, &mut new.auth_token),
        ("operator_token", &old.operator_token, &mut new.operator_token),
    ];
    let (mut rotated, mut held) = (Vec::new(), Vec::new());
    for (key, was, is) in tokens {
        if was.is_some() != is.is_some() {
            let what = if was.is_some() { "removed" } else { "set" };
            held.push(format!(
                "rebound.http.{key} is {what} by the file: that takes effect at the next start; until then the gateway keeps what it has"
            ));
            is.clone_from(was);
        } else if was != is {
            rotated.push(key);
        }
    }
    if new.operator_token.is_some() && new.operator_token == new.auth_token {
        return Err(Refused::SameTokens);
    }
    Ok((rotated, held))
}

/// `http` without its tokens, which a reload rotates: what else changed waits for a start.
/// What a configuration file, and the adapters in its `plugins_dir`, were when the gateway
/// read them (each file's device and inode, when its contents and its inode last changed,
/// and its length), taken before they are read: a change saved while the gateway starts,
/// before its watcher does, is then seen and reloaded, not lost. A save that replaces a
/// file (as editors and `cp` to a new name then `mv` do: a new inode) is always seen; one
/// in place, of the same length and within the file system's clock tick, is not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    config: (PathBuf, Option<Seen>),
    /// The folder, and its `.wasm` files by name (the first [`MAX_STAMPED`] of them by
    /// name).
    plugins: Option<(PathBuf, Vec<Named>)>,
}

/// A file in a folder, by name, as it was.
type Named = (std::ffi::OsString, Option<Seen>);

/// The adapters of a plugins folder a stamp looks at: a folder holding more is read by
/// the watcher, whatever is dropped into it while the gateway starts.
const MAX_STAMPED: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    file: (u64, u64),
    modified: (i64, i64),
    changed: (i64, i64),
    len: u64,
}

impl Seen {
    fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(path).ok().map(|m| Seen {
            file: (m.dev(), m.ino()),
            modified: (m.mtime(), m.mtime_nsec()),
            changed: (m.ctime(), m.ctime_nsec()),
            len: m.len(),
        })
    }
}

impl Stamp {
    /// The configuration file at `path`, as it is now.
    pub fn of(path: &Path) -> Self {
        Self { config: (path.to_owned(), Seen::of(path)), plugins: None }
    }

    /// With the adapters in `dir` as they are now.
    pub fn with_plugins(mut self, dir: &Path) -> Self {
        // The first by name, not in the directory's order, which may differ between two
        // readings of the same files (within a bound on the names read).
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.file_name())
            .filter(|name| Path::new(name).extension().is_some_and(|e| e == "wasm"))
            .take(MAX_STAMPED * 16)
            .collect();
        names.sort_unstable();
        names.truncate(MAX_STAMPED);
        let files = names.into_iter().map(|name| {
            let seen = Seen::of(&dir.join(&name));
            (name, seen)
        });
        self.plugins = Some((dir.to_owned(), files.collect()));
        self
    }

    /// The same files as they are now.
    fn again(&self) -> Self {
        let now = Self::of(&self.config.0);
        match &self.plugins {
            Some((dir, _)) => now.with_plugins(dir),
            None => now,
        }
    }
}

/// Watches `path` (read as `read` says) and the configured `plugins_dir`, and reloads on
/// each change or when `hangups` yields, rotating the HTTP front's `tokens`. Runs until
/// the hub is gone.
pub fn watch(hub: &Arc<Hub>, path: PathBuf, read: Stamp, hangups: mpsc::Receiver<()>, tokens: TokenCell) {
    // Events name paths under the folder watched: compare absolute paths.
    let path = std::path::absolute(&path).unwrap_or(path);
    let (tx, changed) = mpsc::channel::<()>(1);
    let since_read = tx.clone();
    let watched = Watched::start(&path, hub.setup().config.settings.plugins_dir.clone(), tx);
    if read.again() != read {
        let _ = since_read.try_send(());
    }
    let hub = Arc::downgrade(hub);
    // Kept outside each run of the loop, so that one started again after a panic (a bug)
    // still hears of changes and hangups.
    let state = Arc::new(tokio::sync::Mutex::new((changed, hangups, watched)));
    let path: Arc<Path> = path.into();
    drop(crate::lasting::spawn("configuration watcher", move || {
        let (state, hub, path, tokens) = (state.clone(), hub.clone(), path.clone(), tokens.clone());
        async move {
            let (changed, hangups, watched) = &mut *state.lock().await;
            watch_loop(changed, hangups, watched, &hub, &path, &tokens).await;
        }
    }));
}

/// Reloads on each change and hangup until the hub is gone or closing (see [`watch`]).
async fn watch_loop(
    changed: &mut mpsc::Receiver<()>,
    hangups: &mut mpsc::Receiver<()>,
    watched: &mut Watched,
    hub: &std::sync::Weak<Hub>,
    path: &Path,
    tokens: &TokenCell,
) {
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
        // Shutting down: what a reload would start, nothing would stop.
        if hub.closing().is_cancelled() {
            break;
        }
        // A plugins folder made (again) since it was watched is watched from now on,
        // before it is read; so is a link's new target.
        watched.rewatch();
        watched.follow_link();
        if reload(&hub, path, tokens).await.is_ok() {
            watched.follow_plugins_dir(hub.setup().config.settings.plugins_dir.clone());
        }
    }
}

/// The folders watched: the configuration file's, `plugins_dir` and the folder holding it
/// (where `plugins_dir` is made, or replaced whole). (The folders, not the files: editors
/// replace a file rather than write it.)
struct Watched {
    /// None when the platform's watcher could not start: SIGHUP still reloads.
    watcher: Option<notify::RecommendedWatcher>,
    /// The configuration file's folder.
    folder: PathBuf,
    plugins_dir: PathBuf,
    /// `plugins_dir` made absolute, read by the watcher's thread; a reload may change it.
    plugins_now: Arc<std::sync::RwLock<PathBuf>>,
    /// The folders watched for `plugins_dir`'s sake.
    /// Each with whether it is watched now (a folder removed takes its watch with it).
    plugin_watches: Vec<(PathBuf, bool)>,
    /// The configuration file, and for a link, where it points now (read by the
    /// watcher's thread) and the folder watched for it.
    file: PathBuf,
    target: Arc<std::sync::RwLock<Option<PathBuf>>>,
    target_watch: Option<PathBuf>,
}

impl Watched {
    /// Watches `file`'s folder (and, for a file that is a link, its target's) and
    /// `plugins_dir`, and sends on `tx` at each change that may matter: to `file` or its
    /// target, to a `.wasm` file, or an atomic swap of either folder; and when the
    /// watcher lost events (its queue overflowed), since one may have been the file's.
    fn start(file: &Path, plugins_dir: PathBuf, tx: mpsc::Sender<()>) -> Self {
        let folder = file.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
        let plugins_now = Arc::new(std::sync::RwLock::new(absolute(&plugins_dir)));
        let target = Arc::new(std::sync::RwLock::new(None));
        let (plugins_seen, seen_target) = (plugins_now.clone(), target.clone());
        let (config_file, file, watched_folder) = (file.to_path_buf(), file.to_path_buf(), folder.clone());
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let event = match event {
                Ok(event) if !event.need_rescan() => event,
                Ok(_) => {
                    let _ = tx.try_send(()); // events were lost: one may have been the file's
                    return;
                }
                Err(e) => return tracing::debug!("the configuration's watcher: {e}"),
            };
            let plugins = plugins_seen.reading();
            let target = seen_target.reading();
            // The plugins folder, or a folder on its way, made, removed or renamed.
            let made = matches!(
                event.kind,
                EventKind::Create(_) | EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
            );
            let relevant = !matches!(event.kind, EventKind::Access(_))
                && event.paths.iter().any(|p| {
                    p == &file
                        || target.as_ref() == Some(p)
                        || (made && plugins.starts_with(p))
                        || is_wasm(p)
                        || is_atomic_swap(p, &watched_folder)
                        || is_atomic_swap(p, &plugins)
                });
            if relevant {
                let _ = tx.try_send(());
            }
        });
        let mut watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!("cannot watch the configuration ({e}); reload with SIGHUP");
                None
            }
        };
        if let Some(w) = watcher.as_mut() {
            watch_folder(w, &folder);
        }
        let mut watched = Watched {
            watcher,
            folder,
            plugins_dir,
            plugins_now,
            plugin_watches: Vec::new(),
            file: config_file,
            target,
            target_watch: None,
        };
        watched.follow_link();
        watched.rewatch();
        watched
    }

    /// A configuration linked from elsewhere (dotfiles) is edited there: the folder of
    /// the file the link points to is watched, and when the link is pointed elsewhere
    /// (`ln -sfn`), the new one's instead.
    fn follow_link(&mut self) {
        let target = std::fs::canonicalize(&self.file).ok().filter(|t| *t != self.file);
        if *self.target.reading() == target {
            return;
        }
        let dir = target.as_deref().and_then(Path::parent).map(Path::to_path_buf);
        let dir = dir.filter(|d| config::followed(d) != config::followed(&self.folder));
        if let Some(w) = self.watcher.as_mut()
            && self.target_watch != dir
        {
            // (One folder is one watch, by whatever path it was watched.)
            let same = |a: &Path, b: &Path| config::followed(a) == config::followed(b);
            if let Some(old) =
                self.target_watch.take().filter(|old| !self.plugin_watches.iter().any(|(p, _)| same(p, old)))
            {
                let _ = w.unwatch(&old);
            }
            if let Some(dir) = &dir {
                watch_folder(w, dir);
            }
            self.target_watch = dir;
        }
        if let Some(target) = target.as_ref().filter(|_| self.watcher.is_some() && self.file.is_symlink()) {
            tracing::info!("{} links to {}: that is watched too", self.file.display(), target.display());
        }
        *self.target.writing() = target;
    }

    /// Watches `plugins_dir`, and the folder holding it or, while that is not there, the
    /// nearest folder on its way that is (where it will be made): each may have been
    /// made, or removed and made again, since it was last watched. (Watching a folder
    /// watched already changes nothing; the configuration's folder is watched for the
    /// file's sake, whatever happens here.)
    fn rewatch(&mut self) {
        let plugins = absolute(&self.plugins_dir);
        let on_its_way = plugins.ancestors().skip(1).find(|a| a.is_dir()).map(Path::to_path_buf);
        let folder = config::followed(&self.folder);
        let Some(w) = self.watcher.as_mut() else { return };
        for (dir, watched) in &mut self.plugin_watches {
            *watched &= dir.is_dir();
        }
        for dir in std::iter::once(plugins).chain(on_its_way) {
            let known = self.plugin_watches.iter_mut().find(|(d, _)| *d == dir);
            if known.is_none() && config::followed(&dir) == folder {
                continue;
            }
            let watching = w.watch(&dir, RecursiveMode::NonRecursive).inspect_err(|e| {
                tracing::debug!("not watching {}: {e}", dir.display());
            });
            let watching = watching.is_ok();
            let seen_now = watching && !known.as_ref().is_some_and(|(_, watched)| *watched);
            match known {
                Some((_, watched)) => *watched = watching,
                None if watching => self.plugin_watches.push((dir.clone(), true)),
                None => {}
            }
            if seen_now {
                tracing::info!("watching {} for plugins", dir.display());
            }
        }
    }

    /// After a reload: a new `plugins_dir` is watched from now on, instead of the old.
    fn follow_plugins_dir(&mut self, now: PathBuf) {
        if now == self.plugins_dir {
            return;
        }
        if let Some(w) = self.watcher.as_mut() {
            let target = self.target_watch.as_deref().map(config::followed);
            for (dir, _) in self.plugin_watches.drain(..).filter(|(d, _)| target.as_ref() != Some(&config::followed(d)))
            {
                let _ = w.unwatch(&dir);
            }
        }
        *self.plugins_now.writing() = absolute(&now);
        self.plugins_dir = now;
        self.rewatch();
    }
}

fn watch_folder(watcher: &mut notify::RecommendedWatcher, dir: &Path) {
    if let Err(e) = watcher.watch(dir, RecursiveMode::NonRecursive) {
        tracing::debug!("not watching {}: {e}", dir.display());
    }
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

fn is_wasm(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "wasm")
}

/// Whether `path` is part of an atomic swap of `folder`, as Kubernetes does to a mounted
/// ConfigMap or Secret: the files are symlinks through `..data`, which is replaced by a
/// rename (`..data_tmp` → `..data`), so no event ever names a file. (A `subPath` mount
/// is never updated by Kubernetes at all.)
fn is_atomic_swap(path: &Path, folder: &Path) -> bool {
    path.parent() == Some(folder) && path.file_name().is_some_and(|n| n.as_encoded_bytes().starts_with(b".."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubernetes_swap_is_seen_in_the_folder_watched_and_nowhere_else() {
        let folder = Path::new("/etc/rebound");
        assert!(is_atomic_swap(Path::new("/etc/rebound/..data"), folder));
        assert!(is_atomic_swap(Path::new("/etc/rebound/..2026_11_23_20_00_00.123"), folder));
        assert!(!is_atomic_swap(Path::new("/etc/rebound/rebound-errors.jsonl"), folder));
        assert!(!is_atomic_swap(Path::new("/etc/rebound/sub/..data"), folder));
        assert!(!is_atomic_swap(Path::new("/etc/other/..data"), folder));
    }

    /// A file saved again after it was read (longer, or later, or replaced) reads as changed.
    #[test]
    fn a_stamp_tells_a_file_saved_since() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rebound.json");
        let none = Stamp::of(&path);
        std::fs::write(&path, "{}").unwrap();
        let read = Stamp::of(&path);
        assert_ne!(read, none);
        assert_eq!(Stamp::of(&path), read, "not saved since");
        std::fs::write(&path, r#"{"mcpServers": {}}"#).unwrap();
        assert_ne!(Stamp::of(&path), read);
        // Saved as editors do, the same length at once: another file renamed over it.
        let read = Stamp::of(&path);
        let next = path.with_extension("new");
        std::fs::write(&next, r#"{"mcpServers": {}}"#).unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_ne!(Stamp::of(&path), read, "a new file in its place");
    }

    /// What a reload holds back is said at each reload until it runs (the configuration
    /// keeps what runs), and a file back to what runs says nothing of it.
    #[test]
    fn what_a_reload_holds_back_is_said_until_it_runs() {
        let settings = |rebound: serde_json::Value| {
            let text = serde_json::json!({"mcpServers": {"a": {"command": "x"}}, "rebound": rebound}).to_string();
            crate::config::parse(&text, Path::new("/x/rebound.json"), &|_| None).unwrap().settings
        };
        let changed = || {
            settings(
                serde_json::json!({"errors_log": "/x/elsewhere.jsonl", "http": {"max_sessions": 9}, "plugin_timeout_ms": 1500}),
            )
        };
        let running = settings(serde_json::json!({}));
        let mut applied = changed();
        let held = running.held_back(&applied);
        assert!(held.iter().any(|h| h.starts_with("rebound.errors_log changed")), "{held:?}");
        assert!(held.iter().any(|h| h.starts_with("rebound.http (but its tokens) changed")), "{held:?}");
        assert_eq!(running.applied_changes(&applied), ["plugin_timeout_ms"]);
        applied.keep_running(&running);
        assert_eq!((&applied.errors_log, &applied.http), (&running.errors_log, &running.http));
        assert_eq!(applied.held_back(&changed()).len(), 2, "still held back at the next reload");
        assert!(applied.held_back(&settings(serde_json::json!({}))).is_empty(), "back to what runs");
    }

    /// Tokens rotate; one set or removed is kept; and a kept token never makes the
    /// operator's the clients'.
    #[test]
    fn tokens_rotate_but_the_operators_never_becomes_the_clients() {
        let http = |auth: Option<&str>, operator: Option<&str>| HttpSettings {
            auth_token: auth.map(str::to_owned),
            operator_token: operator.map(str::to_owned),
            ..HttpSettings::default()
        };
        let old = http(Some("clients"), Some("operator"));
        let mut new = http(Some("clients-2"), Some("operator-2"));
        assert_eq!(rotate_tokens(&old, &mut new).unwrap(), (vec!["auth_token", "operator_token"], vec![]));
        assert_eq!(new, http(Some("clients-2"), Some("operator-2")));
        let mut removed = http(None, Some("operator-2"));
        let (rotated, held) = rotate_tokens(&old, &mut removed).unwrap();
        assert!(rotated.contains(&"operator_token"));
        assert_eq!(removed.auth_token.as_deref(), Some("clients"), "kept until the next start");
        assert!(held[0].starts_with("rebound.http.auth_token is removed by the file"), "said: {held:?}");
        // The file alone passes its check; with the kept token it would open the
        // operator's routes to every client.
        assert!(matches!(rotate_tokens(&old, &mut http(None, Some("clients"))), Err(Refused::SameTokens)));
        assert!(matches!(rotate_tokens(&old, &mut http(Some("operator"), None)), Err(Refused::SameTokens)));
        let mut none = http(None, None);
        assert!(rotate_tokens(&http(Some("clients"), None), &mut none).unwrap().0.is_empty());
        assert_eq!(none, http(Some("clients"), None));
    }

    /// An adapter dropped into the plugins folder, or one replaced there, reads as a
    /// change; other files in the folder do not.
    #[test]
    fn a_stamp_tells_an_adapter_dropped_in_since() {
        let dir = tempfile::tempdir().unwrap();
        let (path, plugins) = (dir.path().join("rebound.json"), dir.path().join("plugins"));
        std::fs::write(&path, "{}").unwrap();
        let missing = Stamp::of(&path).with_plugins(&plugins);
        assert_eq!(missing.again(), missing, "no folder yet");
        std::fs::create_dir(&plugins).unwrap();
        std::fs::write(plugins.join("notes.txt"), "x").unwrap();
        assert_eq!(missing.again(), missing, "no adapter in it");
        std::fs::write(plugins.join("a.wasm"), "one").unwrap();
        let read = missing.again();
        assert_ne!(read, missing, "an adapter dropped in");
        assert_eq!(read.again(), read);
        std::fs::write(plugins.join("a.wasm.new"), "two").unwrap();
        std::fs::rename(plugins.join("a.wasm.new"), plugins.join("a.wasm")).unwrap();
        assert_ne!(read.again(), read, "replaced");
    }
}
