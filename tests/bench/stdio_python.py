"""`cargo xtask bench`: what one user feels over stdio. The official Python SDK client
calls `@modelcontextprotocol/server-everything`'s `echo` one call at a time, directly and
through `rebound serve` (with the first-party adapters present, as shipped), and through
`line-relay`, which copies lines and decodes nothing: the floor of any stdio gateway, two
more pipe hops. In interleaved rounds; each ratio is the median of the rounds' (target:
<= 1.10x, which the floor alone may miss on a small machine).

usage: stdio_python.py REBOUND EVERYTHING PLUGINS_DIR LINE_RELAY"""

import json
import os
import statistics
import sys
import tempfile
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ROUNDS = 3
WARM_UP = 100
CALLS = 1000


async def per_call(command, args):
    params = StdioServerParameters(command=command, args=args)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for _ in range(WARM_UP):
                await session.call_tool("echo", {"message": "ping"})
            start = time.perf_counter()
            for _ in range(CALLS):
                await session.call_tool("echo", {"message": "ping"})
            return (time.perf_counter() - start) / CALLS


def main():
    rebound, everything, plugins, relay = (os.path.abspath(a) for a in sys.argv[1:5])
    with tempfile.TemporaryDirectory() as dir:
        config = f"{dir}/rebound.json"
        with open(config, "w") as f:
            json.dump({"mcpServers": {"everything": {"command": everything}}, "rebound": {"plugins_dir": plugins}}, f)
        ratios, floors, own = [], [], []
        for i in range(ROUNDS):
            direct = anyio.run(per_call, everything, [])
            floor = anyio.run(per_call, relay, [everything])
            through = anyio.run(per_call, rebound, ["serve", "--config", config])
            ratios.append(through / direct)
            floors.append(floor / direct)
            own.append(through - floor)
            print(
                f"  round {i + 1}: direct {direct * 1e6:.0f} us, line relay {floor * 1e6:.0f} us, "
                f"through rebound {through * 1e6:.0f} us: {through / direct:.2f}x"
            )
    ratio = statistics.median(ratios)
    verdict = "meets" if ratio <= 1.10 else "MISSES"
    print(
        f"stdio, Python SDK -> server-everything, one call at a time: {ratio:.2f}x direct, median of {ROUNDS} "
        f"({verdict} <= 1.10x); the floor (line relay) alone: {statistics.median(floors):.2f}x; "
        f"rebound beyond the floor: {statistics.median(own) * 1e6:.0f} us a call"
    )


main()
