//! A fault-injecting MCP server for the end-to-end tests and the demo.
//!
//! It speaks newline-delimited JSON-RPC on stdio by hand (no SDK) so that it can break
//! the protocol in ways an SDK would not let it: garbage lines, huge lines, hangs,
//! crashes mid-call. Each tool is one fault; `--tools FILE` also publishes the tools of a
//! real server's `tools/list` fixture, answering them with a canned text.
//!
//! Options: `--name NAME` (server name, also the prefix of its answers), `--tools FILE`,
//! `--state DIR` (appends one line per start to `DIR/starts`, so tests can count
//! restarts, `DIR/cancelled` with one line per `notifications/cancelled`, and
//! `DIR/calls` with the name of every tool called, `DIR/late` with what `sample_late` was answered, `DIR/reads` with every resource read, `DIR/subscribes` with every resource subscribed to (one ending in `/slow` answered after 1.5 s), `DIR/unsubscribes` with every one unsubscribed from, one ending in `/sticky` never answered), `--crash-after N` (exits on the
//! N-th tool call), `--emulate hol|lean` (with `--tools`: the fixture's tools fail the
//! way the real servers do, see `emulate`), `--list-delay MS` (answers `tools/list` that late), `--refuse-first-level` (answers the first `logging/setLevel` with an error), `--start-delay MS` (reads nothing
//! for that long, a slow start), `--start-gate FILE` (reads nothing until FILE exists, at
//! every start: a start the test ends when it wants), `--exit-after-ms MS` (dies that long after starting,
//! every time: a crash loop), `--tasks` (runs a call as an MCP 2025-11-25 task when the
//! call asks, see `tasks`; and lists `research`, which runs only as one).

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{Mutex, oneshot};

mod tasks;

