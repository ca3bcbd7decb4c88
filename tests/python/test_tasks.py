"""MCP 2025-11-25 tasks through the gateway, driven by the official TypeScript SDK's client
(`tests/node/tasks-client.mjs`) in front of server-everything over stdio: tasks a client
runs on its servers, and tasks a server asks the client to run."""

import concurrent.futures
import json
import subprocess

from conftest import BIN, EVERYTHING, ROOT, gateway_env, serve_http, server_on_a_port

NODE = ROOT / "tests" / "node" / "node_modules" / ".bin" / "node"
CLIENT = ROOT / "tests" / "node" / "tasks-client.mjs"


TOKEN = "tasks-test-token-0123456789"


def drive(mode, *server):
    done = subprocess.run(
        [str(NODE), str(CLIENT), mode, *map(str, server)],
        capture_output=True,
        text=True,
        timeout=90,
        env={**gateway_env(), "REBOUND_AUTH_TOKEN": TOKEN},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def gateway(tmp_path, **everything):
    config = {
        "mcpServers": {"everything": {"command": str(EVERYTHING), **everything}},
        "rebound": {"errors_log": str(tmp_path / "errors.jsonl"), "restart": {"initial_delay_ms": 100}},
    }
    path = tmp_path / "rebound.json"
    path.write_text(json.dumps(config))
    return [BIN / "rebound", "serve", "--config", path]


def test_the_tasks_capability_and_every_tools_task_support_are_as_a_direct_connection_shows_them(tmp_path):
    direct = drive("list", EVERYTHING)
    through = drive("list", *gateway(tmp_path))
    assert direct["capability"]["requests"]["tools"]["call"] == {}
    assert direct["execution"]["simulate-research-query"] == {"taskSupport": "required"}
    assert through == direct


def test_a_task_augmented_call_completes_through_the_gateway_with_its_question_answered(tmp_path):
    seen = drive("run", *gateway(tmp_path))
    assert seen["error"] is None
    assert seen["types"][0] == "taskCreated" and seen["types"][-1] == "result", seen["types"]
    assert "Research Report: gateways (technical)" in seen["text"]
    # The server asked while the task ran (through `tasks/result`), and was answered.
    assert len(seen["asked"]) == 1 and "multiple interpretations" in seen["asked"][0]
    assert seen["listed"] == [{"taskId": seen["created"]["taskId"], "status": "completed"}]


def test_a_url_servers_tasks_pass_as_a_stdio_servers_do(tmp_path):
    """server-everything reached over its own streamable HTTP (`url`): the tasks
    capability and each tool's task support are as a direct connection shows them, a
    task-augmented call completes, its question answered, its task listed, and the
    requests it asks a client to run as tasks run as they do over stdio."""
    with server_on_a_port([EVERYTHING, "streamableHttp"], env={"PORT": "{port}"}) as url:
        config = {"mcpServers": {"everything": {"url": url}}, "rebound": {"errors_log": str(tmp_path / "errors.jsonl")}}
        path = tmp_path / "rebound.json"
        path.write_text(json.dumps(config))
        through = drive("list", BIN / "rebound", "serve", "--config", path)
        seen = drive("run", BIN / "rebound", "serve", "--config", path)
        # A client that runs sampling and elicitation as tasks: the server is told (in
        # `initialize`, which Rebound posts itself), and its requests with their `task`
        # reach the client as they were sent (rmcp's HTTP client would drop it).
        asked = drive("asked", BIN / "rebound", "serve", "--config", path)
    assert set(ASYNC_TOOLS) <= set(asked["tools"])
    assert_asked_tasks_completed(asked)
    assert through == drive("list", EVERYTHING)
    assert through["execution"]["simulate-research-query"] == {"taskSupport": "required"}
    assert seen["error"] is None, seen
    assert seen["types"][0] == "taskCreated" and seen["types"][-1] == "result", seen["types"]
    assert "Research Report: gateways (technical)" in seen["text"]
    assert len(seen["asked"]) == 1 and "multiple interpretations" in seen["asked"][0]
    assert seen["listed"] == [{"taskId": seen["created"]["taskId"], "status": "completed"}]


def test_a_task_whose_server_is_lost_is_reported_failed_not_lost(tmp_path):
    seen = drive("lose", *gateway(tmp_path))
    task_id = seen["created"]["taskId"]
    assert seen["task"]["status"] == "failed", seen["task"]
    assert "server `everything` stopped" in seen["task"]["statusMessage"]
    assert seen["result"]["isError"] is True
    assert seen["result"]["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
    # The client was told, before it asked, and once.
    assert seen["toldFirst"] is True
    told = [s for s in seen["statuses"] if s["status"] == "failed"]
    assert [s["taskId"] for s in told] == [task_id]
    entries = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
    lost = [e for e in entries if task_id in e["message"]]
    assert [e["context"]["tool_name"] for e in lost] == ["simulate-research-query"], entries
    assert lost[0]["type"] == "mcp_transport" and lost[0]["fix_status"] == "unfixed", lost


def test_a_client_keeps_at_most_256_tasks_at_once_and_is_told_when_it_has_them(tmp_path):
    seen = drive("many", *gateway(tmp_path))
    assert seen["started"] == 256
    assert "256 tasks in progress" in seen["refusal"], seen["refusal"]
    assert seen["listed"] == 256


def test_over_http_tasks_are_offered_and_each_client_sees_only_its_own(tmp_path):
    """Two clients of one gateway, one shared server-everything: the server's own task
    list holds both tasks; each client's holds its own."""
    config = gateway(tmp_path)[-1]
    with serve_http(config, tmp_path / "gateway.log", TOKEN) as (url, _):
        through, direct = drive("list", url), drive("list", EVERYTHING)
        assert through["capability"] == direct["capability"]
        # A shared server is offered no client capabilities over HTTP, so it shows fewer
        # tools; those it shows have their task support.
        assert through["execution"]["simulate-research-query"] == {"taskSupport": "required"}
        assert through["execution"].items() <= direct["execution"].items()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            both = list(pool.map(lambda _: drive("quiet", url), range(2)))
    ids = [seen["created"]["taskId"] for seen in both]
    assert ids[0] != ids[1]
    for seen, own in zip(both, ids):
        assert seen["error"] is None and seen["types"][-1] == "result", seen["types"]
        assert "Research Report: gateways" in seen["text"]
        assert seen["listed"] == [{"taskId": own, "status": "completed"}]
        # The server's status notifications reached the client whose task they are about.
        assert seen["statuses"] and {s["taskId"] for s in seen["statuses"]} == {own}, seen["statuses"]


def test_over_http_a_session_scoped_servers_task_asks_its_own_client(tmp_path):
    config = gateway(tmp_path, scope="session")[-1]
    with serve_http(config, tmp_path / "gateway.log", TOKEN) as (url, _):
        seen = drive("run", url)
    assert seen["error"] is None
    assert len(seen["asked"]) == 1
    assert "Research Report: gateways (technical)" in seen["text"]


def test_a_task_the_client_heard_end_is_not_reported_failed_when_its_server_is_lost(tmp_path):
    """An ended task stays ended: once the server's notification said so, the loss of
    its server makes it unknown, not `failed`, and the client is told nothing more: its
    `tasks/result` is the error `tasks/get` would give, not a result saying it was lost."""
    seen = drive("heard", *gateway(tmp_path))
    assert seen["heard"][-1] == "completed", seen["heard"]
    assert "result" not in seen, seen["result"]
    assert "it ended, and then its server stopped" in seen["resultError"]
    assert "task" not in seen, seen["task"]
    assert "unknown task" in seen["error"], seen["error"]
    assert "failed" not in [s["status"] for s in seen["statuses"]]


def test_a_tasks_progress_reaches_its_client_after_the_call_is_answered(tmp_path):
    """faulty-server runs `slow` as a task and reports its progress while it runs, after
    the call was answered with the task: over stdio and over HTTP, the TypeScript SDK's
    client hears all of it under its own token."""
    config = {
        "mcpServers": {"a": {"command": str(BIN / "faulty-server"), "args": ["--name", "a", "--tasks"]}},
        "rebound": {"errors_log": str(tmp_path / "errors.jsonl")},
    }
    path = tmp_path / "rebound.json"
    path.write_text(json.dumps(config))
    over_stdio = drive("progress", BIN / "rebound", "serve", "--config", path)
    with serve_http(path, tmp_path / "gateway.log", TOKEN) as (url, _):
        over_http = drive("progress", url)
    for seen in (over_stdio, over_http):
        assert seen["types"][0] == "taskCreated" and seen["types"][-1] == "result", seen
        assert seen["text"] == "a: slept 800 ms"
        assert seen["progress"] == [1, 2, 3], seen


ASYNC_TOOLS = ["trigger-elicitation-request-async", "trigger-sampling-request-async"]


def assert_asked_tasks_completed(seen):
    """Each of server-everything's async tools asked the client to run its request as a
    task, polled the client's task through the gateway and fetched its result."""
    assert [a["method"] for a in seen["asked"]] == ["sampling/createMessage", "elicitation/create"]
    sampling, elicitation = seen["texts"]["trigger-sampling-request-async"], seen["texts"]["trigger-elicitation-request-async"]
    assert sampling.startswith("[COMPLETED] Async sampling completed!"), sampling
    assert f"Task created: {seen['asked'][0]['task']}" in sampling and '"text": "sampled"' in sampling
    assert elicitation.startswith("[COMPLETED] User provided the requested information!"), elicitation
    assert f"Task created: {seen['asked'][1]['task']}" in elicitation and "- Name: Ada" in elicitation


def test_a_client_that_runs_requests_as_tasks_is_offered_the_tools_that_need_it_and_runs_them(tmp_path):
    """A client whose `tasks` capability says it runs sampling and elicitation as tasks:
    server-everything offers it two more tools directly, and through the gateway too (the
    capability reaches the server), and each completes through the gateway: the server's
    request with its `task`, the client's task, the server's `tasks/get` and
    `tasks/result` about it."""
    direct = drive("asked", EVERYTHING)
    through = drive("asked", *gateway(tmp_path))
    assert set(ASYNC_TOOLS) <= set(direct["tools"])
    assert through["tools"] == sorted(direct["tools"] + ["rebound_reset_breaker", "rebound_status"])
    assert_asked_tasks_completed(direct)
    assert_asked_tasks_completed(through)


def test_over_http_a_session_scoped_server_is_offered_its_clients_tasks_and_a_shared_one_not(tmp_path):
    """Over HTTP a `session`-scoped server is told what its own client runs as tasks, and
    its async tools complete, for two clients at once; a shared server is told nothing of
    any client's, so it does not offer them (one client's capability is not every
    client's)."""
    config = gateway(tmp_path, scope="session")[-1]
    with serve_http(config, tmp_path / "gateway.log", TOKEN) as (url, _):
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            both = list(pool.map(lambda _: drive("asked", url), range(2)))
    for own in both:
        assert_asked_tasks_completed(own)
    # Each client was asked, and polled, about its own tasks only.
    assert {a["task"] for a in both[0]["asked"]}.isdisjoint({a["task"] for a in both[1]["asked"]})
    shared = tmp_path / "shared"
    shared.mkdir()
    with serve_http(gateway(shared)[-1], tmp_path / "shared.log", TOKEN) as (url, _):
        seen = drive("asked", url)
    assert "echo" in seen["tools"] and not set(ASYNC_TOOLS) & set(seen["tools"])
    assert seen["asked"] == []
