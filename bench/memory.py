"""The orchestrator's peak RSS during 20 concurrent 20 MB transfers (`send_file`,
`read_bytes` through the HTTP tool route, `publish_artifact`), this tree next to an earlier
revision, in one run.

Starts two real `orchestrator serve` processes (process backend, loopback), one from this
checkout and one from `git archive REV` (as bench/tool_call_compare.py does). Each gets 20
users with a 20 MB file in their sandbox; then, per tool and alternating between the servers,
a burst of 20 calls at once (one per user) while the server process's RSS is sampled every
2 ms (psutil; the agents are other processes and not counted). Prints the resting RSS, the
peak over all bursts of each tool, the burst's wall time and the calls refused `busy` (the
transfers are bounded: ORCH_TRANSFERS_MAX, docs/lifecycle.md). The bursts' deliveries and
published files are removed after each burst; a read_bytes answer is checked for its size.

Run: .venv/bin/python bench/memory.py [--baseline REV] [--rounds N] [--users N] [--size BYTES]
[--tools send_file,read_bytes,publish_artifact]
(prints `name: value unit` lines; BENCH_UID_OFFSET moves both servers' sandbox uids)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.measure import BenchServer, bench_dir, orchestrator_server  # noqa: E402
from bench.tool_call_compare import UID_BASES, export_revision  # noqa: E402

MIB = 1024 * 1024


class Sampler:
    """The peak RSS of one process while it runs (a thread sampling every `every_s`)."""

    def __init__(self, pid: int, every_s: float = 0.002) -> None:
        self._proc = psutil.Process(pid)
        self._every = every_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(self._every)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def prepare(server: BenchServer, users: int, size: int) -> list[str]:
    runs = []
    for user in range(17, 17 + users):
        run = server.new_run(user)
        server.result(run["run_id"], "shell", command=f"head -c {size} /dev/urandom > big.bin")
        runs.append(run["run_id"])
    return runs


ARGUMENTS = {
    "send_file": {"path_or_url": "big.bin"},
    "read_bytes": {"path": "big.bin"},
    "publish_artifact": {"path": "big.bin"},
}


def burst(server: BenchServer, runs: list[str], tool: str, size: int) -> tuple[int, float, int]:
    """One call of `tool` per run at once: (peak RSS, seconds, refused busy); what the calls
    made (deliveries, published files) is removed."""
    start = threading.Barrier(len(runs))

    def send(run_id: str) -> dict:
        start.wait()
        return server.tool(run_id, tool, **ARGUMENTS[tool])

    with Sampler(server.process.pid) as sampler, ThreadPoolExecutor(len(runs)) as pool:
        t0 = time.perf_counter()
        answers = list(pool.map(send, runs))
        seconds = time.perf_counter() - t0
    refused = 0
    for answer in answers:
        if answer.get("ok"):
            _clean_up(server, tool, answer["result"], size)
        elif answer.get("error", {}).get("code") == "busy":
            refused += 1
        else:
            raise RuntimeError(answer)
    return sampler.peak, seconds, refused


def _clean_up(server: BenchServer, tool: str, result: dict, size: int) -> None:
    if tool == "send_file":
        server.api.delete(f"/v1/deliveries/{result['delivery_id']}")
    elif tool == "publish_artifact":
        os.unlink(result["path"])  # the bench is the operator: 20 MB per call would pile up
    elif result["size"] != size or len(result["content_base64"]) != 4 * ((size + 2) // 3):
        raise RuntimeError(f"read_bytes answered {result['size']} bytes, not {size}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="main", help="git revision to compare with (default: main)")
    parser.add_argument("--baseline-python", default=sys.executable)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--size", type=int, default=20_000_000, help="bytes of each file (default 20 MB)")
    parser.add_argument("--tools", default=",".join(ARGUMENTS), help="comma-separated, of: " + ", ".join(ARGUMENTS))
    args = parser.parse_args()
    args.tools = [t for t in args.tools.split(",") if t]
    unknown = set(args.tools) - set(ARGUMENTS)
    if unknown:
        parser.error(f"unknown tools: {', '.join(sorted(unknown))}")

    base = bench_dir("memory-")
    os.chmod(base, 0o711)
    trees = {"baseline": (export_revision(args.baseline, base), args.baseline_python), "current": (REPO, sys.executable)}
    try:
        peaks, resting, before, seconds, refused, names = _measure(base, trees, args)
    finally:
        shutil.rmtree(base, ignore_errors=True)  # 20 users' files and deliveries: hundreds of MiB
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.baseline], capture_output=True, text=True)
    print(f"baseline_revision: {rev.stdout.strip()} rev")
    print(f"burst: {args.users} concurrent calls of each tool on {args.size} bytes, {args.rounds} rounds")
    for name in names:
        print(f"{name}_rss_resting: {resting[name] / MIB:.0f} MiB")
    for tool in args.tools:
        for name in names:
            key = (name, tool)
            print(f"{name}_{tool}_rss_before: {before[key] / MIB:.0f} MiB")
            print(f"{name}_{tool}_rss_peak: {peaks[key] / MIB:.0f} MiB")
            print(f"{name}_{tool}_rss_peak_over_resting: {(peaks[key] - resting[name]) / MIB:.0f} MiB")
            print(f"{name}_{tool}_burst_seconds_median: {sorted(seconds[key])[len(seconds[key]) // 2]:.2f} s")
            print(f"{name}_{tool}_refused_busy: {refused[key]} calls")
        print(f"{tool}_rss_peak_ratio: {peaks[('baseline', tool)] / peaks[('current', tool)]:.2f} x")


def _measure(base: Path, trees: dict[str, tuple[Path, str]], args: argparse.Namespace):  # type: ignore[no-untyped-def]
    with ExitStack() as stack:
        servers: dict[str, BenchServer] = {}
        for name, (tree, python) in trees.items():
            settings = {
                "ORCH_DATA_DIR": str(base / f"data-{name}"),
                "ORCH_BACKEND": "process",
                "ORCH_SANDBOX_UID_BASE": str(UID_BASES[name]),
                "ORCH_MAX_USER_ID": "1000",
                "ORCH_READ_BYTES_MAX": str(max(args.size, 20 * MIB)),
            }
            servers[name] = stack.enter_context(orchestrator_server(settings, python=python, cwd=tree, what=f"the {name} server"))
        runs = {name: prepare(server, args.users, args.size) for name, server in servers.items()}
        resting = {name: psutil.Process(s.process.pid).memory_info().rss for name, s in servers.items()}
        keys = [(name, tool) for tool in args.tools for name in servers]
        peaks: dict[tuple[str, str], int] = {key: 0 for key in keys}
        seconds: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
        refused: dict[tuple[str, str], int] = {key: 0 for key in keys}
        before: dict[tuple[str, str], int] = {}
        for tool in args.tools:
            # A server's RSS need not come back to resting after an earlier tool's bursts.
            before.update({(name, tool): psutil.Process(s.process.pid).memory_info().rss for name, s in servers.items()})
            for _ in range(args.rounds):
                for name, server in servers.items():
                    peak, took, busy = burst(server, runs[name], tool, args.size)
                    key = (name, tool)
                    peaks[key] = max(peaks[key], peak)
                    seconds[key].append(took)
                    refused[key] += busy
    return peaks, resting, before, seconds, refused, list(servers)


if __name__ == "__main__":
    main()
