"""The official Python MCP SDK over streamable HTTP: `rebound serve --http` in front of
server-everything, with a bearer token."""

import json
import urllib.error
import urllib.request

import anyio
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from conftest import serve_http

TOKEN = "test-token-0123456789abcdef"


@pytest.fixture
def http_gateway(gateway_config, tmp_path):
    """Starts the gateway on a free loopback port and yields its /mcp URL."""
    config, _ = gateway_config
    with serve_http(config, tmp_path / "rebound.log", TOKEN) as (url, _):
        yield url


def text(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")


async def session_run(url, body, token=TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with anyio.fail_after(60):
        async with create_mcp_http_client(headers=headers) as http:
            async with streamable_http_client(url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return await body(session)


def test_python_sdk_over_http_lists_calls_and_gets_progress(http_gateway, caplog):
    async def body(session):
        tools = {t.name for t in (await session.list_tools()).tools}
        assert {"everything__echo", "get-sum", "rebound_status"} <= tools
        result = await session.call_tool("everything__echo", {"message": "over http"})
        assert text(result) == "Echo: over http"
        seen = []

        async def on_progress(progress, total, message):
            seen.append(progress)

        result = await session.call_tool(
            "trigger-long-running-operation", {"duration": 1, "steps": 3}, progress_callback=on_progress
        )
        assert not result.is_error
        assert len(seen) == 3, seen
        crashed = await session.call_tool("crash", {})
        assert crashed.is_error and "connection lost" in text(crashed)
        prompts = await session.list_prompts()
        assert prompts.prompts
        status = await session.call_tool("rebound_status", {})
        assert json.loads(text(status))["servers"][0]["name"] == "everything"

    anyio.run(session_run, http_gateway, body)
    # The session was ended cleanly when the client closed.
    assert "Session termination failed" not in caplog.text


def test_requests_without_the_token_get_401(http_gateway):
    request = urllib.request.Request(
        http_gateway,
        data=b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    assert refused.value.headers["WWW-Authenticate"].startswith("Bearer")

    request.add_header("Authorization", "Bearer not-the-token-at-all")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    # Health needs no token; it says nothing a stranger could use.
    health = urllib.request.urlopen(http_gateway.replace("/mcp", "/healthz"), timeout=10)
    assert json.load(health) == {"status": "ok"}
