"""A small `read_file` through a run's MCP endpoint against the plain API, side by side.

Starts a real `orchestrator serve` (process backend) on loopback, one run, one small file. Then
alternates blocks of calls on the same event loop: `POST /v1/runs/{id}/tools/read_file` with a
keep-alive httpx client, and `tools/call read_file` through one initialized MCP client session
(the official SDK's ClientSession over its streamable-HTTP transport). Both reach the same
dispatcher and the same agent; the difference is the MCP layer (JSON-RPC framing, the SDK's
per-request stateless transport, its SSE answer). Also the cost of a fresh MCP client
(initialize + the first call), which a bot pays once per run.

Run: .venv/bin/python bench/mcp.py [--blocks 20] [--block 25]
(prints `name: value unit` lines; `api_*` and `mcp_*` come from the same run)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# This script is named like the SDK's package: its own directory must not shadow `mcp`.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

import anyio  # noqa: E402
import httpx  # noqa: E402

from bench.measure import TOKEN, bench_dir, orchestrator_server, pct  # noqa: E402
from orchestrator.mcp.connect import run_session  # noqa: E402

CONTENT = "a small file\n" * 8


async def measure(url: str, run_id: str, blocks: int, block: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"api": [], "mcp": [], "mcp_connect": []}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    body = {"arguments": {"path": "small.txt"}}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as api:
        async with run_session(url, run_id, TOKEN) as (mcp, _):
            for _ in range(block):  # warm both paths
                await api.post(f"/v1/runs/{run_id}/tools/read_file", json=body)
                await mcp.call_tool("read_file", {"path": "small.txt"})
            for _ in range(blocks):
                for _ in range(block):
                    t0 = time.perf_counter()
                    answer = await api.post(f"/v1/runs/{run_id}/tools/read_file", json=body)
                    samples["api"].append((time.perf_counter() - t0) * 1000)
                    assert answer.json()["ok"], answer.text
                for _ in range(block):
                    t0 = time.perf_counter()
                    result = await mcp.call_tool("read_file", {"path": "small.txt"})
                    samples["mcp"].append((time.perf_counter() - t0) * 1000)
                    assert not result.is_error, result
        for _ in range(max(3, blocks // 4)):
            t0 = time.perf_counter()
            async with run_session(url, run_id, TOKEN) as (mcp, _):
                await mcp.call_tool("read_file", {"path": "small.txt"})
            samples["mcp_connect"].append((time.perf_counter() - t0) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--block", type=int, default=25)
    args = parser.parse_args()
    base = bench_dir("mcp-")
    os.chmod(base, 0o711)  # sandbox uids must traverse to the data dir
    settings = {"ORCH_DATA_DIR": str(base / "data"), "ORCH_BACKEND": "process"}
    # A uid block of the caller's (other instances on this host keep theirs): passed on.
    settings.update({k: os.environ[k] for k in ("ORCH_SANDBOX_UID_BASE", "ORCH_MAX_USER_ID") if k in os.environ})
    try:
        with orchestrator_server(settings) as server:
            run = server.new_run(17)
            server.result(run["run_id"], "write_file", path="small.txt", content=CONTENT)
            samples = anyio.run(measure, server.url, run["run_id"], args.blocks, args.block)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for name in ("api", "mcp"):
        print(f"{name}_read_file_median: {pct(samples[name], 0.5):.3f} ms")
        print(f"{name}_read_file_p99: {pct(samples[name], 0.99):.3f} ms")
    print(f"mcp_overhead_ratio_median: {pct(samples['mcp'], 0.5) / pct(samples['api'], 0.5):.2f} x")
    print(f"mcp_overhead_ratio_p99: {pct(samples['mcp'], 0.99) / pct(samples['api'], 0.99):.2f} x")
    print(f"mcp_connect_and_first_call_median: {pct(samples['mcp_connect'], 0.5):.3f} ms")
    print(f"samples_per_path: {len(samples['api'])} calls")


if __name__ == "__main__":
    main()
