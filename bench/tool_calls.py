"""Tool-call round trips through the HTTP API to warm process-backend agents.

Starts a real `orchestrator serve` (uvicorn on loopback) with the process backend, then:
1. median and p99 of a small `read_file` through `POST /v1/runs/{id}/tools/read_file`,
   and the same call straight to the agent over its Unix socket (the orchestrator's share);
2. 50 sessions x 20 tool calls in parallel (10 users, so 10 agents): errors and p99.

Run: .venv/bin/python bench/tool_calls.py   (prints `name: value unit` lines)
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.measure import bench_dir, orchestrator_server, pct  # noqa: E402
from sandbox_agent.client import AgentClient  # noqa: E402

CALLS = 2000
SESSIONS, CALLS_PER_SESSION, USERS = 50, 20, 10


def main() -> None:
    base = bench_dir("tool-calls-")
    os.chmod(base, 0o711)  # sandbox uids must traverse to the data dir
    try:
        with orchestrator_server({"ORCH_DATA_DIR": str(base / "data"), "ORCH_BACKEND": "process"}) as server:
            new_run, call = server.new_run, server.result
            run = new_run(17)
            cold = time.perf_counter()
            call(run["run_id"], "write_file", path="small.txt", content="hello\n" * 10)
            print(f"first_call_with_agent_start: {1000 * (time.perf_counter() - cold):.0f} ms")
            for _ in range(100):
                call(run["run_id"], "read_file", path="small.txt")
            samples = []
            for _ in range(CALLS):
                t0 = time.perf_counter()
                call(run["run_id"], "read_file", path="small.txt")
                samples.append((time.perf_counter() - t0) * 1000)
            print(f"read_file_api_median: {statistics.median(samples):.3f} ms")
            print(f"read_file_api_p99: {pct(samples, 0.99):.3f} ms")

            data = base / "data"
            token = (data / "agent-secrets" / "17" / "token").read_text().strip()
            with AgentClient(data / "sockets" / "17" / "agent.sock", token) as agent:
                direct = []
                for _ in range(CALLS):
                    t0 = time.perf_counter()
                    agent.call("read_file", {"path": "small.txt"}, cwd=run["workdir"])
                    direct.append((time.perf_counter() - t0) * 1000)
            print(f"read_file_agent_direct_median: {statistics.median(direct):.3f} ms")
            print(f"orchestrator_share_median: {statistics.median(samples) - statistics.median(direct):.3f} ms")

            runs = [new_run(100 + (i % USERS)) for i in range(SESSIONS)]
            for r in runs[:USERS]:
                call(r["run_id"], "write_file", path="small.txt", content="x\n")  # warm every agent
            for r in runs:
                call(r["run_id"], "write_file", path="small.txt", content="x\n")
            latencies: list[float] = []
            errors = 0

            def session_work(r: dict) -> None:
                nonlocal errors
                for i in range(CALLS_PER_SESSION):
                    t0 = time.perf_counter()
                    try:
                        if i % 4 == 3:
                            call(r["run_id"], "list_dir", path=".")
                        else:
                            call(r["run_id"], "read_file", path="small.txt")
                    except Exception:
                        errors += 1
                    latencies.append((time.perf_counter() - t0) * 1000)

            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(SESSIONS) as pool:
                list(pool.map(session_work, runs))
            wall = time.perf_counter() - t0
            print(f"parallel_{SESSIONS}x{CALLS_PER_SESSION}_errors: {errors} calls")
            print(f"parallel_{SESSIONS}x{CALLS_PER_SESSION}_median: {statistics.median(latencies):.2f} ms")
            print(f"parallel_{SESSIONS}x{CALLS_PER_SESSION}_p99: {pct(latencies, 0.99):.2f} ms")
            print(f"parallel_{SESSIONS}x{CALLS_PER_SESSION}_throughput: {len(latencies) / wall:.0f} calls/s")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
