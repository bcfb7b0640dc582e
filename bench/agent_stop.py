"""How long a sandbox agent takes to start and to stop: a bare agent (a subprocess of this
interpreter on a Unix socket, as the process backend runs it without bwrap), from spawn until
it answers /health, and from SIGTERM until it has exited (what every sandbox stop, and so every
test's teardown with a sandbox, waits for). Agents one after the other, each stopped at a
different moment of its idle loop.

Run: .venv/bin/python bench/agent_stop.py [--agents N]
(prints `name: value unit`)
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[0] = str(REPO)  # not bench/: its mcp.py would shadow the MCP SDK the test helpers import

from bench.measure import bench_dir  # noqa: E402
from tests.sandbox_agent.conftest import build_tree, start_agent  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=20)
    args = parser.parse_args()
    base = bench_dir("agent-stop-")
    starts: list[float] = []
    stops: list[float] = []
    try:
        for i in range(args.agents):
            began = time.monotonic()
            agent = start_agent(build_tree(base / f"a{i}"))
            starts.append(time.monotonic() - began)
            agent.client.close()
            time.sleep(0.05 + (i % 10) / 100)  # a different phase of the agent's idle loop each time
            began = time.monotonic()
            agent.proc.send_signal(signal.SIGTERM)
            agent.proc.wait(30)
            stops.append(time.monotonic() - began)
            if agent.proc.returncode != 0:
                raise SystemExit(f"the agent exited with {agent.proc.returncode}")
            if agent.proc.stderr:
                agent.proc.stderr.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"agent_start_median: {statistics.median(starts) * 1000:.0f} ms")
    print(f"agent_stop_median: {statistics.median(stops) * 1000:.0f} ms")
    print(f"agent_stop_max: {max(stops) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
