"""Background processes and streamed output, through a real `orchestrator serve` (docs/processes.md).

1. Latency from a line printed in the sandbox to the bot receiving it: the sandbox prints its
   clock (`time.time()`, the same kernel clock as the bot's, docker included) every 50 ms; the
   bot takes the difference on arrival, once over SSE (`stream_shell`) and once by long-polling
   `process_output` (`process_output(..., follow=True)`), side by side in the same run.
2. Throughput of `yes | head -c 200M` spooled by a background process (MB/s, against the same
   pipeline into /dev/null in a plain `shell`, same run), and of reading it back through
   `process_output` (64 KiB answers, MB/s); the agent's CPU while spooling (its process and
   threads, from /proc, as a share of one core).

Run: .venv/bin/python bench/processes.py [--backend process|docker] [--lines 100] [--megabytes 200]
(prints `name: value unit` lines; set ORCH_SANDBOX_UID_BASE to a uid block of your own)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from bench.measure import TOKEN, bench_dir, orchestrator_server, pct  # noqa: E402
from orchestrator.client import OrchestratorClient  # noqa: E402

PRINTER = (
    "python3 -c 'import sys, time\n"
    "for _ in range({n}):\n"
    "    print(repr(time.time()), flush=True); time.sleep(0.05)'"
)


def _latencies(texts: list[tuple[float, str]]) -> list[float]:
    """(arrival, text) pieces -> the delay of every complete line, in ms."""
    delays, pending = [], ""
    for arrived, text in texts:
        pending += text
        *lines, pending = pending.split("\n")
        delays += [(arrived - float(line)) * 1000 for line in lines if line.strip()]
    return delays


def _report(name: str, samples: list[float]) -> None:
    print(f"{name}_median: {statistics.median(samples):.2f} ms")
    print(f"{name}_p99: {pct(samples, 0.99):.2f} ms")


def _agent_cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _process_agent_pid(server) -> int | None:  # type: ignore[no-untyped-def]
    """The process backend's agent (the admin sandbox listing's `pid`)."""
    listing = server.api.get("/v1/admin/sandboxes", headers={"Authorization": f"Bearer {TOKEN}-admin"})
    for sandbox in listing.json().get("sandboxes", []):
        pid = (sandbox.get("detail") or {}).get("pid")
        if isinstance(pid, int):
            return pid
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["process", "docker"], default="process")
    parser.add_argument("--lines", type=int, default=100)
    parser.add_argument("--megabytes", type=int, default=200)
    args = parser.parse_args()

    base = bench_dir("procs-")
    settings = {"ORCH_DATA_DIR": str(base / "data"), "ORCH_BACKEND": args.backend}
    for name in ("ORCH_SANDBOX_UID_BASE", "ORCH_MAX_USER_ID", "ORCH_SANDBOX_IMAGE"):
        if name in os.environ:
            settings[name] = os.environ[name]
    (base / "data").mkdir()
    try:
        with orchestrator_server(settings) as server, OrchestratorClient(server.url, TOKEN, timeout=300) as bot:
            run_id = server.new_run(17)["run_id"]
            server.result(run_id, "shell", command="true")  # the sandbox is warm

            # 1. line latency, SSE and long poll, one after the other in the same run
            sse: list[tuple[float, str]] = []
            for event in bot.stream_shell(run_id, PRINTER.format(n=args.lines), timeout_s=120):
                if event.kind == "output":
                    sse.append((time.time(), event.text))
            started = server.result(run_id, "process_start", command=PRINTER.format(n=args.lines))
            polled = [
                (time.time(), chunk.text)
                for chunk in bot.process_output(run_id, started["process_id"], follow=True, wait_s=30)  # type: ignore[union-attr]
            ]
            sse_ms, poll_ms = _latencies(sse), _latencies(polled)
            _report("line_latency_sse", sse_ms)
            _report("line_latency_long_poll", poll_ms)
            print(f"line_latency_ratio_long_poll_to_sse: {statistics.median(poll_ms) / statistics.median(sse_ms):.2f} x")

            # 2. spooling throughput, against the same pipeline into /dev/null
            size = args.megabytes * 1024 * 1024
            began = time.perf_counter()
            server.result(run_id, "shell", command=f"yes | head -c {size} > /dev/null", timeout_s=300)
            plain_s = time.perf_counter() - began
            agent_pid = _process_agent_pid(server) if args.backend == "process" else None
            cpu_before = _agent_cpu_s(agent_pid) if agent_pid else 0.0
            began = time.perf_counter()
            flood = server.result(run_id, "process_start", command=f"yes | head -c {size}")
            while True:
                state = server.result(run_id, "process_output", process_id=flood["process_id"], since=0, max_bytes=1)
                if not state["running"]:
                    break
                time.sleep(0.05)  # a poll, not a busy loop competing with the spooling
            spool_s = time.perf_counter() - began
            cpu = (_agent_cpu_s(agent_pid) - cpu_before) / spool_s if agent_pid else None
            mb = size / 1e6
            print(f"spool_throughput: {mb / spool_s:.0f} MB/s")
            print(f"plain_pipeline_throughput: {mb / plain_s:.0f} MB/s")
            print(f"spool_to_plain_ratio: {plain_s / spool_s:.2f} x")
            if cpu is not None:
                print(f"agent_cpu_while_spooling: {cpu * 100:.0f} % of a core")

            # reading it back through process_output (what the ring still holds, 64 KiB a call)
            since, received, began = state["next"], 0, time.perf_counter()
            while True:
                answer = server.result(run_id, "process_output", process_id=flood["process_id"], since=since)
                received += answer["next"] - since
                since = answer["next"]
                if answer["complete"]:
                    break
            read_s = time.perf_counter() - began
            print(f"process_output_read_throughput: {received / 1e6 / read_s:.1f} MB/s")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
