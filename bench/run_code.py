"""Code kernels through a real `orchestrator serve` (docs/interpreter.md).

1. Warm `run_code` of `1 + 1` through the API, median and p99, next to a `shell` `echo` in the
   same run (interleaved call by call, so both see the same machine).
2. Kernel cold start: the first `run_code` of a new session (a driver and an ipykernel start).
3. A 1000-point matplotlib chart, from the call to the PNG file in outputs/ (the first one in
   a kernel imports matplotlib; then warm).
4. Memory per idle kernel: the resident set (PSS where the kernel offers it) of the driver
   and the kernel, from /proc.

Run: .venv/bin/python bench/run_code.py [--backend process|docker] [--calls 200]
On the process backend set ORCH_KERNEL_PYTHON to a python with ipykernel and matplotlib
(tests/kernel_python.py builds one); prints `name: value unit` lines.
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

from bench.measure import TOKEN, bench_dir, orchestrator_server, pct  # noqa: E402
from orchestrator.client import OrchestratorClient  # noqa: E402

CHART = (
    "import matplotlib.pyplot as plt\n"
    "fig = plt.figure(figsize=(6, 4), dpi=100)\n"
    "plt.plot(range(1000), [(i * 7919) % 1000 for i in range(1000)])\n"
    "plt.show()"
)
MEMORY = (
    "import os\n"
    "def kib(pid):\n"
    "    try:\n"
    "        with open(f'/proc/{pid}/smaps_rollup') as f:\n"
    "            return next(int(l.split()[1]) for l in f if l.startswith('Pss:'))\n"
    "    except OSError:\n"
    "        with open(f'/proc/{pid}/status') as f:\n"
    "            return next(int(l.split()[1]) for l in f if l.startswith('VmRSS:'))\n"
    "print(kib(os.getpid()), kib(os.getppid()))"
)


def _ms(seconds: list[float]) -> list[float]:
    return [s * 1000 for s in seconds]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["process", "docker"], default="process")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()

    base = bench_dir("kernels-")
    settings = {"ORCH_DATA_DIR": str(base / "data"), "ORCH_BACKEND": args.backend}
    for name in ("ORCH_SANDBOX_UID_BASE", "ORCH_MAX_USER_ID", "ORCH_SANDBOX_IMAGE", "ORCH_KERNEL_PYTHON"):
        if name in os.environ:
            settings[name] = os.environ[name]
    (base / "data").mkdir()
    try:
        with orchestrator_server(settings) as server, OrchestratorClient(server.url, TOKEN, timeout=300) as bot:
            run_id = server.new_run(17)["run_id"]
            server.result(run_id, "shell", command="true")  # the sandbox is warm

            # 2. cold start: the first run_code of this session
            started = time.perf_counter()
            first = bot.run_code(run_id, "1 + 1")
            cold = time.perf_counter() - started
            assert first.text == "2", first

            # 1. warm run_code against shell echo, interleaved
            code_s, shell_s = [], []
            for _ in range(args.calls):
                started = time.perf_counter()
                bot.call_tool(run_id, "run_code", {"code": "1 + 1"}).raise_for_error()
                code_s.append(time.perf_counter() - started)
                started = time.perf_counter()
                bot.call_tool(run_id, "shell", {"command": "echo 2"}).raise_for_error()
                shell_s.append(time.perf_counter() - started)
            code_ms, shell_ms = _ms(code_s), _ms(shell_s)
            print(f"run_code_warm_median: {statistics.median(code_ms):.2f} ms")
            print(f"run_code_warm_p99: {pct(code_ms, 0.99):.2f} ms")
            print(f"shell_echo_median: {statistics.median(shell_ms):.2f} ms")
            print(f"shell_echo_p99: {pct(shell_ms, 0.99):.2f} ms")
            print(f"run_code_over_shell_median: {statistics.median(code_ms) / statistics.median(shell_ms):.2f} x")
            print(f"kernel_cold_start: {cold * 1000:.0f} ms")

            # 3. a 1000-point chart, call to file
            for label in ("chart_1000_points_first", "chart_1000_points_warm"):
                started = time.perf_counter()
                chart = bot.run_code(run_id, CHART)
                took = time.perf_counter() - started
                assert chart.images and Path(chart.images[0].path).stat().st_size == chart.images[0].size, chart
                print(f"{label}: {took * 1000:.0f} ms")

            # 4. memory of an idle kernel (a fresh one: nothing imported but IPython's own)
            fresh = server.new_run(17)["run_id"]
            kernel_kib, driver_kib = (int(v) for v in bot.run_code(fresh, MEMORY).stdout.split())
            print(f"idle_kernel_memory: {kernel_kib / 1024:.1f} MiB")
            print(f"kernel_driver_memory: {driver_kib / 1024:.1f} MiB")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
