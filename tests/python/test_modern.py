"""MCP 2026-07-28 through the gateway, with the official Python SDK on both sides: each
side negotiates its own revision (a client on 2026-07-28 or on 2025-11-25, a server
that speaks 2026-07-28 and one that does not), over stdio and streamable HTTP."""

import json
import sys

import anyio
import pytest
from mcp import Client, StdioServerParameters, types
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from conftest import BIN, EVERYTHING, serve_http, server_on_a_port

MODERN = str(__import__("pathlib").Path(__file__).with_name("modern_server.py"))
TOKEN = "test-token-modern-0123456789"


@pytest.fixture
def config(tmp_path):
    """A server on 2026-07-28 (the Python SDK's) beside one that only initialises."""
    config = {
        "mcpServers": {
            "modern": {"command": sys.executable, "args": [MODERN]},
            "faulty": {"command": str(BIN / "faulty-server"), "args": ["--name", "faulty", "--state", str(tmp_path / "state")]},
        }
    }
    path = tmp_path / "rebound.json"
    path.write_text(json.dumps(config))
    return path


def text(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")


async def name_please(context, params):
    return types.ElicitResult(action="accept", content={"name": "Ada"})


def stdio(config):
    return StdioServerParameters(command=str(BIN / "rebound"), args=["serve", "--config", str(config)])


async def exercised(client):
    """Lists, calls the 2026-07-28 server (one call of which the client answers questions
    for), and hears a list change of the older server on a `subscriptions/listen` request."""
    tools = {t.name for t in (await client.list_tools()).tools}
    assert {"revision", "greet", "toggle_tool"} <= tools and "extra" not in tools
    # The gateway reached the server on 2026-07-28 too.
    assert text(await client.call_tool("revision", {})) == "revision: 2026-07-28"
    # The server's `InputRequiredResult` reaches the client as it is; the client's second
    # call, with its answers and the server's state, reaches the server.
    greeted = await client.call_tool("greet", {})
    assert not greeted.is_error, text(greeted)
    assert text(greeted) == "hello, Ada"
    async with client.listen(tools_list_changed=True) as changes:
        assert not (await client.call_tool("toggle_tool", {})).is_error
        with anyio.fail_after(10):
            async for event in changes:
                break
    assert "extra" in {t.name for t in (await client.list_tools()).tools}
    # A prompt and a resource ask too: their questions pass the same way.
    await prompt_and_resource_answered(client)
    # What each connection upstream negotiated, for the operator.
    status = (await client.call_tool("rebound_status", {})).structured_content
    revisions = {s["name"]: s["protocol"] for s in status["servers"]}
    assert revisions["modern"] == "2026-07-28"
    assert revisions["faulty"] != "2026-07-28", revisions


async def prompt_and_resource_answered(client):
    """`prompts/get` and `resources/read` of a server that asks the client for a name
    first (with its own `requestState`, which must come back)."""
    prompt = await client.get_prompt("introduce", {})
    assert [m.content.text for m in prompt.messages] == ["This is Ada."]
    card = await client.read_resource("card://birthday")
    assert [c.text for c in card.contents] == ["birthday card for Ada"]


def test_a_2026_client_over_stdio_negotiates_it_through_the_gateway(config):
    async def main():
        with anyio.fail_after(60):
            async with Client(stdio(config), mode="auto", elicitation_callback=name_please) as client:
                assert client.protocol_version == "2026-07-28"
                await exercised(client)

    anyio.run(main)


def test_a_2026_server_on_its_own_http_answering_with_json_is_reached_as_a_url(tmp_path):
    """The same server on its own streamable HTTP (`url`), each answer a JSON body, not
    SSE: everything above holds through it."""
    with server_on_a_port([sys.executable, MODERN, "--http", "{port}"]) as url:
        faulty = [str(BIN / "faulty-server"), "--name", "faulty", "--state", str(tmp_path / "state")]
        servers = {"modern": {"url": url}, "faulty": {"command": faulty[0], "args": faulty[1:]}}
        path = tmp_path / "rebound.json"
        path.write_text(json.dumps({"mcpServers": servers}))

        async def main():
            with anyio.fail_after(60):
                async with Client(stdio(path), mode="auto", elicitation_callback=name_please) as client:
                    await exercised(client)

        anyio.run(main)


def test_a_2026_client_over_http_negotiates_it_through_the_gateway(config, tmp_path):
    async def main(url):
        with anyio.fail_after(60):
            async with create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                async with Client(
                    streamable_http_client(url, http_client=http), mode="auto", elicitation_callback=name_please
                ) as client:
                    assert client.protocol_version == "2026-07-28"
                    await exercised(client)

    with serve_http(config, tmp_path / "rebound.log", TOKEN) as (url, _):
        anyio.run(main, url)


async def sampled(context, params):
    asked = params.messages[0].content.text
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text=f"a poem, as asked by {asked!r}"), model="test"
    )


async def rooted(context):
    return types.ListRootsResult(roots=[types.Root(uri="file:///work/ada")])


