"""Host tools through the HTTP API (issue 6): where send_file's bytes come from, side by side.

Starts a real `orchestrator serve` (process backend) on loopback, then measures, for a 1 MiB
file: `send_file` by local path (the sandbox's `read_bytes`, base64 over the Unix socket),
`send_file` by this service's own `/uploads/` URL (read from disk, no network round trip),
the host pre-check's refusal of a foreign path (no sandbox asked), a public `GET /uploads/...`,
and `GET /v1/deliveries/{id}`. Also the pure pre-check decision in-process.

Run: .venv/bin/python bench/host_tools.py   (prints `name: value unit` lines)
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.measure import bench_dir, orchestrator_server  # noqa: E402
from orchestrator.tools.foreign_paths import classify_foreign_path  # noqa: E402

ROUNDS = 40
SIZE = 1 << 20


def timed(samples: list[float], fn) -> object:
    t0 = time.perf_counter()
    value = fn()
    samples.append((time.perf_counter() - t0) * 1000)
    return value


def precheck_us() -> float:
    paths = ["report.md", "../../../uploads/17/a.png", "/data/runtime/17/s/x", "/etc/passwd"]
    n = 50_000
    t0 = time.perf_counter()
    for i in range(n):
        classify_foreign_path(
            paths[i % 4], workdir="/data/runtime/67/s", data_root="/data", runtime_user_id=67,
            public_base_url="https://bot.example.com",
        )
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    print(f"precheck_classify_mean: {precheck_us():.2f} us")
    base = bench_dir("host-tools-")
    os.chmod(base, 0o711)  # sandbox uids must traverse to the data dir
    settings = {"ORCH_DATA_DIR": str(base / "data"), "ORCH_BACKEND": "process"}
    try:
        with orchestrator_server(settings) as server, httpx.Client(timeout=60) as public:
            api, call = server.api, server.tool
            sid = api.post("/v1/sessions", json={"owner_user_id": 17, "channel": "feishu_group",
                                                 "group": {"channel": "feishu", "chat_id": "bench"}}).json()["session_id"]
            owner = api.post(f"/v1/sessions/{sid}/runs", json={"trigger": "web"}).json()
            assert call(owner["run_id"], "shell", command=f"head -c {SIZE} /dev/urandom > big.bin")["ok"]
            published = call(owner["run_id"], "publish_artifact", path="big.bin")["result"]
            member = api.post(f"/v1/sessions/{sid}/runs", json={"trigger": "group_message", "speaker_user_id": 67}).json()
            assert call(member["run_id"], "shell", command=f"head -c {SIZE} /dev/urandom > big.bin")["ok"]

            by_path, by_url, refused, get_upload, get_delivery = [], [], [], [], []
            for _ in range(3):  # warm up
                call(member["run_id"], "send_file", path_or_url="big.bin")
                call(member["run_id"], "send_file", path_or_url=published["url"])
            for _ in range(ROUNDS):
                sent = timed(by_path, lambda: call(member["run_id"], "send_file", path_or_url="big.bin"))
                assert sent["ok"], sent
                sent_url = timed(by_url, lambda: call(member["run_id"], "send_file", path_or_url=published["url"]))
                assert sent_url["ok"], sent_url
                answer = timed(refused, lambda: call(member["run_id"], "send_file", path_or_url=published["path"]))
                assert answer["error"]["code"] == "foreign_upload_path"
                body = timed(get_upload, lambda: public.get(published["url"]).content)
                assert len(body) == SIZE
                delivery = timed(get_delivery, lambda: api.get(f"/v1/deliveries/{sent['result']['delivery_id']}").content)
                assert len(delivery) == SIZE
                api.delete(f"/v1/deliveries/{sent['result']['delivery_id']}")
                api.delete(f"/v1/deliveries/{sent_url['result']['delivery_id']}")
            path_ms, url_ms = statistics.median(by_path), statistics.median(by_url)
            print(f"send_file_1mib_by_path_median: {path_ms:.2f} ms")
            print(f"send_file_1mib_by_own_upload_url_median: {url_ms:.2f} ms")
            print(f"send_file_path_over_own_url_ratio: {path_ms / url_ms:.2f} x")
            print(f"send_file_foreign_path_refusal_median: {statistics.median(refused):.2f} ms")
            print(f"public_upload_get_1mib_median: {statistics.median(get_upload):.2f} ms")
            print(f"delivery_get_1mib_median: {statistics.median(get_delivery):.2f} ms")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