struct Server {
    name: String,
    emulate: Option<String>,
    /// hol: session name → workdir. Lost when the process dies, as in hol4-mcp.
    sessions: Mutex<std::collections::HashMap<String, String>>,
    state: Option<std::path::PathBuf>,
    extra_tools: Vec<Value>,
    crash_after: Option<u64>,
    /// Never answer `tools/list`.
    mute_lists: bool,
    /// Refuse the first `logging/setLevel` with an error (after noting it).
    refuse_first_level: std::sync::atomic::AtomicBool,
    /// Answer `tools/list` this late.
    list_delay: Duration,
    /// Answer `server/discover` as a server of 2025-11-25 and older that knows the
    /// request does: "unsupported protocol version" (-32022), listing only those.
    refuse_discover: bool,
    calls: AtomicU64,
    per_tool: Mutex<std::collections::HashMap<String, u64>>,
    last_429: Mutex<Option<std::time::Instant>>,
    /// Whether `toggle_tool` has added its extra tool.
    toggled: AtomicBool,
    out: Mutex<std::io::Stdout>,
    next_id: AtomicU64,
    /// Answers to our own requests to the client (sampling, roots, elicitation).
    pending: Mutex<std::collections::HashMap<u64, oneshot::Sender<Value>>>,
    /// With `--tasks`, the tasks it runs.
    tasks: Option<tasks::Tasks>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut name = "faulty".to_owned();
    let mut extra_tools = Vec::new();
    let mut crash_after = None;
    let mut state = None;
    let mut start_delay = 0;
    let mut start_gate: Option<std::path::PathBuf> = None;
    let mut emulate = None;
    let mut mute_lists = false;
    let mut refuse_first_level = false;
    let mut list_delay = Duration::ZERO;
    let mut refuse_discover = false;
    let mut stubborn = false;
    let mut deaf_after_calls = None;
    let mut log_every = None;
    let mut with_tasks = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--name" => name = value(),
            "--tools" => {
                let text = std::fs::read_to_string(value()).expect("readable --tools file");
                let doc: Value = serde_json::from_str(&text).expect("--tools file is JSON");
                extra_tools = doc["tools"].as_array().cloned().unwrap_or_default();
            }
            "--state" => {
                let dir = std::path::PathBuf::from(value());
                std::fs::create_dir_all(&dir).unwrap();
                append(&dir.join("starts"), &std::process::id().to_string());
                state = Some(dir);
            }
            "--exit-after-ms" => {
                let ms: u64 = value().parse().expect("--exit-after-ms takes milliseconds");
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    // Fixed, as far as this start can tell: the file it names exists.
                    let fixed = std::env::var_os("FAULTY_FIXED_IF").is_some_and(|f| std::path::Path::new(&f).exists());
                    if fixed {
                        return;
                    }
                    eprintln!("faulty-server: exiting after {ms} ms as told");
                    std::process::exit(4);
                });
            }
            "--emulate" => emulate = Some(value()),
            "--start-delay" => start_delay = value().parse().expect("--start-delay takes milliseconds"),
            "--start-gate" => start_gate = Some(value().into()),
            "--crash-after" => crash_after = Some(value().parse().expect("--crash-after takes a number")),
            // Initialises, then never answers `tools/list`: a start that never completes.
            "--mute-lists" => mute_lists = true,
            "--refuse-first-level" => refuse_first_level = true,
            "--list-delay" => {
                list_delay = Duration::from_millis(value().parse().expect("--list-delay takes milliseconds"))
            }
            "--refuse-discover" => refuse_discover = true,
            // Ignores SIGTERM and the end of its input: only SIGKILL stops it.
            "--stubborn" => stubborn = true,
            "--tasks" => with_tasks = true,
            // Stops reading its input (but keeps running) after this many tool calls and
            // prompts; once per state folder, so that its replacement hears again.
            "--deaf-after-calls" => deaf_after_calls = Some(value().parse::<u64>().expect("a number")),
            // Sends a log message this often, whatever the client does.
            "--log-every-ms" => log_every = Some(Duration::from_millis(value().parse().expect("milliseconds"))),
            // Writes one stderr line of this many MiB at start.
            "--stderr-line-mb" => {
                let mb: usize = value().parse().expect("--stderr-line-mb takes a number");
                let chunk = vec![b'x'; 1 << 20];
                let mut err = std::io::stderr().lock();
                for _ in 0..mb {
                    err.write_all(&chunk).expect("stderr");
                }
                err.write_all(b"\n").expect("stderr");
            }
            other => panic!("unknown option {other}"),
        }
    }
    eprintln!("faulty-server {name} started (pid {})", std::process::id());
    if stubborn {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM");
        tokio::spawn(async move {
            while term.recv().await.is_some() {
                // Written so that a closed stderr (the gateway gone) cannot kill it either.
                let _ = writeln!(std::io::stderr(), "faulty-server: ignoring SIGTERM");
            }
        });
    }
    tokio::time::sleep(Duration::from_millis(start_delay)).await;
    while start_gate.as_deref().is_some_and(|gate| !gate.exists()) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let server = Arc::new(Server {
        name,
        emulate,
        sessions: Mutex::default(),
        state,
        extra_tools,
        crash_after,
        mute_lists,
        refuse_first_level: refuse_first_level.into(),
        list_delay,
        refuse_discover,
        calls: AtomicU64::new(0),
        per_tool: Mutex::default(),
        last_429: Mutex::default(),
        toggled: AtomicBool::new(false),
        out: Mutex::new(std::io::stdout()),
        next_id: AtomicU64::new(1),
        pending: Mutex::default(),
        tasks: with_tasks.then(tasks::Tasks::default),
    });
    if let Some(every) = log_every {
        let server = server.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let log = json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "logger": "faulty", "data": "tick"}});
                server.send(&log).await;
            }
        });
    }
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut calls_read = 0;
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        calls_read += u64::from(matches!(msg["method"].as_str(), Some("tools/call" | "prompts/get")));
        let was_deaf = server.state.as_ref().map(|d| d.join("was-deaf"));
        if deaf_after_calls.is_some_and(|n| calls_read > n) && !was_deaf.as_ref().is_some_and(|f| f.exists()) {
            if let Some(f) = &was_deaf {
                std::fs::write(f, "").unwrap();
            }
            eprintln!("faulty-server: deaf from now on");
            std::future::pending::<()>().await;
        }
        let server = server.clone();
        // Each message on its own task, so that a hanging call does not block the rest.
        tokio::spawn(async move { server.handle(msg).await });
    }
    if stubborn {
        let _ = writeln!(std::io::stderr(), "faulty-server: stdin closed, staying anyway");
        std::future::pending::<()>().await;
    }
    eprintln!("faulty-server: stdin closed, exiting");
}

