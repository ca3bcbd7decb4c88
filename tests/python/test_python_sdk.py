"""The official Python MCP SDK as the client, through the gateway, to real servers."""

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from conftest import BIN


def params(config):
    return StdioServerParameters(command=str(BIN / "rebound"), args=["serve", "--config", str(config)])


def text(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")


async def run(config, body):
    with anyio.fail_after(60):
        async with stdio_client(params(config)) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await body(session)


def test_lists_and_calls_server_everything_through_the_gateway(gateway_config):
    config, _ = gateway_config

    async def body(session):
        tools = {t.name: t for t in (await session.list_tools()).tools}
        # Both servers publish `echo`, so both are prefixed; the rest keep their names.
        assert "everything__echo" in tools and "faulty__echo" in tools
        assert "get-sum" in tools and "hang" in tools
        assert tools["get-sum"].annotations.read_only_hint is True
        assert set(tools["get-sum"].input_schema["properties"]) == {"a", "b"}
        result = await session.call_tool("everything__echo", {"message": "hello"})
        assert not result.is_error
        assert text(result) == "Echo: hello"
        result = await session.call_tool("get-sum", {"a": 2, "b": 40})
        assert "42" in text(result)

    anyio.run(run, config, body)


def test_crash_and_hang_come_back_as_results_and_the_server_recovers(gateway_config):
    config, state = gateway_config

    async def body(session):
        crashed = await session.call_tool("crash", {})
        assert crashed.is_error
        assert "connection lost" in text(crashed)
        # It may have run before the crash: partial, not failed.
        assert crashed.meta["rebound"]["status"] == "partial"
        hung = await session.call_tool("hang", {})
        assert hung.is_error
        assert "no answer within 500 ms" in text(hung)
        again = await session.call_tool("faulty__echo", {"message": "back"})
        assert not again.is_error
        assert text(again) == "faulty: back"
        # Every fifth call of `flaky` aborts with -32001; the gateway retries it.
        results = [await session.call_tool("flaky", {"q": str(i)}) for i in range(5)]
        assert not any(r.is_error for r in results)
        recovered = [r for r in results if r.meta and r.meta.get("rebound", {}).get("status") == "recovered"]
        assert len(recovered) == 1
        assert recovered[0].meta["rebound"]["attempts"][0]["outcome"] == "rpc_error"

    anyio.run(run, config, body)
    assert len((state / "starts").read_text().split()) == 2, "exactly one restart"