def asked_client(transport):
    """A 2026-07-28 client that can answer every question a server may ask."""
    return Client(
        transport, mode="auto", elicitation_callback=name_please, sampling_callback=sampled, list_roots_callback=rooted
    )


async def older_server_asks(client, at_once):
    """faulty-server speaks only revisions before 2026-07-28, and asks its client with
    requests of its own while it serves a call: through the gateway they reach a client on
    2026-07-28 as questions in the call's answer, and its answers go back to the server.
    With `at_once`, several calls ask at the same time (over HTTP, where a 2026-07-28
    client has no session, a stdio server's request during calls of several requests
    cannot be told apart: it goes to none)."""
    heard = []

    async def progress(done, total, message):
        heard.append(message)

    elicited = await client.call_tool("elicit", {"progress": True}, progress_callback=progress)
    assert not elicited.is_error, text(elicited)
    assert '"name":"Ada"' in text(elicited).replace(" ", ""), text(elicited)
    # The call's progress reaches the request waiting for it: the first before the
    # question, the one that came back with the answer after it.
    assert heard == ["asking", "answered"], heard
    poem = await client.call_tool("sample", {"prompt": "a poem please"})
    assert "a poem, as asked by 'a poem please'" in text(poem), text(poem)
    # A prompt's request asks too.
    greeting = await client.get_prompt("greet", {"who": "Ada", "ask": "roots"})
    assert "file:///work/ada" in greeting.messages[0].content.text, greeting
    if not at_once:
        return
    calls = {}

    async def one(n):
        calls[n] = await client.call_tool("sample", {"prompt": f"poem {n}"})

    async with anyio.create_task_group() as tg:
        for n in range(4):
            tg.start_soon(one, n)
    for n, result in calls.items():
        assert f"as asked by 'poem {n}'" in text(result), text(result)


def test_a_2026_client_answers_an_older_servers_requests_through_the_gateway(config, tmp_path):
    async def over_stdio():
        with anyio.fail_after(60):
            async with asked_client(stdio(config)) as client:
                assert client.protocol_version == "2026-07-28"
                await older_server_asks(client, at_once=True)

    async def over_http(url):
        with anyio.fail_after(60):
            async with create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                async with asked_client(streamable_http_client(url, http_client=http)) as client:
                    assert client.protocol_version == "2026-07-28"
                    await older_server_asks(client, at_once=False)

    anyio.run(over_stdio)
    with serve_http(config, tmp_path / "rebound.log", TOKEN) as (url, _):
        anyio.run(over_http, url)


def test_server_everything_samples_and_elicits_from_a_2026_client_through_the_gateway(tmp_path):
    """A server people run (server-everything, on 2025-11-25) offers its sampling and
    elicitation tools to a 2026-07-28 client that can answer them, and they work."""
    path = tmp_path / "rebound.json"
    path.write_text(json.dumps({"mcpServers": {"everything": {"command": str(EVERYTHING)}}}))

    async def main():
        with anyio.fail_after(60):
            async with asked_client(stdio(path)) as client:
                tools = {t.name for t in (await client.list_tools()).tools}
                assert {"trigger-sampling-request", "trigger-elicitation-request"} <= tools, tools
                poem = await client.call_tool("trigger-sampling-request", {"prompt": "a haiku"})
                assert not poem.is_error and "a poem, as asked by" in text(poem), text(poem)
                form = await client.call_tool("trigger-elicitation-request", {})
                assert not form.is_error and "Ada" in text(form), text(form)

    anyio.run(main)


def test_an_older_client_answers_a_2026_servers_question_through_the_gateway(config):
    """The server asks with an `InputRequiredResult` (for a tool call, a prompt and a
    resource); the gateway asks the client with `elicitation/create`, as its revision
    knows it, and asks the server again."""

    async def main():
        with anyio.fail_after(60):
            async with Client(stdio(config), mode="legacy", elicitation_callback=name_please) as client:
                assert client.protocol_version == "2025-11-25"
                result = await client.call_tool("greet", {})
                assert not result.is_error, text(result)
                assert text(result) == "hello, Ada"
                await prompt_and_resource_answered(client)

    anyio.run(main)


