"""A server on the official Python SDK, which speaks MCP 2026-07-28 (and older
revisions): it says which revision each request came on, and asks its client for a name
by elicitation, which on 2026-07-28 is an `InputRequiredResult`."""

from typing import Annotated

from pydantic import BaseModel

from mcp.server.mcpserver import Context, MCPServer, Resolve
from mcp.server.mcpserver.resolve import Elicit

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


if __name__ == "__main__":
    server.run("stdio")
