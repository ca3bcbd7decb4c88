"""A server on the official Python SDK, which speaks MCP 2026-07-28 (and older
revisions): it says which revision each request came on, and asks its client for a name
by elicitation, which on 2026-07-28 is an `InputRequiredResult`."""

import sys
import time
from typing import Annotated

from pydantic import BaseModel

from mcp.server.mcpserver import Context, MCPServer, Resolve
from mcp.server.mcpserver.resolve import Elicit
from mcp_types import ElicitRequest, ElicitRequestFormParams, InputRequiredResult

server = MCPServer("modern")


@server.tool()
def revision(ctx: Context) -> str:
    """The protocol revision this request came on."""
    return f"revision: {ctx.protocol_version}"


class Name(BaseModel):
    name: str


def ask_name() -> Elicit[Name]:
    return Elicit("Your name?", Name)


@server.tool()
def greet(name: Annotated[Name, Resolve(ask_name)]) -> str:
    """Asks the client for a name, then greets it."""
    return f"hello, {name.name}"


def asked_name(ctx: Context, purpose: str) -> str | InputRequiredResult:
    """The name the client gave, or the question for it: a prompt and a resource ask
    with an `InputRequiredResult` of their own, and check that their state came back."""
    answer = (ctx.input_responses or {}).get("name")
    if answer is None:
        question = ElicitRequest(
            params=ElicitRequestFormParams(
                message="Your name?",
                requested_schema={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
            )
        )
        return InputRequiredResult(input_requests={"name": question}, request_state=purpose)
    if ctx.request_state != purpose:
        raise ValueError(f"the state came back as {ctx.request_state!r}, not {purpose!r}")
    content = answer.content if hasattr(answer, "content") else answer["content"]
    return content["name"]


@server.prompt()
def introduce(ctx: Context) -> str | InputRequiredResult:
    """Asks the client for a name, then introduces it."""
    name = asked_name(ctx, "prompt")
    return name if isinstance(name, InputRequiredResult) else f"This is {name}."


@server.resource("card://{kind}")
def card(kind: str, ctx: Context) -> str | InputRequiredResult:
    """Asks the client for a name, then writes it on a card."""
    name = asked_name(ctx, "resource")
    return name if isinstance(name, InputRequiredResult) else f"{kind} card for {name}"


@server.resource("note://modern")
def note() -> str:
    """A resource whose updates `touch` announces."""
    return "a note"


@server.tool()
async def touch(ctx: Context) -> str:
    """Announces that `note://modern` was updated, to the listen requests that follow it."""
    await ctx.notify_resource_updated("note://modern")
    return "touched"


if __name__ == "__main__":
    # `--start-delay SECONDS`: a slow start, read nothing before it is over.
    if "--start-delay" in sys.argv:
        time.sleep(float(sys.argv[sys.argv.index("--start-delay") + 1]))
    # `--http PORT`: on its own streamable HTTP, answering each request with JSON.
    if "--http" in sys.argv:
        server.run("streamable-http", port=int(sys.argv[sys.argv.index("--http") + 1]), json_response=True)
    else:
        server.run("stdio")
