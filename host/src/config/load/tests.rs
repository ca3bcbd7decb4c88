use std::path::Path;

use super::*;

fn env(name: &str) -> Option<String> {
    match name {
        "TOKEN" => Some("s3cret".into()),
        _ => None,
    }
}

fn ok(json: &str) -> Config {
    parse(json, Path::new("/etc/rebound/rebound.json"), &env).unwrap_or_else(|e| panic!("{e}"))
}

/// Asserts that `json` is rejected, naming `key`, with `needle` in the message.
fn rejects(json: &str, key: &str, needle: &str) {
    let err = parse(json, Path::new("/etc/rebound/rebound.json"), &env).expect_err("config should be rejected");
    let text = err.to_string();
    assert!(text.contains("/etc/rebound/rebound.json"), "no file in: {text}");
    assert!(text.contains("hint: "), "no hint in: {text}");
    assert!(text.contains(needle), "{needle:?} not in: {text}");
    if !key.is_empty() {
        assert_eq!(err.key(), Some(key), "in: {text}");
    }
}

#[test]
fn claude_desktop_file_loads_unchanged() {
    let c = ok(r#"{"mcpServers": {
        "fs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]},
        "remote": {"type": "http", "url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}}
    }, "globalShortcut": "Ctrl+Space"}"#);
    assert_eq!(c.servers.keys().collect::<Vec<_>>(), ["fs", "remote"]);
    let Launch::Stdio(s) = &c.servers["fs"].launch else { panic!() };
    assert_eq!(s.command, "npx");
    assert_eq!(s.args.len(), 3);
    let Launch::Http(h) = &c.servers["remote"].launch else { panic!() };
    assert_eq!(h.headers["Authorization"], "Bearer s3cret");
    assert_eq!(c.settings.tool_names, ToolNames::Conditional);
    assert_eq!(c.settings.errors_log, Path::new("/etc/rebound/rebound-errors.jsonl"));
    assert_eq!(c.servers["fs"].recovery, RecoveryConfig::default());
}

