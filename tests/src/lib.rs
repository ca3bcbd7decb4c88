//! Helpers for the end-to-end tests: start `rebound serve` on a config and talk to it as
//! a real MCP client (rmcp, the official Rust SDK) over its stdio.

// The test client answers sampling and roots, which 2026-07-28 deprecates.
#![allow(deprecated)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, CreateMessageRequestParams,
    CreateMessageResult, ElicitRequestParams, ElicitResult, ElicitationAction, Implementation, ListRootsResult,
    LoggingMessageNotificationParam, ProgressNotificationParam, ResourceUpdatedNotificationParam, Root,
    SamplingMessage,
};
use rmcp::service::{NotificationContext, RequestContext, RunningService};
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::process::Child;

/// The folder holding the workspace's binaries (`target/debug`).
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("REBOUND_BIN_DIR") {
        return dir.into();
    }
    // Binaries live in target/debug, test executables in target/debug/deps.
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("target/debug").to_path_buf();
    if dir.ends_with("deps") { dir.parent().expect("target/debug").to_path_buf() } else { dir }
}

pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` (cargo xtask test does)",
        path.display()
    );
    path
}

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// A `mcpServers` entry for the fault-injecting server.
pub fn faulty(name: &str, state: &Path, extra: &[&str]) -> Value {
    let mut args =
        vec!["--name".to_owned(), name.to_owned(), "--state".to_owned(), state.join(name).display().to_string()];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    json!({"command": bin("faulty-server"), "args": args})
}

/// `server` (a `command` and its `args`) started by `sh` running `script` first, with
/// `$1` the path `file` and the server's command line after it (`shift; exec "$@"`
/// starts the server): what the script sees of its environment is the server's.
pub fn after_script(script: &str, file: &Path, server: &Value) -> Value {
    let mut args = vec![json!("-c"), json!(script), json!("sh"), json!(file), server["command"].clone()];
    args.extend(server["args"].as_array().into_iter().flatten().cloned());
    json!({"command": "sh", "args": args})
}

/// What the test client has been told.
#[derive(Debug, Default)]
pub struct Heard {
    pub progress: Vec<ProgressNotificationParam>,
    pub logs: Vec<LoggingMessageNotificationParam>,
    pub tools_changed: usize,
    /// The URIs of `notifications/resources/updated`, in order.
    pub updated: Vec<String>,
}

/// A client that answers the server-to-client requests with fixed values; its roots
/// end in its `name`, if it has one, so that each client's answers can be told apart.
#[derive(Clone, Default)]
pub struct TestClient {
    pub heard: Arc<Mutex<Heard>>,
    pub name: String,
}

impl ClientHandler for TestClient {
    fn get_info(&self) -> ClientConfig {
        let mut caps = ClientCapabilities::default();
        caps.sampling = Some(Default::default());
        caps.roots = Some(Default::default());
        caps.elicitation = Some(Default::default());
        ClientConfig::new(caps, Implementation::new("rebound-tests", "0"))
            .with_protocol_version(rmcp::model::ProtocolVersion::V_2025_06_18)
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let asked = serde_json::to_string(&params.messages).unwrap_or_default();
        // A person taking their time.
        if asked.contains("slowly") {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        Ok(CreateMessageResult::new(
            SamplingMessage::assistant_text(format!("the client read {asked}")),
            "test-model".into(),
        ))
    }

    async fn list_roots(&self, _: RequestContext<RoleClient>) -> Result<ListRootsResult, ErrorData> {
        let root = if self.name.is_empty() { "file:///work".to_owned() } else { format!("file:///work/{}", self.name) };
        Ok(ListRootsResult::new(vec![Root::new(root)]))
    }

    async fn create_elicitation(
        &self,
        _: ElicitRequestParams,
        _: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        Ok(ElicitResult::new(ElicitationAction::Accept).with_content(json!({"name": "Ada"})))
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _: NotificationContext<RoleClient>) {
        self.heard.lock().unwrap().progress.push(params);
    }

    async fn on_logging_message(&self, params: LoggingMessageNotificationParam, _: NotificationContext<RoleClient>) {
        self.heard.lock().unwrap().logs.push(params);
    }

    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.heard.lock().unwrap().tools_changed += 1;
    }

    async fn on_resource_updated(&self, params: ResourceUpdatedNotificationParam, _: NotificationContext<RoleClient>) {
        self.heard.lock().unwrap().updated.push(params.uri);
    }
}

/// A running `rebound serve` with a connected client.
pub struct Gateway {
    pub client: RunningService<RoleClient, TestClient>,
    pub heard: Arc<Mutex<Heard>>,
    pub child: Child,
    pub dir: tempfile::TempDir,
    /// Everything the gateway has logged so far.
    pub log: Arc<Mutex<String>>,
}

/// The `rebound` binary, without the settings of the environment the tests run in that
/// would change what a test sees: its log filter and its tokens (which win over the file).
pub fn rebound() -> std::process::Command {
    let mut command = std::process::Command::new(bin("rebound"));
    for setting in ["REBOUND_LOG", "REBOUND_AUTH_TOKEN", "REBOUND_OPERATOR_TOKEN"] {
        command.env_remove(setting);
    }
    command
}

impl Gateway {
    /// Writes `config` to a fresh folder and serves it. `config` may refer to the folder
    /// as `$DIR` in strings.
    pub async fn start(config: impl FnOnce(&Path) -> Value) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rebound.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&config(dir.path())).unwrap()).unwrap();
        Self::serve(&path, dir).await
    }

    /// Serves the config file at `path`; `dir` is kept for the gateway's lifetime.
    pub async fn serve(path: &Path, dir: tempfile::TempDir) -> Self {
        let mut child = tokio::process::Command::from(rebound())
            .args(["serve", "--config"])
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("rebound starts");
        let log = keep_log(child.stderr.take().unwrap());
        let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
        let handler = TestClient::default();
        let heard = handler.heard.clone();
        // Above rmcp's 16 MiB default, to see that the gateway passes large answers.
        let transport =
            rmcp::transport::async_rw::AsyncRwTransport::new_client(stdout, stdin).with_max_line_length(64 << 20);
        let client = tokio::time::timeout(Duration::from_secs(30), handler.serve(transport))
            .await
            .expect("initialises in time")
            .expect("initialises");
        Gateway { client, heard, child, dir, log }
    }

    /// Waits until the gateway has logged a line containing `what`.
    pub async fn logged(&self, what: &str) {
        logged(&self.log, what).await;
    }

    pub async fn call(&self, tool: &str, args: Value) -> CallToolResult {
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = args.as_object().cloned();
        tokio::time::timeout(Duration::from_secs(60), self.client.peer().call_tool(params))
            .await
            .expect("answers in time")
            .unwrap_or_else(|e| panic!("{tool} failed at the protocol level: {e}"))
    }

    pub async fn tool_names(&self) -> Vec<String> {
        self.client
            .peer()
            .list_all_tools()
            .await
            .expect("tools/list")
            .into_iter()
            .map(|t| t.name.into_owned())
            .collect()
    }

    /// Lines of a faulty server's state file (`starts`, `cancelled`).
    pub fn state(&self, server: &str, file: &str) -> Vec<String> {
        state_in(self.dir.path(), server, file)
    }

    /// The entries of the errors log so far: the config's `rebound.errors_log`, else the
    /// default beside the config.
    pub fn errors_log(&self) -> Vec<Value> {
        let config: Value =
            serde_json::from_slice(&std::fs::read(self.dir.path().join("rebound.json")).expect("the config")).unwrap();
        // A relative path is the config folder's, as the gateway reads it.
        let path = self.dir.path().join(config["rebound"]["errors_log"].as_str().unwrap_or("rebound-errors.jsonl"));
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("each line is JSON"))
            .collect()
    }

    /// Closes the client's side and waits for the gateway to exit.
    pub async fn close(mut self) -> std::process::ExitStatus {
        let _ = self.client.close().await;
        drop(self.client);
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("exits in time")
            .expect("exit status")
    }
}

/// A running `rebound serve --http` on a loopback port.
pub struct HttpGateway {
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    pub dir: tempfile::TempDir,
    /// Everything the gateway has logged so far.
    pub log: Arc<Mutex<String>>,
}

impl HttpGateway {
    /// Writes `config` to a fresh folder and serves it on a free port, with `env` added to
    /// the gateway's environment.
    pub async fn start(config: impl FnOnce(&Path) -> Value, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rebound.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&config(dir.path())).unwrap()).unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (child, base) = Self::spawn(&path, "127.0.0.1:0", env, log.clone()).await;
        HttpGateway { child, base, dir, log }
    }

    /// [`Self::start`], the gateway running as an unprivileged user (`nobody`) when the
    /// tests run as root, as a gateway would be deployed: what its servers, of the same
    /// user, can reach of it is then what they could in the field. The folder is open to
    /// that user.
    pub async fn start_unprivileged(config: impl FnOnce(&Path) -> Value, env: &[(&str, &str)]) -> Self {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let path = dir.path().join("rebound.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&config(dir.path())).unwrap()).unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let mut command = rebound();
        if nix::unistd::geteuid().is_root() {
            let mut as_nobody = std::process::Command::new("setpriv");
            as_nobody.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(bin("rebound"));
            for setting in ["REBOUND_LOG", "REBOUND_AUTH_TOKEN", "REBOUND_OPERATOR_TOKEN"] {
                as_nobody.env_remove(setting);
            }
            command = as_nobody;
        }
        let (child, base) = Self::spawn_by(command, &path, "127.0.0.1:0", env, log.clone()).await;
        HttpGateway { child, base, dir, log }
    }

    /// Starts `rebound serve --http addr` on the config at `path`; returns the process and
    /// the address it listens on. Its log goes to `log` and to the test's output.
    pub async fn spawn(path: &Path, addr: &str, env: &[(&str, &str)], log: Arc<Mutex<String>>) -> (Child, String) {
        Self::spawn_by(rebound(), path, addr, env, log).await
    }

    /// [`Self::spawn`], the gateway started by `command`.
    async fn spawn_by(
        command: std::process::Command,
        path: &Path,
        addr: &str,
        env: &[(&str, &str)],
        log: Arc<Mutex<String>>,
    ) -> (Child, String) {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let mut child = tokio::process::Command::from(command)
            .args(["serve", "--http", addr, "--config"])
            .arg(path)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("rebound starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let keep = move |line: &str| kept(&log, line);
        let base = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.expect("stderr") {
                keep(&line);
                if let Some(url) = line.strip_prefix("rebound: listening on ") {
                    return url.trim_end_matches("/mcp").to_owned();
                }
            }
            panic!("rebound exited before listening");
        })
        .await
        .expect("listens in time");
        // Keep the pipe drained, and the log visible with the test's output.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                keep(&line);
            }
        });
        (child, base)
    }

    pub fn url(&self) -> String {
        format!("{}/mcp", self.base)
    }

    /// Sends the gateway SIGTERM, as a service manager stops it.
    pub fn sigterm(&self) {
        let pid = self.child.id().expect("still running").to_string();
        let sent = std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill runs");
        assert!(sent.success(), "SIGTERM to {pid}");
    }

    /// Lines of a faulty server's state file (`starts`, `calls`).
    pub fn state(&self, server: &str, file: &str) -> Vec<String> {
        state_in(self.dir.path(), server, file)
    }

    /// Waits until the gateway has logged a line containing `what`.
    pub async fn logged(&self, what: &str) {
        logged(&self.log, what).await;
    }

    /// An rmcp client over streamable HTTP, sending `token` as its bearer token.
    pub async fn client(&self, token: Option<&str>) -> Result<RunningService<RoleClient, TestClient>, String> {
        http_client(&self.url(), token).await
    }
}

/// Lines of the state file `file` of the faulty server `server` in `dir`.
pub fn state_in(dir: &Path, server: &str, file: &str) -> Vec<String> {
    std::fs::read_to_string(dir.join(server).join(file)).unwrap_or_default().lines().map(str::to_owned).collect()
}

/// Waits until `log` has a line containing `what`.
pub async fn logged(log: &Mutex<String>, what: &str) {
    eventually(what, || log.lock().unwrap().contains(what)).await;
}

/// A process's log, as it writes it on `stderr`: kept, and shown with the test's output.
pub fn keep_log(stderr: tokio::process::ChildStderr) -> Arc<Mutex<String>> {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let log = Arc::new(Mutex::new(String::new()));
    let mut lines = BufReader::new(stderr).lines();
    let kept_in = log.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            kept(&kept_in, &line);
        }
    });
    log
}

fn kept(log: &Mutex<String>, line: &str) {
    eprintln!("{line}");
    let mut log = log.lock().unwrap();
    log.push_str(line);
    log.push('\n');
}

/// An rmcp client of the streamable HTTP server at `url`.
pub async fn http_client(url: &str, token: Option<&str>) -> Result<RunningService<RoleClient, TestClient>, String> {
    http_client_as(TestClient::default(), url, token).await
}

/// `client` connected to the streamable HTTP server at `url`.
pub async fn http_client_as(
    client: TestClient,
    url: &str,
    token: Option<&str>,
) -> Result<RunningService<RoleClient, TestClient>, String> {
    let config = transport_config(url, token);
    http_client_over(client, reqwest::Client::new(), config).await
}

/// A client connected through a proxy on this machine that names it `client_ip` in its
/// `X-Forwarded-For` (a gateway that trusts that proxy sees the client at `client_ip`).
pub async fn http_client_forwarded(
    client_ip: &str,
    url: &str,
    token: Option<&str>,
) -> Result<RunningService<RoleClient, TestClient>, String> {
    let config = transport_config(url, token);
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-forwarded-for", client_ip.parse().map_err(|_| format!("not a header value: {client_ip}"))?);
    let http = reqwest::Client::builder().default_headers(headers).build().map_err(|e| e.to_string())?;
    http_client_over(TestClient::default(), http, config).await
}

fn transport_config(
    url: &str,
    token: Option<&str>,
) -> rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig {
    let config = rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(url);
    match token {
        Some(token) => config.auth_header(token),
        None => config,
    }
}

async fn http_client_over(
    client: TestClient,
    http: reqwest::Client,
    config: rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig,
) -> Result<RunningService<RoleClient, TestClient>, String> {
    let transport = rmcp::transport::StreamableHttpClientTransport::with_client(http, config);
    tokio::time::timeout(Duration::from_secs(30), client.serve(transport))
        .await
        .map_err(|_| "no answer to initialize within 30 s".to_owned())?
        .map_err(|e| e.to_string())
}

/// Replaces the configuration `rebound.json` in `dir` with `config`, as editors do:
/// written beside it and renamed over it.
pub fn rewrite_config(dir: &Path, config: &Value) {
    let tmp = dir.join("rebound.json.new");
    std::fs::write(&tmp, serde_json::to_vec_pretty(config).unwrap()).unwrap();
    std::fs::rename(tmp, dir.join("rebound.json")).unwrap();
}

/// Lists the tools until `tool` is offered (or, with `wanted` false, is not), for up to
/// 10 s; whether it got there. How a test sees that a reload was applied.
pub async fn until_offered(peer: &rmcp::Peer<RoleClient>, tool: &str, wanted: bool) -> bool {
    for _ in 0..100 {
        if peer.list_all_tools().await.unwrap().iter().any(|t| t.name == tool) == wanted {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// The text of a result's text blocks.
pub fn text(result: &CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect::<Vec<_>>().join("\n")
}

/// Polls `cond` every 50 ms for up to 10 s.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..200 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The memory the process `pid` holds now (`VmRSS:`) or has held at most (`VmHWM:`), in KiB.
pub fn memory_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Whether a process with this pid is still alive (and not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.split_whitespace().nth(2).is_none_or(|s| s != "Z"),
        Err(_) => false,
    }
}