def test_a_2026_servers_resource_updates_reach_clients_of_either_revision(config, tmp_path):
    """A server on 2026-07-28 says a resource was updated only on a listen request that
    follows it: the gateway opens one when a client subscribes (with
    `resources/subscribe` on 2025-11-25, or its own listen request on 2026-07-28)."""

    async def legacy():
        updated = anyio.Event()

        async def on_message(message):
            if getattr(message, "method", None) == "notifications/resources/updated":
                assert message.params.uri == "note://modern"
                updated.set()

        with anyio.fail_after(60):
            async with Client(stdio(config), mode="legacy", message_handler=on_message) as client:
                # The subscription is made upstream before the answer.
                await client.subscribe_resource("note://modern")
                assert text(await client.call_tool("touch", {})) == "touched"
                await updated.wait()
                # Each resource followed is a request kept open on the server: at most 256.
                for i in range(255):
                    await client.subscribe_resource(f"card://{i}")
                with pytest.raises(Exception, match="at most 256 resources"):
                    await client.subscribe_resource("card://one-too-many")

    async def modern(transport):
        with anyio.fail_after(60):
            async with Client(transport, mode="auto") as client:
                # The first request, on a cold gateway: the acknowledgement waits for the
                # servers' first start, so it can honour their resources.
                async with client.listen(resource_subscriptions=["note://modern"]) as sub:
                    assert list(sub.honored.resource_subscriptions) == ["note://modern"]
                    # rmcp acknowledges the listen before the gateway follows the resource
                    # upstream: once it does, the resource is announced as updated, since
                    # an update in between was not heard.
                    with anyio.fail_after(10):
                        async for event in sub:
                            assert event.uri == "note://modern", event
                            break
                    # From then on, every update is heard.
                    assert text(await client.call_tool("touch", {})) == "touched"
                    with anyio.fail_after(10):
                        async for event in sub:
                            assert event.uri == "note://modern", event
                            break

    async def modern_over_http(url):
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            await modern(streamable_http_client(url, http_client=http))

    anyio.run(legacy)
    anyio.run(modern, stdio(config))
    # Over HTTP the servers start with the gateway; this one is slow to start, and the
    # client's listen comes before its first start is over.
    slow = json.loads(config.read_text())
    slow["mcpServers"]["modern"]["args"] += ["--start-delay", "2"]
    config.write_text(json.dumps(slow))
    with serve_http(config, tmp_path / "rebound.log", TOKEN) as (url, _):
        anyio.run(modern_over_http, url)


def test_a_listen_request_follows_a_bounded_number_of_resources(config):
    """A listen request's filter is the client's to write: the gateway follows at most
    256 resources of one request, each once, and its acknowledgement says which."""

    async def main():
        with anyio.fail_after(60):
            async with Client(stdio(config), mode="auto") as client:
                await client.list_resources()
                asked = ["faulty://faulty/readme"] * 3 + [f"faulty://faulty/items/{i}" for i in range(5000)]
                async with client.listen(resources_list_changed=True, resource_subscriptions=asked) as sub:
                    honored = set(sub.honored.resource_subscriptions)
                    assert "faulty://faulty/readme" in honored
                    assert len(honored) == 256 and "faulty://faulty/items/4999" not in honored
                    assert sub.honored.resources_list_changed

    anyio.run(main)


def test_over_http_a_2026_clients_listen_requests_count_together_against_its_share(config, tmp_path):
    """Over HTTP a client on 2026-07-28 has no session: its listen requests count together,
    by its address, against one client's share (128) of the resources the gateway follows
    on a shared server, which here are `resources/subscribe`s the server records. The
    acknowledgement of its second listen request names only what is left of its share."""
    subscribes = tmp_path / "state" / "subscribes"

    def followed():
        return len(subscribes.read_text().splitlines()) if subscribes.exists() else 0

    async def until_followed(n):
        with anyio.fail_after(20):
            while followed() < n:
                await anyio.sleep(0.05)

    async def main(url):
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            async with Client(streamable_http_client(url, http_client=http), mode="auto") as client:
                first = [f"faulty://faulty/items/{i}" for i in range(100)]
                second = [f"faulty://faulty/items/{i}" for i in range(100, 200)]
                async with client.listen(resource_subscriptions=first) as one:
                    assert list(one.honored.resource_subscriptions) == first
                    await until_followed(100)
                    async with client.listen(resource_subscriptions=first[:5] + second) as two:
                        # What it follows already, and the 28 left of its share.
                        assert list(two.honored.resource_subscriptions) == first[:5] + second[:28]
                        await until_followed(128)
                        await anyio.sleep(1)
                        assert followed() == 128, "nothing more comes"

    with serve_http(config, tmp_path / "rebound.log", TOKEN) as (url, _):
        anyio.run(main, url)
    assert "a client may follow at most 128 resources" not in (tmp_path / "rebound.log").read_text()


def test_a_listen_request_that_ends_lets_go_of_its_resources_on_a_servers_own_instance(tmp_path):
    """A listen request's follows end with it on a `scope: session` server too (they were
    left open on the session's own instance)."""
    state = tmp_path / "state"
    faulty = {"command": str(BIN / "faulty-server"), "args": ["--name", "faulty", "--state", str(state)]}
    path = tmp_path / "rebound.json"
    path.write_text(json.dumps({"mcpServers": {"faulty": {**faulty, "scope": "session"}}}))
    uri = "faulty://faulty/items/1"

    def lines(name):
        return (state / name).read_text().splitlines() if (state / name).exists() else []

    async def main():
        with anyio.fail_after(30):
            async with Client(stdio(path), mode="auto") as client:
                async with client.listen(resource_subscriptions=[uri]):
                    while lines("subscribes") != [uri]:
                        await anyio.sleep(0.05)
                while lines("unsubscribes") != [uri]:
                    await anyio.sleep(0.05)

    anyio.run(main)
