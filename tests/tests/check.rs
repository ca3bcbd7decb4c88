//! `rebound check`: bad configurations are reported with the file, the key and the fix.

use std::process::Command;

use rebound_tests::bin;

fn check(json: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rebound.json");
    std::fs::write(&path, json).unwrap();
    let out = Command::new(bin("rebound")).args(["check", "--config"]).arg(&path).output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn a_good_config_is_summarised() {
    let (ok, out) = check(r#"{"mcpServers": {"fs": {"command": "sh", "args": ["-y", "server"]}}}"#);
    assert!(ok, "{out}");
    assert!(out.contains("fs: stdio: sh -y server") && out.ends_with("ok\n"), "{out}");
    assert!(!out.contains("warning"), "{out}");
}

/// A secret put in the arguments through a variable is not printed (CI logs keep what
/// `rebound check` prints).
#[test]
fn a_secret_in_the_arguments_is_not_printed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rebound.json");
    std::fs::write(&path, r#"{"mcpServers": {"gh": {"command": "sh", "args": ["--token", "${GITHUB_TOKEN}"]}}}"#)
        .unwrap();
    let out = Command::new(bin("rebound"))
        .args(["check", "--config"])
        .arg(&path)
        .env("GITHUB_TOKEN", "ghp_not_for_ci_logs_123")
        .output()
        .unwrap();
    let out = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.contains("gh: stdio: sh --token"), "{out}");
    assert!(!out.contains("ghp_not_for_ci_logs_123"), "{out}");
}

#[test]
fn a_command_that_is_not_installed_is_warned_about() {
    let (ok, out) = check(
        r#"{"mcpServers": {
            "gone": {"command": "mcp-server-that-is-not-installed"},
            "moved": {"command": "/nonexistent/bin/server"},
            "narrow": {"command": "npx", "env": {"PATH": "/nonexistent"}}
        }}"#,
    );
    // A warning, not an error: it may be installed before `serve` runs.
    assert!(ok, "{out}");
    assert!(out.contains("mcpServers.gone.command: `mcp-server-that-is-not-installed` is not found on PATH"), "{out}");
    assert!(out.contains("mcpServers.moved.command: /nonexistent/bin/server is not an executable file"), "{out}");
    // Looked up on the PATH the server will have.
    assert!(out.contains("mcpServers.narrow.command: `npx` is not found on PATH"), "{out}");
}

/// A key Rebound does not know (a typo) and a disabled server are warned about in the
/// report, on stdout, not only in the log; a key's name, or a command, is shown, not obeyed.
#[test]
fn an_unknown_key_and_a_disabled_server_are_warned_about_in_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rebound.json");
    std::fs::write(
        &path,
        r#"{"mcpServers": {"a": {"command": "sh", "tmeout_ms": 5}, "b": {"command": "sh", "disabled": true},
                "c": {"command": "x\u001b]0;title\u0007"}},
            "x\u001b[2J\nforged": 1}"#,
    )
    .unwrap();
    let out = Command::new(bin("rebound")).args(["check", "--config"]).arg(&path).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("warning: ") && stdout.contains("`mcpServers.a.tmeout_ms` is not a key Rebound knows"),
        "{stdout}"
    );
    assert!(stdout.contains("`mcpServers.b` is disabled"), "{stdout}");
    // A key's name is quoted as it is, with what a terminal would obey written out.
    assert!(stdout.contains("`x\\u{1b}[2J\\nforged` is not a key Rebound reads"), "{stdout}");
    assert!(stdout.contains("c: stdio: x\\u{1b}]0;title\\u{7}"), "so is a command: {stdout}");
    assert!(!stdout.contains('\u{1b}') && !stdout.contains("\nforged"), "{stdout}");
    assert!(stdout.ends_with("ok\n"), "{stdout}");
}

#[test]
fn broken_configs_name_the_file_the_key_and_the_fix() {
    for (json, needles) in [
        ("{\"mcpServers\": {\n  \"a\": {\"command\": \"x\",}\n}}", &["rebound.json:2:", "not valid JSON"][..]),
        (
            r#"{"mcpServers": {"a": {"args": []}}}"#,
            &["`mcpServers.a`", "neither `command` nor `url`", "hint: add \"command\""],
        ),
        (
            r#"{"mcpServers": {"a": {"command": "x", "adapter": "lean-fallback"}}}"#,
            &["`mcpServers.a.adapter`", "unknown adapter", "cargo xtask build-plugins"],
        ),
    ] {
        let (ok, out) = check(json);
        assert!(!ok, "accepted: {json}");
        for needle in needles {
            assert!(out.contains(needle), "{needle:?} not in {out}");
        }
    }
    let (ok, out) = check("");
    assert!(!ok && out.contains("not valid JSON"), "{out}");
    let out = Command::new(bin("rebound")).args(["check", "--config", "/nonexistent.json"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read config file /nonexistent.json"));
}