fn text(s: impl Into<String>) -> Value {
    json!({"content": [{"type": "text", "text": s.into()}]})
}

fn tool(name: &str, description: &str, props: Value, annotations: Value) -> Value {
    json!({
        "name": name,
        "description": description,
        "inputSchema": {"type": "object", "properties": props},
        "annotations": annotations,
    })
}

impl Server {
    async fn send(&self, msg: &Value) {
        let mut line = serde_json::to_string(msg).unwrap();
        line.push('\n');
        self.raw(line.as_bytes()).await;
    }

    async fn raw(&self, bytes: &[u8]) {
        let mut out = self.out.lock().await;
        // A closed stdout means the gateway is gone; there is nobody left to tell.
        let _ = out.write_all(bytes).and_then(|()| out.flush());
    }

    async fn request_client(&self, method: &str, params: Value) -> Value {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().await.insert(id, tx);
        self.send(&json!({"jsonrpc": "2.0", "id": format!("srv-{id}"), "method": method, "params": params})).await;
        rx.await.unwrap_or(Value::Null)
    }

    async fn handle(&self, msg: Value) {
        let id = msg.get("id").cloned();
        let Some(method) = msg.get("method").and_then(Value::as_str) else {
            // A response to one of our requests.
            let key =
                id.as_ref().and_then(Value::as_str).and_then(|s| s.strip_prefix("srv-")).and_then(|n| n.parse().ok());
            let key: Option<u64> = key;
            let responder = match key {
                Some(k) => self.pending.lock().await.remove(&k),
                None => None,
            };
            if let Some(tx) = responder {
                let _ = tx.send(msg.get("result").cloned().unwrap_or_else(|| msg["error"].clone()));
            }
            return;
        };
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let result = match method {
            "initialize" => {
                let mut answer = json!({
                    "protocolVersion": params["protocolVersion"].as_str().unwrap_or("2025-06-18"),
                    "capabilities": {
                        "tools": {"listChanged": true},
                        "prompts": {"listChanged": true},
                        "resources": {"subscribe": true, "listChanged": true},
                        "logging": {},
                        "completions": {},
                    },
                    "serverInfo": {"name": self.name, "version": "0.0.1"},
                });
                if self.tasks.is_some() {
                    answer["capabilities"]["tasks"] = tasks::capability();
                }
                Ok(answer)
            }
            "resources/subscribe" => {
                let uri = params["uri"].as_str().unwrap_or_default();
                if let Some(dir) = &self.state {
                    append(&dir.join("subscribes"), uri);
                }
                // Made at once, answered late.
                if uri.ends_with("/slow") {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                }
                Ok(json!({}))
            }
            "resources/unsubscribe" => {
                let uri = params["uri"].as_str().unwrap_or_default();
                if let Some(dir) = &self.state {
                    append(&dir.join("unsubscribes"), uri);
                }
                // Ended, never answered.
                if uri.ends_with("/sticky") {
                    std::future::pending::<()>().await;
                }
                Ok(json!({}))
            }
            "ping" => Ok(json!({})),
            "logging/setLevel" => {
                if let Some(dir) = &self.state {
                    append(&dir.join("levels"), params["level"].as_str().unwrap_or_default());
                }
                match self.refuse_first_level.swap(false, Ordering::Relaxed) {
                    true => Err((-32603, "not now".to_owned())),
                    false => Ok(json!({})),
                }
            }
            "tools/list" if self.mute_lists => return,
            "server/discover" if self.refuse_discover => {
                let data = json!({"supported": ["2025-11-25", "2025-06-18"], "requested": "2026-07-28"});
                let error = json!({"code": -32022, "message": "Unsupported protocol version", "data": data});
                self.send(&json!({"jsonrpc": "2.0", "id": id, "error": error})).await;
                return;
            }
            "tools/list" => {
                tokio::time::sleep(self.list_delay).await;
                if let Some(dir) = &self.state {
                    append(&dir.join("lists"), "tools");
                }
                Ok(json!({"tools": self.tools()}))
            }
            "prompts/list" => Ok(
                json!({"prompts": [{"name": "greet", "description": "A greeting", "arguments": [{"name": "who", "required": true}]}]}),
            ),
            // With `"ask": "roots"`, the server asks its client for its roots first.
            "prompts/get" => {
                let asked = match params["arguments"]["ask"].as_str() {
                    Some("roots") => format!(" (roots: {})", self.request_client("roots/list", json!({})).await),
                    _ => String::new(),
                };
                let who = params["arguments"]["who"].as_str().unwrap_or("?");
                Ok(
                    json!({"messages": [{"role": "user", "content": {"type": "text", "text": format!("hello {who} from {}{asked}", self.name)}}]}),
                )
            }
            "resources/list" => Ok(
                json!({"resources": [{"uri": format!("faulty://{}/readme", self.name), "name": "readme", "mimeType": "text/plain"}]}),
            ),
            "resources/templates/list" => Ok(
                json!({"resourceTemplates": [{"uriTemplate": format!("faulty://{}/items/{{id}}", self.name), "name": "item"}]}),
            ),
            "resources/read" => {
                let uri = params["uri"].as_str().unwrap_or_default();
                if let Some(dir) = &self.state {
                    append(&dir.join("reads"), uri);
                }
                if uri.ends_with("/hang") {
                    std::future::pending::<()>().await;
                }
                Ok(
                    json!({"contents": [{"uri": uri, "mimeType": "text/plain", "text": format!("{} says: contents of {uri}", self.name)}]}),
                )
            }
            "completion/complete" => Ok(
                json!({"completion": {"values": [format!("{}-{}", self.name, params["argument"]["value"].as_str().unwrap_or(""))], "hasMore": false}}),
            ),
            "tools/call" => {
                let progress = params.get("_meta").and_then(|m| m.get("progressToken")).cloned();
                if let Some(tasks) = &self.tasks
                    && params.get("task").is_some_and(|t| !t.is_null())
                {
                    return self.run_task(tasks, id, &params, progress).await;
                }
                self.call(&params, progress).await
            }
            "tasks/get" if self.tasks.is_some() => {
                self.tasks.as_ref().unwrap().task(params["taskId"].as_str().unwrap_or_default()).await
            }
            "tasks/result" if self.tasks.is_some() => {
                self.tasks.as_ref().unwrap().result(params["taskId"].as_str().unwrap_or_default()).await
            }
            // Noted in `tasks_cancelled`; the task itself runs on.
            "tasks/cancel" if self.tasks.is_some() => {
                let task = params["taskId"].as_str().unwrap_or_default();
                if let Some(dir) = &self.state {
                    append(&dir.join("tasks_cancelled"), task);
                }
                Ok(tasks::task(task, "cancelled"))
            }
            "notifications/cancelled" => {
                if let Some(dir) = &self.state {
                    append(&dir.join("cancelled"), &params["requestId"].to_string());
                }
                return;
            }
            m if m.starts_with("notifications/") => return,
            _ => Err((-32601, format!("method not found: {method}"))),
        };
        let Some(id) = id else { return };
        match result {
            Ok(Value::Null) => {} // the call chose not to answer
            Ok(result) => self.send(&json!({"jsonrpc": "2.0", "id": id, "result": result})).await,
            Err((code, message)) => {
                self.send(&json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})).await
            }
        }
    }

    /// A task-augmented call: answered at once with the task, then run, its result kept
    /// and its end told.
    async fn run_task(&self, tasks: &tasks::Tasks, id: Option<Value>, params: &Value, progress: Option<Value>) {
        let (task, done) = tasks.start().await;
        let created = json!({"task": tasks::task(&task, "working")});
        self.send(&json!({"jsonrpc": "2.0", "id": id, "result": created})).await;
        let result = self
            .call(params, progress)
            .await
            .unwrap_or_else(|(_, message)| json!({"content": [{"type": "text", "text": message}], "isError": true}));
        let _ = done.send(Some(result));
        let status = tasks::task(&task, "completed");
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/tasks/status", "params": status})).await;
    }

    fn tools(&self) -> Vec<Value> {
        let ro = json!({"readOnlyHint": true});
        if self.emulate.is_some() {
            // The real server's tools, and a way to crash it.
            let mut tools = self.extra_tools.clone();
            tools.push(tool("crash", "Exits the server process without answering", json!({}), json!({})));
            return tools;
        }
        let mut tools = vec![
            tool(
                "echo",
                "Echoes `message`, prefixed with the server's name",
                json!({"message": {"type": "string"}}),
                ro.clone(),
            ),
            tool("crash", "Exits the server process without answering", json!({}), json!({})),
            tool("close_stdout", "Closes stdout but keeps running, a server gone deaf", json!({}), json!({})),
            tool("hang", "Never answers", json!({}), ro.clone()),
            tool(
                "freeze",
                "Blocks the whole process for `ms`: not even a ping is answered",
                json!({"ms": {"type": "integer"}}),
                json!({}),
            ),
            {
                let mut slow = tool(
                    "slow",
                    "Answers after `ms`, sending `steps` progress notifications",
                    json!({"ms": {"type": "integer"}, "steps": {"type": "integer"}}),
                    ro.clone(),
                );
                if self.tasks.is_some() {
                    slow["execution"] = json!({"taskSupport": "optional"});
                }
                slow
            },
            tool("garbage", "Writes non-JSON lines to stdout, then answers", json!({}), ro.clone()),
            tool("huge", "Answers with a text of `bytes` bytes", json!({"bytes": {"type": "integer"}}), ro.clone()),
            tool(
                "fail",
                "Answers with an isError result (after `ms`, if given)",
                json!({"message": {"type": "string"}, "ms": {"type": "integer"}}),
                json!({}),
            ),
            tool(
                "rpc_error",
                "Answers with a JSON-RPC error",
                json!({"code": {"type": "integer"}, "message": {"type": "string"}}),
                json!({}),
            ),
            tool(
                "sample",
                "Asks the client to sample a message and returns its answer",
                json!({"prompt": {"type": "string"}}),
                json!({}),
            ),
            tool("roots", "Asks the client for its roots", json!({}), json!({})),
            tool(
                "sample_late",
                "Waits `ms` whatever becomes of its call (cancelled or not), then asks the client to sample; writes the answer to `DIR/late`",
                json!({"ms": {"type": "integer"}}),
                json!({}),
            ),
            tool(
                "elicit",
                "Asks the client to elicit a value (with `progress`, reporting progress before and after)",
                json!({"progress": {"type": "boolean"}}),
                json!({}),
            ),
            tool(
                "log",
                "Sends a log message notification",
                json!({"level": {"type": "string"}, "message": {"type": "string"}}),
                json!({}),
            ),
            tool("toggle_tool", "Adds (or removes) the tool `extra` and announces list_changed", json!({}), json!({})),
            tool(
                "flaky",
                "Fails every fifth call with -32001 (a transient abort)",
                json!({"q": {"type": "string"}}),
                ro.clone(),
            ),
            tool(
                "flaky_write",
                "Like flaky, without hints: not safe to replay",
                json!({"q": {"type": "string"}}),
                json!({}),
            ),
            tool("outage", "Never answers while the file `outage` exists in the state folder", json!({}), ro.clone()),
            tool(
                "rate_limited",
                "Answers 429 with retry-after `retry_after` s (1 by default) unless the last 429 was that long ago",
                json!({"retry_after": {"type": "integer"}}),
                ro.clone(),
            ),
            tool(
                "search",
                "Always times out with -32001, like a lean search under load",
                json!({"query": {"type": "string"}, "num_results": {"type": "integer"}}),
                ro.clone(),
            ),
        ];
        if self.toggled.load(Ordering::Relaxed) {
            tools.push(tool("extra", "Appears after toggle_tool", json!({}), ro));
        }
        if self.tasks.is_some() {
            let mut research =
                tool("research", "As `slow`, only ever as a task", json!({"ms": {"type": "integer"}}), json!({}));
            research["execution"] = json!({"taskSupport": "required"});
            tools.push(research);
        }
        tools.extend(self.extra_tools.iter().cloned());
        tools
    }

    async fn call(&self, params: &Value, progress: Option<Value>) -> Result<Value, (i64, String)> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        if self.crash_after == Some(n) {
            eprintln!("faulty-server: crashing on call {n} as told");
            std::process::exit(3);
        }
        let args = &params["arguments"];
        let name = params["name"].as_str().unwrap_or_default();
        let nth = {
            let mut counts = self.per_tool.lock().await;
            let c = counts.entry(name.to_owned()).or_default();
            *c += 1;
            *c
        };
        if let Some(dir) = &self.state {
            append(&dir.join("calls"), name);
        }
        // A tool wrapping a dead backend: every call answers an isError 503 while the
        // file `unavailable` exists in the state folder.
        if self.state.as_ref().is_some_and(|d| d.join("unavailable").exists()) {
            return Ok(
                json!({"content": [{"type": "text", "text": "upstream error: 503 Service Unavailable"}], "isError": true}),
            );
        }
        if let Some(answer) = self.emulated(name, args).await {
            return answer;
        }
        match name {
            "flaky" | "flaky_write" if nth % 5 == 0 => {
                Err((-32001, "AbortError: The operation was aborted".to_owned()))
            }
            "flaky" | "flaky_write" => Ok(text(format!("{}: {name} #{nth}", self.name))),
            // A server that stops answering: the outage a breaker is for.
            "outage" if self.state.as_ref().is_some_and(|d| d.join("outage").exists()) => std::future::pending().await,
            "outage" => Ok(text(format!("{}: up", self.name))),
            // Under `FAULTY_NO_LIMITS`, a server with no rate limit.
            "rate_limited" if std::env::var_os("FAULTY_NO_LIMITS").is_some() => {
                Ok(text(format!("{}: not limited", self.name)))
            }
            "rate_limited" => {
                let after = args["retry_after"].as_u64().unwrap_or(1);
                let mut last = self.last_429.lock().await;
                match *last {
                    Some(at) if at.elapsed() >= Duration::from_secs(after) => {
                        *last = None;
                        Ok(text(format!("{}: waited as asked", self.name)))
                    }
                    _ => {
                        *last = Some(std::time::Instant::now());
                        Ok(
                            json!({"content": [{"type": "text", "text": format!("429 Too Many Requests: retry after {after} seconds")}], "isError": true}),
                        )
                    }
                }
            }
            "search" => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Err((-32001, "AbortError: The operation was aborted".to_owned()))
            }
            "echo" => Ok(text(format!("{}: {}", self.name, args["message"].as_str().unwrap_or("")))),
            "crash" => {
                eprintln!("faulty-server: crashing as asked");
                std::process::exit(3)
            }
            "hang" => std::future::pending().await,
            "close_stdout" => {
                let null = std::fs::File::open("/dev/null").expect("/dev/null");
                let _out = self.out.lock().await;
                nix::unistd::dup2_stdout(null).expect("dup2 over stdout");
                eprintln!("faulty-server: stdout closed, still running");
                std::future::pending().await
            }
            "freeze" => {
                std::thread::sleep(Duration::from_millis(args["ms"].as_u64().unwrap_or(1000)));
                Ok(text(format!("{}: thawed", self.name)))
            }
            "slow" | "research" => {
                let ms = args["ms"].as_u64().unwrap_or(100);
                let steps = args["steps"].as_u64().unwrap_or(0);
                for step in 1..=steps {
                    tokio::time::sleep(Duration::from_millis(ms / (steps + 1))).await;
                    if let Some(token) = &progress {
                        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": token, "progress": step, "total": steps, "message": format!("step {step}")}})).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(ms / (steps + 1))).await;
                Ok(text(format!("{}: slept {ms} ms", self.name)))
            }
            "garbage" => {
                self.raw(b"this is not JSON\n{\"half\": \n\x00\x01binary\n").await;
                Ok(text(format!("{}: survived garbage", self.name)))
            }
            "huge" => Ok(text("x".repeat(usize::try_from(args["bytes"].as_u64().unwrap_or(1 << 20)).unwrap_or(0)))),
            "fail" => {
                if let Some(ms) = args["ms"].as_u64() {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                Ok(json!({"content": [{"type": "text", "text": said(args, "tool failed")}], "isError": true}))
            }
            "rpc_error" => Err((args["code"].as_i64().unwrap_or(-32603), said(args, "internal error"))),
            // With `"times": N`, it asks N times at once.
            "sample" => {
                let params = json!({"messages": [{"role": "user", "content": {"type": "text", "text": args["prompt"].as_str().unwrap_or("hi")}}], "maxTokens": 16});
                let times = args["times"].as_u64().unwrap_or(1);
                let asked = (0..times).map(|_| self.request_client("sampling/createMessage", params.clone()));
                let answers: Vec<String> =
                    futures::future::join_all(asked).await.iter().map(Value::to_string).collect();
                Ok(text(format!("sampled: {}", answers.join("\n"))))
            }
            "roots" => Ok(text(format!("roots: {}", self.request_client("roots/list", json!({})).await))),
            // A server still serving a call its client gave up on, as many do.
            "sample_late" => {
                tokio::time::sleep(Duration::from_millis(args["ms"].as_u64().unwrap_or(1000))).await;
                let answer = self
                    .request_client("sampling/createMessage", json!({"messages": [{"role": "user", "content": {"type": "text", "text": "late"}}], "maxTokens": 16}))
                    .await;
                if let Some(dir) = &self.state {
                    append(&dir.join("late"), &answer.to_string());
                }
                Ok(text(format!("sampled late: {answer}")))
            }
            // With `"progress": true`, it reports progress before it asks and after.
            "elicit" => {
                let report = |step: u64, message: &str| {
                    let token = progress.as_ref().filter(|_| args["progress"] == json!(true));
                    let note = token.map(|token| json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": token, "progress": step, "total": 2, "message": message}}));
                    async move {
                        if let Some(note) = note {
                            self.send(&note).await;
                        }
                    }
                };
                report(1, "asking").await;
                let answer = self.request_client("elicitation/create", json!({"message": "Your name?", "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}})).await;
                report(2, "answered").await;
                Ok(text(format!("elicited: {answer}")))
            }
            "log" => {
                self.send(&json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": args["level"].as_str().unwrap_or("info"), "logger": "faulty", "data": args["message"]}})).await;
                Ok(text("logged"))
            }
            // With `"announce": N`, it says so N times.
            "toggle_tool" => {
                self.toggled.fetch_xor(true, Ordering::Relaxed);
                for _ in 0..args["announce"].as_u64().unwrap_or(1) {
                    self.send(&json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})).await;
                }
                Ok(text("toggled"))
            }
            other if self.extra_tools.iter().any(|t| t["name"] == other) || other == "extra" => {
                Ok(text(format!("{}: {other} answered with {args}", self.name)))
            }
            other => Err((-32602, format!("unknown tool: {other}"))),
        }
    }
}

/// What a failing tool says: its `message`, or `default`; with `"reversed": true` the
/// message read backwards, so that what it says is its own words and not an echo of its
/// arguments (which the gateway does not classify a failure by).
fn said(args: &Value, default: &str) -> String {
    let message = args["message"].as_str().unwrap_or(default);
    if args["reversed"] == true { message.chars().rev().collect() } else { message.to_owned() }
}

/// Appends `line` in one write: processes of the same server (an old one and its
/// relaunch) append to the same files, and `writeln!` may write the line and its end
/// apart, which two processes interleave.
fn append(path: &std::path::Path, line: &str) {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("state file is writable");
    f.write_all(format!("{line}\n").as_bytes()).expect("state file is writable");
}

impl Server {
    /// How lean-lsp-mcp and hol4-mcp really fail.
    ///
    /// lean: the searches, `lean_state_search`, `lean_diagnostic_messages` and
    /// `lean_local_search` abort with -32001 (contention); `lean_loogle`,
    /// `lean_leanfinder`, `lean_hammer_premise` and `lean_goal` answer.
    /// hol: sessions live in this process; `hol_send` on an unknown session says so, a
    /// command containing `loop` never finishes (until `hol_interrupt`), `holmake` fails
    /// building fooTheory.
    async fn emulated(&self, name: &str, args: &Value) -> Option<Result<Value, (i64, String)>> {
        let abort = || Err((-32001, "AbortError: The operation was aborted".to_owned()));
        let s = |k: &str| args[k].as_str().unwrap_or_default().to_owned();
        Some(match (self.emulate.as_deref()?, name) {
            ("lean", "lean_leansearch" | "lean_state_search" | "lean_diagnostic_messages" | "lean_local_search") => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                abort()
            }
            ("lean", "lean_loogle" | "lean_leanfinder") => {
                Ok(text(format!("{name}: results for {} (at most {})", args["query"], args["num_results"])))
            }
            ("lean", "lean_hammer_premise" | "lean_goal") => {
                Ok(text(format!("{name}: at {}:{}:{}", args["file_path"], args["line"], args["column"])))
            }
            ("hol", "hol_start") => {
                let session = if args["name"].is_string() { s("name") } else { "default".to_owned() };
                self.sessions.lock().await.insert(session.clone(), s("workdir"));
                Ok(text(format!("HOL session `{session}` started in {}", s("workdir"))))
            }
            ("hol", "hol_send") => {
                let session = if args["session"].is_string() { s("session") } else { "default".to_owned() };
                if !self.sessions.lock().await.contains_key(&session) {
                    return Some(Ok(
                        json!({"content": [{"type": "text", "text": format!("Error: Session '{session}' not found. Use hol_start first.")}], "isError": true}),
                    ));
                }
                if s("command").contains("loop") {
                    std::future::pending::<()>().await;
                }
                Ok(text(format!("ok: {} in {session}", s("command"))))
            }
            ("hol", "hol_interrupt") => {
                if let Some(dir) = &self.state {
                    append(&dir.join("interrupted"), &s("session"));
                }
                Ok(text("interrupted"))
            }
            ("hol", "holmake") => Ok(
                json!({"content": [{"type": "text", "text": "Holmake failed:\nFailed to build fooTheory\n"}], "isError": true}),
            ),
            _ => return None,
        })
    }
}
