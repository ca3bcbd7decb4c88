"""Shared set-up for the tests that drive the gateway with the official Python MCP SDK."""

import contextlib
import json
import os
import pathlib
import re
import socket
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("REBOUND_BIN_DIR", ROOT / "target" / "debug"))
EVERYTHING = ROOT / "tests" / "node" / "node_modules" / ".bin" / "mcp-server-everything"


@pytest.fixture
def gateway_config(tmp_path):
    """Writes a gateway config in front of server-everything and a fault-injecting server."""
    assert (BIN / "rebound").exists(), f"build first: {BIN / 'rebound'} is missing"
    assert EVERYTHING.exists(), "run `cargo xtask setup` to install server-everything"
    config = {
        "mcpServers": {
            "everything": {"command": str(EVERYTHING)},
            "faulty": {
                "command": str(BIN / "faulty-server"),
                "args": ["--name", "faulty", "--state", str(tmp_path / "state")],
                "recovery": {"tools": {"hang": {"timeout_ms": 500}}, "retry": {"initial_delay_ms": 10}},
            },
        },
        "rebound": {"restart": {"initial_delay_ms": 100}},
    }
    path = tmp_path / "rebound.json"
    path.write_text(json.dumps(config))
    return path, tmp_path / "state"


def gateway_env():
    """This environment without what would change what a test sees of the gateway: its
    log filter and its tokens (which win over the configuration file)."""
    unset = {"REBOUND_LOG", "REBOUND_AUTH_TOKEN", "REBOUND_OPERATOR_TOKEN"}
    return {k: v for k, v in os.environ.items() if k not in unset}


@contextlib.contextmanager
def serve_http(config, log, token):
    """Runs `rebound serve --http` on a free loopback port; yields its /mcp URL and pid."""
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            [str(BIN / "rebound"), "serve", "--config", str(config), "--http", "127.0.0.1:0"],
            stderr=sink,
            env={**gateway_env(), "REBOUND_AUTH_TOKEN": token},
        )
    try:
        deadline = time.monotonic() + 30
        url = None
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            found = re.search(r"listening on (http://\S+/mcp)", log.read_text())
            url = found.group(1) if found else time.sleep(0.05)
        assert url, f"the gateway never said where it listens:\n{log.read_text()}"
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        print(log.read_text())


def listening(port):
    """Whether something accepts connections on loopback `port`."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


@contextlib.contextmanager
def server_on_a_port(argv, env=None):
    """Runs a server on its own streamable HTTP on a free loopback port (`{port}` in
    `argv` and in `env`'s values is that port) until it listens; yields its /mcp URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    def fill(value):
        return str(value).replace("{port}", str(port))

    env = {**os.environ, **{name: fill(value) for name, value in (env or {}).items()}}
    proc = subprocess.Popen([fill(a) for a in argv], env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not listening(port):
            assert proc.poll() is None, f"the server exited ({proc.returncode}) before it listened"
            assert time.monotonic() < deadline, "the server never listened"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=15)
