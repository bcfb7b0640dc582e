"""What the benchmark scripts share: a free loopback port, percentiles of their samples, and
a real `orchestrator serve` subprocess with an API client for the bot token."""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx

REPO = Path(__file__).resolve().parents[1]
# Not /tmp or /var/tmp: the orchestrator refuses a data dir inside a directory others can
# write, and sandbox uids must traverse this one (0711, root's).
BENCH_ROOT = Path("/var/lib/sandbox-orchestrator-bench") if os.geteuid() == 0 else Path.home() / ".cache/orch-bench"


def bench_root() -> Path:
    BENCH_ROOT.mkdir(mode=0o711, parents=True, exist_ok=True)
    os.chmod(BENCH_ROOT, 0o711)
    return BENCH_ROOT


def bench_dir(prefix: str) -> Path:
    """A fresh 0711 directory for one benchmark's data dirs; the caller removes it."""
    import tempfile

    base = Path(tempfile.mkdtemp(dir=bench_root(), prefix=prefix))
    os.chmod(base, 0o711)
    return base
TOKEN = "bench-bot-token"
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed_parallel(work: Callable[[T], object], items: Sequence[T]) -> float:
    """Seconds to run `work` on every item, one thread each."""
    import concurrent.futures

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(items)) as pool:
        list(pool.map(work, items))
    return time.perf_counter() - t0


def print_load(label: str, latencies: list[float], errors: list[str], wall_s: float) -> None:
    """A parallel load's `name: value unit` lines: errors, p50, p99 (ms), throughput."""
    print(f"{label}_errors: {len(errors)} calls")
    print(f"{label}_p50: {statistics.median(latencies):.2f} ms")
    print(f"{label}_p99: {pct(latencies, 0.99):.2f} ms")
    print(f"{label}_throughput: {len(latencies) / wall_s:.0f} calls/s")


@dataclass
class BenchServer:
    process: subprocess.Popen[bytes]
    api: httpx.Client  # bot token
    url: str
    health: dict

    def new_run(self, owner: int) -> dict:
        """A web run in a new personal web session of `owner`."""
        sid = self.api.post("/v1/sessions", json={"owner_user_id": owner, "channel": "web"}).json()["session_id"]
        return self.api.post(f"/v1/sessions/{sid}/runs", json={"trigger": "web"}).json()

    def tool(self, run_id: str, name: str, **arguments: object) -> dict:
        """The tool call's whole answer (`ok`, `result` or `error`)."""
        return self.api.post(f"/v1/runs/{run_id}/tools/{name}", json={"arguments": arguments}).json()

    def result(self, run_id: str, name: str, **arguments: object) -> dict:
        """The tool call's result; a failed call stops the benchmark."""
        body = self.tool(run_id, name, **arguments)
        if not body.get("ok"):
            raise RuntimeError(body)
        return body["result"]


@contextmanager
def orchestrator_server(
    settings: Mapping[str, str],
    *,
    python: str = sys.executable,
    cwd: Path = REPO,
    timeout: float = 60,
    limits: httpx.Limits | None = None,
    what: str = "the server",
) -> Iterator[BenchServer]:
    """`orchestrator serve` on a free loopback port, from `cwd`'s packages, with no ORCH_
    variable of the caller's but `settings` and the bot token; stopped with SIGTERM at the end."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update({"ORCH_API_TOKEN": TOKEN, "ORCH_ADMIN_TOKEN": TOKEN + "-admin"})
    # Disk quotas off unless a benchmark asks (bench/disk_quota.py): as root `auto` would leave
    # loop images mounted after every run.
    env.update({"ORCH_PUBLIC_BASE_URL": f"http://127.0.0.1:{port}", "ORCH_DISK_QUOTA": "off", **settings})
    # -m with cwd: that tree's own packages come first on sys.path.
    process = subprocess.Popen(
        [python, "-m", "orchestrator", "--log-level", "WARNING", "serve", "--port", str(port)],
        cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    limited = {"limits": limits} if limits is not None else {}
    api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120, **limited)
    try:
        yield BenchServer(process, api, url, wait_until_serving(api, process, timeout, what))
    finally:
        api.close()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def wait_until_serving(api: httpx.Client, process: subprocess.Popen[bytes], timeout: float, what: str) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            health = api.get("/healthz")
            if health.status_code == 200:
                return health.json()
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            raise SystemExit(f"{what} did not start")
        time.sleep(0.1)
