"""The agent transport's cost, and an alternative it was chosen over: a warm `read_file`
straight to one live agent (a subprocess of this interpreter on a Unix socket), through
`AsyncAgentClient` (llhttp via `httptools` over asyncio streams, what the orchestrator uses)
and through httpx's `AsyncHTTPTransport(uds=...)` on the same socket and loop, in
alternating blocks. (h11 over the same streams, tried too, cost 0.25 ms of CPU a call here:
docs/performance.md.)

Run: .venv/bin/python bench/agent_transport.py [--calls N]
(prints `name: value unit`: median wall time per call, and CPU per call of this process)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[0] = str(REPO)  # not bench/: its mcp.py would shadow the MCP SDK the test helpers import

import httpx  # noqa: E402

from bench.measure import bench_dir  # noqa: E402
from sandbox_agent.client import AsyncAgentClient  # noqa: E402
from tests.sandbox_agent.conftest import build_tree, start_agent, stop_agent  # noqa: E402

BLOCK = 100


async def measure(clients: dict[str, Callable[[], Awaitable[object]]], calls: int) -> None:
    wall: dict[str, list[float]] = {name: [] for name in clients}
    cpu: dict[str, float] = dict.fromkeys(clients, 0.0)
    for call in clients.values():  # warm: connections open, code paths hot
        for _ in range(BLOCK):
            await call()
    for _ in range(max(1, calls // BLOCK)):
        for name, call in clients.items():
            cpu_from = time.process_time()
            for _ in range(BLOCK):
                started = time.perf_counter()
                await call()
                wall[name].append((time.perf_counter() - started) * 1000)
            cpu[name] += time.process_time() - cpu_from
    for name in clients:
        print(f"{name}_read_file_median: {statistics.median(wall[name]):.3f} ms")
        print(f"{name}_read_file_cpu: {cpu[name] / len(wall[name]) * 1000:.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls per client")
    args = parser.parse_args()
    base = bench_dir("transport-")
    agent = start_agent(build_tree(base))
    socket_path, cwd = agent.config.socket_path, str(agent.tree.workdir)
    body = json.dumps({"arguments": {"path": "hello.txt"}, "cwd": cwd}).encode()

    async def run() -> None:
        ours = AsyncAgentClient(socket_path, agent.token)
        via_httpx = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=socket_path),
            base_url="http://sandbox-agent",
            headers={"Authorization": f"Bearer {agent.token}", "Content-Type": "application/json"},
        )

        async def llhttp_call() -> object:
            return await ours.call("read_file", {"path": "hello.txt"}, cwd=cwd)

        async def httpx_call() -> object:
            return (await via_httpx.post("/v1/tools/read_file", content=body)).json()

        try:
            await measure({"llhttp": llhttp_call, "httpx": httpx_call}, args.calls)
        finally:
            ours.close()
            await via_httpx.aclose()

    try:
        asyncio.run(run())
    finally:
        stop_agent(agent)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