#[test]
fn retry_and_breaker_defaults() {
    let r = RecoveryConfig::default();
    assert_eq!((r.retry.max_attempts, r.retry.initial_delay_ms, r.retry.max_delay_ms), (3, 1000, 60_000));
    assert!((r.retry.multiplier - 2.0).abs() < f64::EPSILON);
    let b = r.breaker;
    assert_eq!((b.failure_threshold, b.success_threshold, b.open_ms, b.half_open_max_calls), (5, 2, 60_000, 1));
    // The rest of what the README gives as defaults, as a config without them reads.
    let c = ok(r#"{"mcpServers": {"a": {"command": "a"}}}"#);
    let r = &c.servers["a"].recovery;
    assert_eq!((r.timeout_ms, r.ping_timeout_ms), (60_000, 30_000));
    assert!((r.retry.budget_ratio - 0.3).abs() < f64::EPSILON);
    assert_eq!(r.retry.budget_reserve, 10);
    let b = &r.breaker;
    assert_eq!((b.max_open_ms, b.window_ms, b.min_calls), (600_000, 60_000, 20));
    assert!((b.failure_rate - 0.5).abs() < f64::EPSILON);
    let s = &c.settings;
    let p = &s.restart;
    assert_eq!(
        (p.initial_delay_ms, p.max_delay_ms, p.crash_loop_limit, p.crash_window_ms, p.down_retry_ms),
        (250, 30_000, 5, 60_000, 60_000)
    );
    assert_eq!((s.init_timeout_ms, s.startup_timeout_ms, s.errors_log_max_bytes), (60_000, 30_000, 10 << 20));
}

#[test]
fn defaults_merge_under_server_recovery() {
    let c = ok(r#"{
        "mcpServers": {"a": {"command": "a", "recovery": {"retry": {"max_attempts": 5}, "tools": {"slow": {"timeout_ms": 9}}}}},
        "rebound": {"tool_names": "always", "defaults": {"recovery": {"timeout_ms": 1234, "retry": {"initial_delay_ms": 7}}}}
    }"#);
    let r = &c.servers["a"].recovery;
    assert_eq!(r.timeout_ms, 1234);
    assert_eq!(r.retry.max_attempts, 5);
    assert_eq!(r.retry.initial_delay_ms, 7);
    assert_eq!(r.timeout_for("slow"), 9);
    assert_eq!(r.timeout_for("fast"), 1234);
    let none = |_: &str, _: &str| None;
    assert_eq!(r.longest_deadline(none), r.deadline_for("fast", none), "no tool's own timeout is longer");
    let mut longer = r.clone();
    longer.tools.get_mut("slow").unwrap().timeout_ms = Some(100_000);
    assert_eq!(longer.longest_deadline(none), longer.deadline_for("slow", none));
    assert!(longer.longest_deadline(none) > longer.deadline_for("", none));
    assert_eq!(c.settings.tool_names, ToolNames::Always);
}

#[test]
fn relative_paths_start_at_the_config_folder() {
    let c = ok(
        r#"{"mcpServers": {"a": {"command": "./bin/server"}}, "rebound": {"plugins_dir": "plugins", "errors_log": "/var/log/e.jsonl"}}"#,
    );
    let Launch::Stdio(s) = &c.servers["a"].launch else { panic!() };
    assert_eq!(s.command, "/etc/rebound/./bin/server");
    assert_eq!(c.settings.plugins_dir, Path::new("/etc/rebound/plugins"));
    assert_eq!(c.settings.errors_log, Path::new("/var/log/e.jsonl"));
}

#[test]
fn disabled_servers_and_unknown_keys_are_warnings() {
    let c =
        ok(r#"{"mcpServers": {"a": {"command": "a", "autoApprove": []}, "b": {"command": "b", "disabled": true}}}"#);
    assert_eq!(c.servers.len(), 1);
    assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
    assert!(c.warnings[0].contains("mcpServers.a.autoApprove"));
    // A client's own settings beside its servers are passed over with a word; a section
    // of Rebound's spelt almost right is an error, not every setting silently left out.
    let c = ok(r#"{"globalShortcut": "", "mcpServers": {"a": {"command": "a"}}}"#);
    assert!(c.warnings[0].contains("`globalShortcut` is not a key Rebound reads"), "{:?}", c.warnings);
    let misspelt =
        r#"{"Rebound": {"http": {"operator_token": "0123456789abcdef0"}}, "mcpServers": {"a": {"command": "a"}}}"#;
    rejects(misspelt, "Rebound", "`rebound` is");
    rejects(r#"{"mcp_servers": {"a": {"command": "a"}}}"#, "mcp_servers", "`mcpServers` is");
    // So is a server's key spelt almost right, and a `disabled` that is not a boolean.
    rejects(r#"{"mcpServers": {"a": {"command": "a", "arg": ["x"]}}}"#, "mcpServers.a.arg", "write it `args`");
    rejects(r#"{"mcpServers": {"a": {"command": "a", "adpater": "x"}}}"#, "mcpServers.a.adpater", "`adapter`");
    rejects(
        r#"{"mcpServers": {"a": {"url": "http://h", "adapterConfig": {}}}}"#,
        "mcpServers.a.adapterConfig",
        "`adapter_config`",
    );
    rejects(r#"{"mcpServers": {"a": {"command": "a", "disabled": "true"}}}"#, "mcpServers.a.disabled", "true or false");
    rejects(r#"{"mcpServers": {"a": {"cmd": "a"}}}"#, "mcpServers.a.cmd", "write it `command`");
    ok(r#"{"mcpServers": {"a": {"command": "a", "disabled": null}}}"#);
    // Other clients' keys are passed over, however short.
    let c =
        ok(r#"{"mcpServers": {"a": {"command": "a", "alwaysAllow": [], "timeout": 60, "description": "d", "id": 1}}}"#);
    assert_eq!(c.warnings.len(), 4, "{:?}", c.warnings);
}

/// A number that would stop the gateway from working, or is past what it holds, is
/// refused, naming the key and its bounds; nothing is quietly changed.
#[test]
fn settings_past_their_bounds_are_refused() {
    let with = |settings: &str| format!(r#"{{"mcpServers": {{"a": {{"command": "a"}}}}, "rebound": {settings}}}"#);
    rejects(&with(r#"{"init_timeout_ms": 0}"#), "rebound.init_timeout_ms", "must be 1 to 86400000");
    rejects(&with(r#"{"restart": {"down_retry_ms": 0}}"#), "rebound.restart.down_retry_ms", "must be 1000");
    rejects(&with(r#"{"restart": {"crash_loop_limit": 0}}"#), "rebound.restart.crash_loop_limit", "at least 1");
    rejects(
        &with(r#"{"restart": {"initial_delay_ms": 9000, "max_delay_ms": 10}}"#),
        "rebound.restart.initial_delay_ms",
        "max_delay_ms",
    );
    rejects(&with(r#"{"plugin_memory_mb": 128}"#), "rebound.plugin_memory_mb", "must be 1 to 64");
    rejects(&with(r#"{"plugin_max_calls": 0}"#), "rebound.plugin_max_calls", "must be 1 to 64");
    rejects(&with(r#"{"errors_log_max_bytes": 0}"#), "rebound.errors_log_max_bytes", "must be 4096");
    rejects(&with(r#"{"http": {"max_sessions": 0}}"#), "rebound.http.max_sessions", "must be 1 to 100000");
    // Added to an instant, a larger one would overflow it.
    let huge = format!(r#"{{"startup_timeout_ms": {}}}"#, u64::MAX);
    rejects(&with(&huge), "rebound.startup_timeout_ms", "must be 1 to 86400000");
    rejects(&with(r#"{"restart": {"max_delay_ms": 0}}"#), "rebound.restart.max_delay_ms", "must be 1 to 86400000");
    let recovery = |r: &str| format!(r#"{{"mcpServers": {{"a": {{"command": "a", "recovery": {r}}}}}}}"#);
    rejects(
        &recovery(r#"{"retry": {"budget_reserve": 0}}"#),
        "mcpServers.a.recovery.retry.budget_reserve",
        "default (10)",
    );
    rejects(
        &recovery(r#"{"breaker": {"max_open_ms": 1000}}"#),
        "mcpServers.a.recovery.breaker.max_open_ms",
        "smaller than",
    );
    rejects(
        &recovery(r#"{"breaker": {"failure_threshold": 0}}"#),
        "mcpServers.a.recovery.breaker.failure_threshold",
        "default (5)",
    );
    rejects(
        &recovery(r#"{"retry": {"max_delay_ms": 90000000}}"#),
        "mcpServers.a.recovery.retry.max_delay_ms",
        "(60000)",
    );
    rejects(&recovery(r#"{"breaker": {"open_ms": 90000000}}"#), "mcpServers.a.recovery.breaker.open_ms", "(60000)");
    // A mistake in the defaults is named where it is written, even with no server to
    // take it; the keys' relations wait for each server's own keys over them.
    let defaults = |r: &str, servers: &str| {
        format!(r#"{{"mcpServers": {{{servers}}}, "rebound": {{"defaults": {{"recovery": {r}}}}}}}"#)
    };
    let a = r#""a": {"command": "a"}"#;
    rejects(
        &defaults(r#"{"retry": {"max_attempts": 500}}"#, a),
        "rebound.defaults.recovery.retry.max_attempts",
        "past the most it may be, 100",
    );
    rejects(
        &defaults(r#"{"breaker": {"failure_rate": 2}}"#, ""),
        "rebound.defaults.recovery.breaker.failure_rate",
        "not a fraction",
    );
    let own = r#""a": {"command": "a", "recovery": {"retry": {"max_delay_ms": 120000}}}"#;
    ok(&defaults(r#"{"retry": {"initial_delay_ms": 90000}}"#, own));
    rejects(
        &defaults(r#"{"retry": {"initial_delay_ms": 90000}}"#, a),
        "mcpServers.a.recovery.retry.initial_delay_ms",
        "larger than retry.max_delay_ms",
    );
    let c = ok(&with(r#"{"plugin_memory_mb": 64, "restart": {"down_retry_ms": 1000}}"#));
    assert_eq!((c.settings.plugin_memory_mb, c.settings.restart.down_retry_ms), (64, 1000));
}

#[test]
fn broken_configs_name_the_key_and_the_fix() {
    rejects("{\n  \"mcpServers\": {,}\n}", "", "rebound.json:2:18: not valid JSON");
    rejects("[]", "(top level)", "not a JSON object");
    rejects("{}", "mcpServers", "names no servers");
    rejects(r#"{"mcpServers": {"a": {}}}"#, "mcpServers.a", "neither `command` nor `url`");
    rejects(r#"{"mcpServers": {"a": {"command": "x", "url": "http://h"}}}"#, "mcpServers.a", "both");
    rejects(r#"{"mcpServers": {"a": {"command": 3}}}"#, "mcpServers.a.command", "must be a string");
    rejects(r#"{"mcpServers": {"a": {"command": "x", "args": "--y"}}}"#, "mcpServers.a.args", "array of strings");
    rejects(
        r#"{"mcpServers": {"a": {"command": "x", "args": ["${NOPE}"]}}}"#,
        "mcpServers.a.args[0]",
        "${NOPE:-value}",
    );
    rejects(r#"{"mcpServers": {"a": {"url": "ftp://h"}}}"#, "mcpServers.a.url", "not an http(s) URL");
    rejects(r#"{"mcpServers": {"a": {"url": "http://h/sse", "type": "sse"}}}"#, "mcpServers.a.type", "SSE");
    rejects(r#"{"mcpServers": {"a__b": {"command": "x"}}}"#, "mcpServers.a__b", "server name");
    rejects(
        r#"{"mcpServers": {"a": {"command": "x", "adapter": "nope"}}}"#,
        "mcpServers.a.adapter",
        "cargo xtask build-plugins",
    );
    rejects(
        r#"{"mcpServers": {"a": {"command": "x", "adapter": "../etc"}}}"#,
        "mcpServers.a.adapter",
        "not a plugin name",
    );
    rejects(
        r#"{"mcpServers": {"a": {"command": "x", "recovery": {"retry": {"max_attempts": "3"}}}}}"#,
        "mcpServers.a.recovery.retry.max_attempts",
        "invalid type: string",
    );
    rejects(
        r#"{"mcpServers": {"a": {"command": "x", "recovery": {"retyr": {}}}}}"#,
        "mcpServers.a.recovery.retyr",
        "unknown field",
    );
    rejects(
        r#"{"mcpServers": {"a": {"command": "x", "recovery": {"timeout_ms": 0}}}}"#,
        "mcpServers.a.recovery.timeout_ms",
        "greater than 0",
    );
    // What a file under 4 MiB could make gigabytes of: every server's copy of the
    // defaults, many servers, a long variable referred to many times.
    let many_tools: String =
        (0..4000).map(|n| format!(r#""tool_{n}": {{"timeout_ms": 1000}}"#)).collect::<Vec<_>>().join(",");
    rejects(
        &format!(
            r#"{{"mcpServers": {{"a": {{"command": "x"}}}}, "rebound": {{"defaults": {{"recovery": {{"tools": {{{many_tools}}}}}}}}}}}"#
        ),
        "rebound.defaults.recovery",
        "past the most it may take, 64 KiB",
    );
    let many_servers: String =
        (0..1025).map(|n| format!(r#""s{n}": {{"command": "x"}}"#)).collect::<Vec<_>>().join(",");
    rejects(&format!(r#"{{"mcpServers": {{{many_servers}}}}}"#), "mcpServers", "names 1025 servers, past the most");
    let refs = vec!["${LONG}"; 20].join("");
    let expanded = parse(
        &format!(r#"{{"mcpServers": {{"a": {{"command": "x", "args": ["{refs}"]}}}}}}"#),
        Path::new("/etc/rebound/rebound.json"),
        &|name: &str| (name == "LONG").then(|| "x".repeat(1 << 20)),
    );
    let refused = expanded.expect_err("20 MiB of one variable").to_string();
    assert!(refused.contains("mcpServers.a.args") && refused.contains("past the most"), "{refused}");
    // A typo's extra digits would hold calls for years.
    rejects(
        r#"{"mcpServers": {"a": {"command": "x", "recovery": {"retry": {"max_attempts": 3000}}}}}"#,
        "mcpServers.a.recovery.retry.max_attempts",
        "3000 is past the most it may be, 100",
    );
    rejects(
        r#"{"mcpServers": {"a": {"command": "x", "recovery": {"deadline_ms": 18446744073709551615}}}}"#,
        "mcpServers.a.recovery.deadline_ms",
        "past the most it may be, 86400000",
    );
    rejects(
        r#"{"mcpServers": {"a": {"command": "x", "recovery": {"tools": {"t": {"timeout_ms": 900000000}}}}}}"#,
        "mcpServers.a.recovery.tools.t.timeout_ms",
        "past the most",
    );
    rejects(
        r#"{"mcpServers": {"a": {"command": "x", "recovery": {"retry": {"multiplier": 0.5}}}}}"#,
        "mcpServers.a.recovery.retry.multiplier",
        "at least 1.0",
    );
    rejects(
        r#"{"mcpServers": {"a": {"command": "x"}}, "rebound": {"tool_names": "sometimes"}}"#,
        "rebound.tool_names",
        "unknown variant",
    );
    rejects(
        r#"{"mcpServers": {"a": {"command": "x"}}, "rebound": {"defaults": {"recovery": {"breaker": {"open_ms": -1}}}}}"#,
        "rebound.defaults.recovery.breaker.open_ms",
        "invalid value",
    );
}

/// A refusal never quotes a value that may be a secret (an `env` or `headers` value, a
/// URL read from the environment): it is logged and shown in the status, where the
/// refused file's secrets are not known, so not redacted.
#[test]
fn refusals_never_quote_what_may_be_secret() {
    let refused = |json: &str| {
        let env = |name: &str| (name == "URL").then(|| "ftp://user:hunter2@h".to_owned());
        parse(json, Path::new("/r.json"), &env).expect_err("refused").to_string()
    };
    let said = [
        (r#"{"mcpServers": {"a": {"command": "x", "env": {"KEY": "hunter2${oops"}}}}"#, "mcpServers.a.env.KEY"),
        (r#"{"mcpServers": {"a": {"url": "http://h", "headers": {"X": "${hunter2"}}}}"#, "mcpServers.a.headers.X"),
        (r#"{"mcpServers": {"a": {"url": "${URL}"}}}"#, "mcpServers.a.url"),
    ]
    .map(|(json, key)| (refused(json), key));
    for (text, key) in &said {
        assert!(text.contains(key) && !text.contains("hunter2"), "{text}");
    }
    assert!(said[0].0.contains("unfinished `${` (at byte 7)"), "{}", said[0].0);
    assert!(said[2].0.contains("not an http(s) URL"), "{}", said[2].0);
}

/// A key's name is the file's: one with a line break or a terminal escape in it is shown
/// written out, so that the refusal stays two lines (the fault, its hint) and drives
/// no terminal.
#[test]
fn a_refused_keys_name_forges_no_line() {
    let json = r#"{"mcpServers": {"a\nerror: forged\u001b[2J": {"command": "x", "bogus": 1}}}"#;
    let err = parse(json, Path::new("/r.json"), &env).expect_err("unknown key");
    let text = err.to_string();
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.contains(r"a\nerror: forged\u{1b}[2J") && !text.contains('\u{1b}'), "{text}");
}

#[test]
fn the_plugin_cache_is_kept_apart_from_the_plugins() {
    for cache in ["plugins", "plugins/cache", "./plugins/../plugins/x"] {
        let json = format!(
            r#"{{"mcpServers": {{}}, "rebound": {{"plugins_dir": "plugins", "plugin_cache_dir": "{cache}"}}}}"#
        );
        rejects(&json, "rebound.plugin_cache_dir", "is in the plugins folder");
    }
    for cache in ["plugins-cache", "plugins/../plugins-cache"] {
        let json = format!(
            r#"{{"mcpServers": {{}}, "rebound": {{"plugins_dir": "plugins", "plugin_cache_dir": "{cache}"}}}}"#
        );
        assert!(ok(&json).settings.plugin_cache_dir.is_some());
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("plugins"), dir.path().join("link")).unwrap();
    assert!(crate::config::within(&dir.path().join("link/cache"), &dir.path().join("plugins")), "through a link");
    assert!(!crate::config::within(&dir.path().join("plugins-cache"), &dir.path().join("plugins")));
}

#[test]
fn adapter_found_in_plugins_dir() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    std::fs::write(dir.path().join("plugins/lean-fallback.wasm"), b"").unwrap();
    let cfg = dir.path().join("rebound.json");
    let json = r#"{"mcpServers": {"a": {"command": "x", "adapter": "lean-fallback"}, "b": {"command": "x", "adapter": "hol"}}, "rebound": {"plugins_dir": "plugins"}}"#;
    let err = parse(json, &cfg, &env).unwrap_err().to_string();
    assert!(err.contains("available in") && err.contains("lean-fallback"), "{err}");
    let json =
        r#"{"mcpServers": {"a": {"command": "x", "adapter": "lean-fallback"}}, "rebound": {"plugins_dir": "plugins"}}"#;
    assert_eq!(parse(json, &cfg, &env).unwrap().servers["a"].adapter.as_deref(), Some("lean-fallback"));
}

#[test]
fn http_front_defaults_to_loopback_and_validates_its_settings() {
    let c = ok(r#"{"mcpServers": {"a": {"command": "a"}}}"#);
    assert!(c.settings.http.allowed_hosts.iter().any(|h| h == "localhost"));
    assert_eq!(c.settings.http.auth_token, None);
    let c = ok(
        r#"{"mcpServers": {"a": {"command": "a"}}, "rebound": {"http": {"auth_token": "${TOKEN}-and-more-characters"}}}"#,
    );
    assert_eq!(c.settings.http.auth_token.as_deref(), Some("s3cret-and-more-characters"));
    rejects(
        r#"{"mcpServers": {"a": {"command": "a"}}, "rebound": {"http": {"auth_token": "short"}}}"#,
        "rebound.http.auth_token",
        "too short",
    );
    rejects(
        r#"{"mcpServers": {"a": {"command": "a"}}, "rebound": {"http": {"allowed_origins": ["example.com"]}}}"#,
        "rebound.http.allowed_origins[0]",
        "no scheme",
    );
    for (key, value, says) in [
        ("max_body_bytes", "0", "must be 1 to 1073741824"),
        ("max_concurrent_per_client", "100001", "must be 1 to 100000"),
        ("max_sessions", "0", "must be 1 to 100000"),
        ("session_idle_ms", "999", "must be 1000 (a second)"),
        ("shutdown_grace_ms", "600001", "must be at most 600000"),
    ] {
        rejects(
            &format!(r#"{{"mcpServers": {{"a": {{"command": "a"}}}}, "rebound": {{"http": {{"{key}": {value}}}}}}}"#),
            &format!("rebound.http.{key}"),
            says,
        );
    }
    assert_eq!(c.settings.http.worker_threads, None, "half the cores unless set");
    let c = ok(r#"{"mcpServers": {"a": {"command": "a"}}, "rebound": {"http": {"worker_threads": 1}}}"#);
    assert_eq!(c.settings.http.worker_threads, Some(1));
    for threads in ["0", "257"] {
        rejects(
            &format!(
                r#"{{"mcpServers": {{"a": {{"command": "a"}}}}, "rebound": {{"http": {{"worker_threads": {threads}}}}}}}"#
            ),
            "rebound.http.worker_threads",
            "must be 1 to 256",
        );
    }
}

#[test]
fn upstream_headers_are_checked_without_repeating_their_values() {
    rejects(
        r#"{"mcpServers": {"a": {"url": "http://h/mcp", "headers": {"Mcp-Session-Id": "x"}}}}"#,
        "mcpServers.a.headers.Mcp-Session-Id",
        "transport itself",
    );
    rejects(
        r#"{"mcpServers": {"a": {"url": "http://h/mcp", "headers": {"bad name": "x"}}}}"#,
        "mcpServers.a.headers.bad name",
        "header name",
    );
    let err = parse(
        r#"{"mcpServers": {"a": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer hunter2\n"}}}}"#,
        Path::new("/etc/rebound/rebound.json"),
        &|_| None,
    )
    .unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

#[test]
fn the_operator_token_is_the_operators_own() {
    let c = ok(
        r#"{"mcpServers": {}, "rebound": {"http": {"auth_token": "client-token-0123456789", "operator_token": "operator-token-0123456789"}}}"#,
    );
    assert_eq!(c.settings.http.operator_token.as_deref(), Some("operator-token-0123456789"));
    rejects(
        r#"{"mcpServers": {}, "rebound": {"http": {"auth_token": "same-token-0123456789", "operator_token": "same-token-0123456789"}}}"#,
        "rebound.http.operator_token",
        "is the clients' token",
    );
    rejects(
        r#"{"mcpServers": {}, "rebound": {"http": {"operator_token": "short"}}}"#,
        "rebound.http.operator_token",
        "too short",
    );
}

/// Trusted proxies are addresses or blocks of them; anything else names its entry.
#[test]
fn trusted_proxies_are_addresses_or_blocks() {
    let c = ok(r#"{"mcpServers": {}, "rebound": {"http": {"trusted_proxies": ["127.0.0.1", "10.0.0.0/8", "::1"]}}}"#);
    let blocks: Vec<String> = c.settings.http.proxies().iter().map(ToString::to_string).collect();
    assert_eq!(blocks, ["127.0.0.1/32", "10.0.0.0/8", "::1/128"]);
    rejects(
        r#"{"mcpServers": {}, "rebound": {"http": {"trusted_proxies": ["127.0.0.1", "proxy.internal"]}}}"#,
        "rebound.http.trusted_proxies[1]",
        "is not an IP address or a CIDR block",
    );
    rejects(
        r#"{"mcpServers": {}, "rebound": {"http": {"trusted_proxies": ["::/0"]}}}"#,
        "rebound.http.trusted_proxies[0]",
        "trusts every address",
    );
    rejects(r#"{"mcpServers": {}, "rebound": {"http": {"trusted_proxies": ["0.0.0.0/0"]}}}"#, "", "trusts every");
    let c = ok(r#"{"mcpServers": {}, "rebound": {"http": {"proxy_header": "forwarded"}}}"#);
    assert_eq!(c.settings.http.proxy_header, crate::config::ProxyHeader::Forwarded);
    rejects(
        r#"{"mcpServers": {}, "rebound": {"http": {"proxy_header": "x-real-ip"}}}"#,
        "rebound.http.proxy_header",
        "unknown variant",
    );
    // IPv4 written as IPv6 is IPv4, as a peer's address is read.
    let c = ok(
        r#"{"mcpServers": {}, "rebound": {"http": {"trusted_proxies": ["::ffff:10.0.0.1", "::ffff:10.0.0.0/104"]}}}"#,
    );
    let blocks: Vec<String> = c.settings.http.proxies().iter().map(ToString::to_string).collect();
    assert_eq!(blocks, ["10.0.0.1/32", "10.0.0.0/8"]);
    rejects(
        r#"{"mcpServers": {}, "rebound": {"http": {"trusted_proxies": ["10.0.0.0/33"]}}}"#,
        "rebound.http.trusted_proxies[0]",
        "e.g. \"127.0.0.1\" or \"10.0.0.0/8\"",
    );
}

#[test]
fn a_broken_token_is_reported_without_being_repeated() {
    let err = parse(
        r#"{"mcpServers": {"a": {"command": "a"}}, "rebound": {"http": {"auth_token": "hunter2-hunter2-${oops"}}}"#,
        Path::new("/etc/rebound/rebound.json"),
        &|_| None,
    )
    .unwrap_err();
    assert_eq!(err.key(), Some("rebound.http.auth_token"));
    assert!(!err.to_string().contains("hunter2"), "{err}");
    // From the environment, a token is taken as it is, `${` and all.
    let c = parse(r#"{"mcpServers": {"a": {"command": "a"}}}"#, Path::new("/x/r.json"), &|name| {
        (name == "REBOUND_AUTH_TOKEN").then(|| "literal-${not-a-var}-0123".to_owned())
    })
    .unwrap();
    assert_eq!(c.settings.http.auth_token.as_deref(), Some("literal-${not-a-var}-0123"));
}

/// A token that is only `${VAR}`, with VAR not set, is told so by name; one with the
/// variable inside other text is not quoted.
#[test]
fn a_token_from_a_variable_not_set_says_which() {
    let refused = |token: &str| {
        let json = format!(
            r#"{{"mcpServers": {{"a": {{"command": "a"}}}}, "rebound": {{"http": {{"auth_token": "{token}"}}}}}}"#
        );
        parse(&json, Path::new("/x/r.json"), &|_| None).unwrap_err().to_string()
    };
    assert!(refused("${GW_TOKEN}").contains("${GW_TOKEN}, which is not set"), "{}", refused("${GW_TOKEN}"));
    let mixed = refused("hunter2-hunter2-${GW_TOKEN}");
    assert!(mixed.contains("not set") && !mixed.contains("hunter2"), "{mixed}");
}

/// What only the other transport takes is refused, not dropped unread: `headers` for a
/// `command`, `args`, `env` and `cwd` for a `url`; left empty, they pass.
#[test]
fn the_other_transports_keys_are_refused() {
    rejects(r#"{"mcpServers": {"a": {"command": "a", "headers": {"X": "y"}}}}"#, "mcpServers.a.headers", "a `command`");
    for (k, v) in [("args", r#"["x"]"#), ("env", r#"{"K": "v"}"#), ("cwd", r#""/tmp""#)] {
        let json = format!(r#"{{"mcpServers": {{"a": {{"url": "http://127.0.0.1:1/mcp", "{k}": {v}}}}}}}"#);
        rejects(&json, &format!("mcpServers.a.{k}"), "a `url`");
    }
    ok(
        r#"{"mcpServers": {"a": {"url": "http://127.0.0.1:1/mcp", "env": {}, "args": []}, "b": {"command": "b", "headers": {}}}}"#,
    );
}

#[test]
fn adapter_grants() {
    let c = ok(r#"{"mcpServers": {"a": {"command": "x"}, "b": {"command": "y",
        "adapter_allow": {"tools": ["b/*", "a/search_*"], "restart": true}}}, "rebound": {"plugin_max_calls": 3}}"#);
    assert_eq!(c.servers["a"].adapter_allow, AdapterGrant::own("a"), "the default: its own server, no restart");
    let b = &c.servers["b"].adapter_allow;
    assert!(b.restart && b.allows_tool("a", "search_web") && !b.allows_tool("a", "delete"));
    assert_eq!(c.settings.plugin_max_calls, 3);
    assert!(
        ok(r#"{"mcpServers": {"a": {"command": "x", "adapter_allow": {"restart": true}}}}"#).servers["a"]
            .adapter_allow
            .allows_tool("a", "anything")
    );

    let server = |allow: &str| format!(r#"{{"mcpServers": {{"a": {{"command": "x", "adapter_allow": {allow}}}}}}}"#);
    rejects(&server(r#"{"tools": ["lean"]}"#), "mcpServers.a.adapter_allow.tools[0]", "no `/` between server and tool");
    rejects(
        &server(r#"{"tools": ["a/*", "/x"]}"#),
        "mcpServers.a.adapter_allow.tools[1]",
        "needs both a server and a tool",
    );
    rejects(&server(r#"{"tools": ["zz/*"]}"#), "mcpServers.a.adapter_allow.tools[0]", "names no configured server");
    rejects(&server(r#"{"tool": ["a/*"]}"#), "mcpServers.a.adapter_allow.tool", "unknown field");
    rejects(&server(r#"["a/*"]"#), "mcpServers.a.adapter_allow", "must be an object");
    // Over HTTP, what a shared server's adapter is shown: tool names of its own server.
    let a = ok(&server(r#"{"observes": ["hol_*", "holmake"]}"#)).servers["a"].adapter_allow.clone();
    assert!(a.observes_shared("a", "hol_start") && a.observes_shared("a", "holmake") && !a.observes_shared("a", "ls"));
    assert!(a.allows_tool("a", "anything"), "its tools as by default");
    assert!(!AdapterGrant::own("a").observes_shared("a", "hol_start"), "none by default");
    rejects(&server(r#"{"observes": [""]}"#), "mcpServers.a.adapter_allow.observes[0]", "needs both");
}

#[test]
fn session_scope_and_its_variable() {
    let c = ok(r#"{"mcpServers": {
        "memory": {"command": "mcp-server-memory", "scope": "session",
                   "env": {"MEMORY_FILE_PATH": "/var/lib/memory/${REBOUND_SESSION}.jsonl"}},
        "time": {"command": "mcp-server-time"}
    }}"#);
    assert_eq!((c.servers["memory"].scope, c.servers["time"].scope), (Scope::Session, Scope::Shared));
    let own = c.servers["memory"].for_session("sess_1_2");
    let Launch::Stdio(s) = &own.launch else { panic!() };
    assert_eq!(s.env["MEMORY_FILE_PATH"], "/var/lib/memory/sess_1_2.jsonl");
    assert_eq!(c.settings.http.session_idle_ms, 1_800_000);

    rejects(
        r#"{"mcpServers": {"m": {"command": "x", "args": ["${REBOUND_SESSION}"]}}}"#,
        "mcpServers.m",
        "only a server with one instance per client session",
    );
    // A working folder takes variables too; a session's is checked when it starts.
    let c = ok(r#"{"mcpServers": {
        "a": {"command": "x", "cwd": "${TMPDIR:-/tmp}"},
        "b": {"command": "x", "scope": "session", "cwd": "/tmp/${REBOUND_SESSION}"}
    }}"#);
    let Launch::Stdio(a) = &c.servers["a"].launch else { panic!() };
    assert_eq!(a.cwd.as_deref(), Some(Path::new("/tmp")));
    let Launch::Stdio(b) = &c.servers["b"].for_session("s1").launch else { panic!() };
    assert_eq!(b.cwd.as_deref(), Some(Path::new("/tmp/s1")));
    rejects(r#"{"mcpServers": {"m": {"command": "x", "cwd": "${NO_SUCH_VAR}"}}}"#, "mcpServers.m.cwd", "NO_SUCH_VAR");
    rejects(r#"{"mcpServers": {"m": {"command": "x", "scope": "user"}}}"#, "mcpServers.m.scope", "not a scope");
    rejects(
        r#"{"mcpServers": {"m": {"command": "x"}}, "rebound": {"http": {"session_idle_ms": 5}}}"#,
        "rebound.http.session_idle_ms",
        "1000",
    );
}

#[test]
fn protocol_is_auto_unless_pinned_to_initialize() {
    let c = ok(r#"{"mcpServers": {"a": {"command": "x"}, "b": {"command": "y", "protocol": "2025-11-25"},
        "c": {"command": "z", "protocol": "auto"}}}"#);
    let got = (c.servers["a"].protocol, c.servers["b"].protocol, c.servers["c"].protocol);
    assert_eq!(got, (Protocol::Auto, Protocol::Initialize, Protocol::Auto));
    rejects(
        r#"{"mcpServers": {"m": {"command": "x", "protocol": "2026-07-28"}}}"#,
        "mcpServers.m.protocol",
        "not a way to start a connection",
    );
}

/// What is at the path must be a regular file of at most `MAX_CONFIG_BYTES`: a FIFO is
/// refused without waiting for a writer, a folder is named as one, and a huge file is
/// read no further than its bound.
#[test]
fn only_a_regular_file_within_its_bound_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |path: &Path| {
        let text = load(path).expect_err("refused").to_string();
        assert!(text.contains(&path.display().to_string()) && text.contains("hint: "), "{text}");
        text
    };
    let fifo = dir.path().join("fifo.json");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    assert!(refused(&fifo).contains("not a regular file"));
    assert!(refused(dir.path()).contains("a folder"));
    let huge = dir.path().join("huge.json");
    let file = std::fs::File::create(&huge).unwrap();
    file.set_len(MAX_CONFIG_BYTES + 1).unwrap();
    assert!(refused(&huge).contains("larger than 4 MiB"));
    file.set_len(MAX_CONFIG_BYTES).unwrap();
    assert!(matches!(load(&huge), Err(ConfigError::Syntax { .. })), "one at the bound is read");
}
