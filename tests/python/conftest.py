"""Shared set-up for the tests that drive the gateway with the official Python MCP SDK."""

import json
import os
import pathlib

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
