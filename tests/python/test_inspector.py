"""The MCP Inspector's CLI against a cold gateway: each run starts `rebound serve` and sends
its one request right after `initialize`, before the servers behind it are up. Every
request kind waits for them, as `tools/list` does."""

import json
import os
import subprocess

import pytest

from conftest import BIN, EVERYTHING, ROOT

NODE_BIN = ROOT / "tests" / "node" / "node_modules" / ".bin"


def inspect(config, *method):
    # The CLI looks for its own package.json relative to the working directory.
    result = subprocess.run(
        [str(NODE_BIN / "mcp-inspector-cli"), "--cli", *method, "--", str(BIN / "rebound"), "serve", "--config", str(config)],
        cwd=ROOT / "tests" / "node" / "node_modules",
        env={**os.environ, "PATH": f"{NODE_BIN}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout[result.stdout.index("{") :])


@pytest.fixture
def cold_config(tmp_path):
    path = tmp_path / "rebound.json"
    path.write_text(json.dumps({"mcpServers": {"everything": {"command": str(EVERYTHING)}}}))
    return path


def test_prompts_get_on_a_cold_gateway(cold_config):
    answer = inspect(cold_config, "--method", "prompts/get", "--prompt-name", "simple-prompt")
    assert answer["messages"][0]["content"]["text"] == "This is a simple prompt without arguments."


def test_resources_read_on_a_cold_gateway(cold_config):
    uri = "demo://resource/static/document/architecture.md"
    answer = inspect(cold_config, "--method", "resources/read", "--uri", uri)
    assert answer["contents"][0]["uri"] == uri
    assert "Architecture" in answer["contents"][0]["text"]


def test_tools_call_on_a_cold_gateway(cold_config):
    # `--tool-arg` takes every word after it: it goes first.
    answer = inspect(cold_config, "--tool-arg", "message=cold", "--tool-name", "echo", "--method", "tools/call")
    assert answer["content"][0]["text"] == "Echo: cold"
