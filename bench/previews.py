"""Preview URL figures (docs/previews.md), side by side in one run, with a real process-backend
sandbox (bwrap, its own network namespace): a small GET through the preview against the same
GET made inside the sandbox; a 100 MB download through the preview; a WebSocket round trip.

usage: sudo .venv/bin/python bench/previews.py [--gets 300] [--mib 100] [--echoes 300]
Prints `name: value unit` lines. Only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

sys.path[0] = str(Path(__file__).resolve().parents[1])  # not bench/: its mcp.py would shadow the SDK

from bench.measure import bench_root  # noqa: E402
from orchestrator.http.app import create_app  # noqa: E402
from orchestrator.service import OrchestratorService  # noqa: E402
from orchestrator.settings import Settings  # noqa: E402
from tests.orchestrator.previews.apps import WEBSOCKET_ECHO_APP, open_websocket, _frame, _read_frame  # noqa: E402

TOKEN = "bench-token-" + "x" * 32
INSIDE = r'''
import statistics, sys, time, urllib.request
samples = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    urllib.request.urlopen("http://127.0.0.1:8000/small.txt").read()
    samples.append(time.perf_counter() - t)
print(statistics.median(samples) * 1000, sorted(samples)[int(len(samples) * 0.95)] * 1000)
'''


def tool(client: TestClient, run_id: str, name: str, **arguments: object) -> dict:
    answer = client.post(f"/v1/runs/{run_id}/tools/{name}", json={"arguments": arguments}).json()
    assert answer["ok"], answer
    return answer["result"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gets", type=int, default=300)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--echoes", type=int, default=300)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(dir=bench_root(), prefix="previews-"))
    os.chmod(base, 0o711)
    (base / "data").mkdir()
    settings = Settings(
        data_dir=base / "data", api_token=TOKEN, backend="process", process_sandbox="bwrap", disk_quota="off",
        preview_listen="127.0.0.1:0", sandbox_uid_base=int(os.environ.get("ORCH_SANDBOX_UID_BASE", "700000000")),
    )  # type: ignore[call-arg]
    service = OrchestratorService(settings)
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            session = client.post("/v1/sessions", json={"owner_user_id": 17, "channel": "web"}).json()["session_id"]
            run_id = client.post(f"/v1/sessions/{session}/runs", json={"trigger": "web"}).json()["run_id"]
            tool(client, run_id, "shell", command=f"mkdir -p site && echo hello > site/small.txt && "
                 f"head -c {args.mib * 2**20} /dev/zero > site/big.bin")  # fmt: skip
            tool(client, run_id, "write_file", path="inside.py", content=INSIDE)
            tool(client, run_id, "write_file", path="ws_echo.py", content=WEBSOCKET_ECHO_APP)
            tool(client, run_id, "process_start", command="cd site && exec python3 -m http.server 8000 --bind 127.0.0.1")
            tool(client, run_id, "process_start", command="exec python3 ws_echo.py 8001")
            url = client.post(f"/v1/runs/{run_id}/previews", json={"port": 8000}).json()["url"]
            ws_url = client.post(f"/v1/runs/{run_id}/previews", json={"port": 8001}).json()["url"]
            while httpx.get(url + "small.txt").status_code == 503:
                time.sleep(0.1)
            inside = tool(client, run_id, "shell", command=f"python3 inside.py {args.gets}", timeout_s=300)["stdout"].split()
            samples = []
            with httpx.Client() as http:
                for _ in range(args.gets):
                    started = time.perf_counter()
                    assert http.get(url + "small.txt").status_code == 200
                    samples.append(time.perf_counter() - started)
            samples.sort()
            print(f"small_get_inside_sandbox_p50: {float(inside[0]):.3f} ms")
            print(f"small_get_inside_sandbox_p95: {float(inside[1]):.3f} ms")
            print(f"small_get_through_preview_p50: {statistics.median(samples) * 1000:.3f} ms")
            print(f"small_get_through_preview_p95: {samples[int(len(samples) * 0.95)] * 1000:.3f} ms")
            started, size = time.perf_counter(), 0
            with httpx.stream("GET", url + "big.bin", timeout=120) as response:
                for chunk in response.iter_raw(1 << 20):
                    size += len(chunk)
            elapsed = time.perf_counter() - started
            assert size == args.mib * 2**20
            print(f"download_{args.mib}mib_through_preview: {size / 2**20 / elapsed:.1f} MiB/s")
            while httpx.get(ws_url).status_code == 503:
                time.sleep(0.1)
            trips = []
            with open_websocket(ws_url + "ws") as sock:
                for _ in range(args.echoes):
                    started = time.perf_counter()
                    sock.sendall(_frame(b"ping"))
                    assert _read_frame(sock) == b"ping"
                    trips.append(time.perf_counter() - started)
            trips.sort()
            print(f"websocket_round_trip_p50: {statistics.median(trips) * 1000:.3f} ms")
            print(f"websocket_round_trip_p95: {trips[int(len(trips) * 0.95)] * 1000:.3f} ms")
    finally:
        service.close()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
