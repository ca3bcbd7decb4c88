"""One gateway, many clients: what a server asks while serving one client's call reaches
that client and no other; `"scope": "session"` gives each client its own server; servers
see the client's real capabilities. Official Python SDK clients, real npm servers."""

import json
import os
import pathlib

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from conftest import BIN, EVERYTHING, ROOT, serve_http

TOKEN = "isolation-token-0123456789abcdef"
MEMORY = ROOT / "tests" / "node" / "node_modules" / ".bin" / "mcp-server-memory"
ROUNDS = 6


def text(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")


def write_config(tmp_path, servers):
    path = tmp_path / "rebound.json"
    path.write_text(json.dumps({"mcpServers": servers, "rebound": {"restart": {"initial_delay_ms": 100}}}))
    return path


def answering_as(who):
    """Callbacks that answer every server request with `who`'s name in it."""

    async def sampling(context, params):
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=f"sampled by {who}"), model=who
        )

    async def elicitation(context, params):
        return types.ElicitResult(action="accept", content={"name": who})

    async def roots(context):
        return types.ListRootsResult(roots=[types.Root(uri=f"file:///home/{who}", name=who)])

    return {"sampling_callback": sampling, "elicitation_callback": elicitation, "list_roots_callback": roots}


async def http_session(url, body, token=TOKEN, **callbacks):
    headers = {"Authorization": f"Bearer {token}"}
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write, **callbacks) as session:
                await session.initialize()
                return await body(session)


async def alice_and_bob(url, rounds):
    """Two clients at once, each answering server requests with its own name, each
    running `rounds(who, session)`."""

    async def client(who):
        await http_session(url, lambda s: rounds(who, s), **answering_as(who))

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(client, "alice")
            tg.start_soon(client, "bob")


def children(pid):
    """The command lines of `pid`'s descendants."""
    parents = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for child, p in parents.items():
            if p == parent:
                frontier.append(child)
                try:
                    found.append((pathlib.Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")).decode())
                except OSError:
                    pass
    return found


def test_two_http_clients_each_answer_only_their_own_server_requests(tmp_path):
    """server-everything with one instance per session: over many concurrent rounds,
    every sampling, elicitation and roots answer comes from the client that called."""
    config = write_config(tmp_path, {"everything": {"command": str(EVERYTHING), "scope": "session"}})
    seen = {"alice": [], "bob": []}

    async def rounds(who, session):
        for i in range(ROUNDS):
            async with anyio.create_task_group() as tg:

                async def one(tool, args):
                    result = await session.call_tool(tool, args)
                    seen[who].append((tool, result.is_error, text(result)))

                tg.start_soon(one, "trigger-sampling-request", {"prompt": f"{who} {i}"})
                tg.start_soon(one, "trigger-elicitation-request", {})
                tg.start_soon(one, "get-roots-list", {})

    with serve_http(config, tmp_path / "rebound.log", TOKEN) as (url, _):
        anyio.run(alice_and_bob, url, rounds)
    for who, other in (("alice", "bob"), ("bob", "alice")):
        assert len(seen[who]) == 3 * ROUNDS
        for tool, is_error, answer in seen[who]:
            assert not is_error, (who, tool, answer)
            assert who in answer, (who, tool, answer)
            assert other not in answer, f"{who} saw {other}'s answer through {tool}: {answer}"


def test_a_shared_server_never_shows_one_client_another_clients_request(tmp_path):
    """A stdio server shared by two clients cannot say which call its sampling request
    belongs to. Rebound may refuse it (calls of both clients in flight), but never sends
    it to the wrong client."""
    faulty = [str(BIN / "faulty-server"), "--name", "shared", "--state", str(tmp_path / "state")]
    config = write_config(tmp_path, {"shared": {"command": faulty[0], "args": faulty[1:]}})
    seen = {"alice": [], "bob": []}

    async def rounds(who, session):
        for i in range(ROUNDS * 2):
            result = await session.call_tool("sample", {"prompt": f"{who} {i}"})
            seen[who].append(text(result))

    async def both(url):
        with anyio.fail_after(120):
            await alice_and_bob(url, rounds)
            # Alone on the server, a client's request is unambiguous again.
            alone = await http_session(url, lambda s: s.call_tool("sample", {"prompt": "alone"}), **answering_as("carol"))
            return text(alone)

    with serve_http(config, tmp_path / "rebound.log", TOKEN) as (url, _):
        alone = anyio.run(both, url)
    assert "sampled by carol" in alone, alone
    for who, other in (("alice", "bob"), ("bob", "alice")):
        assert len(seen[who]) == ROUNDS * 2
        for answer in seen[who]:
            assert other not in answer, f"{who} saw {other}'s answer: {answer}"
            assert f"sampled by {who}" in answer or "several clients" in answer, answer


def test_a_shared_servers_late_request_reaches_no_client_after_a_call_was_given_up(tmp_path):
    """A stdio server may go on serving a call after the gateway gave up on it (here its
    time ran out) and only then ask for sampling. Another client's call is in flight at
    that moment, and the server cannot say which call it serves: the request is refused,
    never shown to the client now in flight."""
    state = tmp_path / "state"
    faulty = [str(BIN / "faulty-server"), "--name", "shared", "--state", str(state)]
    recovery = {"tools": {"sample_late": {"timeout_ms": 300}}}
    config = write_config(tmp_path, {"shared": {"command": faulty[0], "args": faulty[1:], "recovery": recovery}})
    asked = {"alice": 0, "bob": 0}

    def counting(who):
        async def sampling(context, params):
            asked[who] += 1
            return types.CreateMessageResult(
                role="assistant", content=types.TextContent(type="text", text=f"sampled by {who}"), model=who
            )

        return {"sampling_callback": sampling}

    async def both(url):
        results = {}
        given_up = anyio.Event()

        async def alice(session):
            results["alice"] = await session.call_tool("sample_late", {"ms": 1200})
            given_up.set()

        async def bob(session):
            await given_up.wait()  # alice's call has ended unanswered; her server goes on
            results["bob"] = await session.call_tool("slow", {"ms": 2000})

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: http_session(url, alice, **counting("alice")))
                tg.start_soon(lambda: http_session(url, bob, **counting("bob")))
        return results

    with serve_http(config, tmp_path / "rebound.log", TOKEN) as (url, _):
        results = anyio.run(both, url)
    assert results["alice"].is_error, text(results["alice"])
    assert not results["bob"].is_error, text(results["bob"])
    assert asked == {"alice": 0, "bob": 0}, f"a client was asked what another's call asked: {asked}"
    late = (state / "late").read_text()
    assert "ended unanswered" in late, late


def test_session_scope_keeps_each_clients_memory_apart_and_ends_with_the_session(tmp_path):
    """server-memory, one instance (and one file) per client session: two clients'
    entities never mix, and a session's process stops when its session ends."""
    store = tmp_path / "memory"
    store.mkdir()
    config = write_config(
        tmp_path,
        {
            "memory": {
                "command": str(MEMORY),
                "scope": "session",
                "env": {"MEMORY_FILE_PATH": str(store / "${REBOUND_SESSION}.jsonl")},
            }
        },
    )

    async def remember(session, who):
        entity = {"name": f"{who}-secret", "entityType": "person", "observations": [f"{who} likes tea"]}
        created = await session.call_tool("create_entities", {"entities": [entity]})
        assert not created.is_error, text(created)
        await anyio.sleep(0.2)
        graph = text(await session.call_tool("read_graph", {}))
        return graph

    async def both(url, pid):
        with anyio.fail_after(120):
            graphs = {}

            async def client(who):
                async def body(session):
                    graphs[who] = await remember(session, who)
                    return children(pid)

                graphs[who + "-children"] = await http_session(url, body)

            async with anyio.create_task_group() as tg:
                tg.start_soon(client, "alice")
                tg.start_soon(client, "bob")
            return graphs

    with serve_http(config, tmp_path / "rebound.log", TOKEN) as (url, pid):
        graphs = anyio.run(both, url, pid)
        assert "alice-secret" in graphs["alice"] and "bob-secret" not in graphs["alice"], graphs["alice"]
        assert "bob-secret" in graphs["bob"] and "alice-secret" not in graphs["bob"], graphs["bob"]
        assert any("mcp-server-memory" in c for c in graphs["alice-children"]), graphs["alice-children"]
        assert len(list(store.iterdir())) == 2
        # Both sessions ended when their clients closed: their servers stop.
        deadline = anyio.run(_wait_without, pid, "mcp-server-memory")
        assert deadline, children(pid)


async def _wait_without(pid, needle):
    with anyio.move_on_after(15):
        while any(needle in c for c in children(pid)):
            await anyio.sleep(0.1)
        return True
    return False


def stdio_tools(command, args, **callbacks):
    async def run():
        with anyio.fail_after(60):
            params = StdioServerParameters(command=command, args=args, env={**os.environ})
            async with stdio_client(params) as (read, write):
                async with ClientSession(read, write, **callbacks) as session:
                    await session.initialize()
                    return sorted(t.name for t in (await session.list_tools()).tools)

    return anyio.run(run)


@pytest.mark.parametrize("capable", [False, True], ids=["no-capabilities", "every-capability"])
def test_a_client_sees_the_tools_it_would_see_directly(tmp_path, capable):
    """server-everything registers some tools only for clients that can sample, elicit
    or give roots: through Rebound over stdio, a client gets exactly the tool set a direct
    connection gives it."""
    callbacks = answering_as("carol") if capable else {}
    direct = stdio_tools(str(EVERYTHING), [], **callbacks)
    config = write_config(tmp_path, {"everything": {"command": str(EVERYTHING)}})
    through = stdio_tools(str(BIN / "rebound"), ["serve", "--config", str(config)], **callbacks)
    ours = {"rebound_status", "rebound_reset_breaker"}
    assert [t for t in through if t not in ours] == direct
    assert ("trigger-sampling-request" in direct) == capable
