"""Collaboration throughput and latency: requests → delivered → replied.

usage: .venv/bin/python bench/collaboration.py [--pairs 20] [--rounds 15]

`pairs` target sessions, each served by exactly one worker (a simulated chat bot: long-poll
the inbox, start the run with the delivery id, reply, end the run), and as many source
sessions, each asking its target one question at a time (a closed loop: the next question
once the last one is replied). The mailbox runs with synchronous=FULL (checked below).

Two layers, measured side by side in one run:
- http: a real `orchestrator serve` process on loopback; bots and sources speak HTTP;
- service: the same loop calling the service in-process (no HTTP), the mailbox's own share.

Prints `name: value unit` lines: cycles (request → delivered → replied) per second, and
p50/p99 latency from the contact_session call to the target's inbox handing out the delivery.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measure import TOKEN, bench_root, orchestrator_server  # noqa: E402
from orchestrator.collaboration.store import open_mailbox  # noqa: E402
from orchestrator.identity import Trigger  # noqa: E402
from orchestrator.runs.records import RunStatus  # noqa: E402
from orchestrator.runs.service import StartRun  # noqa: E402
from orchestrator.service import OrchestratorService  # noqa: E402
from orchestrator.sessions.records import Channel  # noqa: E402
from orchestrator.sessions.service import NewSession  # noqa: E402
from orchestrator.settings import Settings  # noqa: E402



class Flows:
    """Per question: when it was asked, when its target received it, when it was replied."""

    def __init__(self) -> None:
        self.asked: dict[str, float] = {}
        self.delivered: dict[str, float] = {}
        self.replied: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def ask(self, token: str) -> threading.Event:
        with self.lock:
            self.replied[token] = threading.Event()
            self.asked[token] = time.perf_counter()
            return self.replied[token]

    def deliver(self, token: str) -> None:
        with self.lock:
            self.delivered[token] = time.perf_counter()

    def reply(self, token: str) -> None:
        with self.lock:
            self.replied[token].set()

    def latencies_ms(self) -> list[float]:
        return sorted((self.delivered[t] - self.asked[t]) * 1000 for t in self.asked)


def percentile(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def run_loop(pairs: int, rounds: int, source: Callable[[int, Flows], None], target: Callable[[int, Flows, threading.Event], None]) -> tuple[float, Flows]:
    flows = Flows()
    stop = threading.Event()
    targets = [threading.Thread(target=target, args=(i, flows, stop), daemon=True) for i in range(pairs)]
    sources = [threading.Thread(target=source, args=(i, flows)) for i in range(pairs)]
    for t in targets:
        t.start()
    started = time.perf_counter()
    for t in sources:
        t.start()
    for t in sources:
        t.join()
    seconds = time.perf_counter() - started
    stop.set()
    for t in targets:
        t.join(timeout=30)
    assert len(flows.delivered) == pairs * rounds, "every question delivered exactly once"
    return seconds, flows


# --- over HTTP, against a real server process --------------------------------------------------

def bench_http(data: Path, pairs: int, rounds: int) -> tuple[float, Flows]:
    with orchestrator_server({"ORCH_DATA_DIR": str(data), "ORCH_BACKEND": "process"}) as server:
        base = server.url
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=base, headers=headers, timeout=30) as setup:
            for i in range(pairs):
                for sid in (f"src-{i}", f"tgt-{i}"):
                    setup.post("/v1/sessions", json={"session_id": sid, "owner_user_id": 7, "channel": "web"}).raise_for_status()

        def source(i: int, flows: Flows) -> None:
            with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
                run_id = client.post(f"/v1/sessions/src-{i}/runs", json={"trigger": "web"}).json()["run_id"]
                for r in range(rounds):
                    token = f"q-{i}-{r}"
                    done = flows.ask(token)
                    body = client.post(f"/v1/runs/{run_id}/tools/contact_session",
                                       json={"arguments": {"target": f"tgt-{i}", "message": token}, "tool_call_id": token}).json()
                    assert body["ok"], body
                    assert done.wait(30), f"{token} not replied"

        def target(i: int, flows: Flows, stop: threading.Event) -> None:
            with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
                while not stop.is_set():
                    delivery = client.get(f"/v1/sessions/tgt-{i}/inbox", params={"wait_s": 1}).json()["delivery"]
                    if delivery is None:
                        continue
                    token = delivery["messages"][0]["body"]
                    flows.deliver(token)
                    run = client.post(f"/v1/sessions/tgt-{i}/runs",
                                      json={"trigger": "side_task", "delivery_id": delivery["delivery_id"]})
                    run_id = run.json()["run_id"]
                    client.post(f"/v1/runs/{run_id}/tools/reply_to_collaboration",
                                json={"arguments": {"request_id": delivery["request_ids"][0], "kind": "reply",
                                                    "message": f"answer to {token}"}, "tool_call_id": "r"}).raise_for_status()
                    client.post(f"/v1/runs/{run_id}/end", json={"status": "succeeded"}).raise_for_status()
                    flows.reply(token)

        return run_loop(pairs, rounds, source, target)


# --- in-process, the service objects without HTTP ---------------------------------------------

def bench_service(data: Path, pairs: int, rounds: int) -> tuple[float, Flows]:
    service = OrchestratorService(Settings(data_dir=data, backend="process"))
    wake = [threading.Event() for _ in range(pairs)]  # stands in for the inbox signal
    try:
        for i in range(pairs):
            for sid in (f"src-{i}", f"tgt-{i}"):
                service.sessions.create(NewSession(owner_user_id=7, channel=Channel.WEB, session_id=sid), actor="bench")

        def source(i: int, flows: Flows) -> None:
            run_id = service.runs.start(f"src-{i}", StartRun(Trigger.WEB), actor="bench").run.run_id
            for r in range(rounds):
                token = f"q-{i}-{r}"
                done = flows.ask(token)
                body = service.dispatcher.dispatch(run_id, "contact_session", {"target": f"tgt-{i}", "message": token},
                                                   tool_call_id=token, actor="bench").body()
                assert body["ok"], body
                wake[i].set()
                assert done.wait(30), f"{token} not replied"

        def target(i: int, flows: Flows, stop: threading.Event) -> None:
            while not stop.is_set():
                item = service.collaboration.claim_next(f"tgt-{i}")
                if item is None:
                    wake[i].wait(0.5)
                    wake[i].clear()
                    continue
                token = item.messages[0].body
                flows.deliver(token)
                run_id = service.runs.start(f"tgt-{i}", StartRun(Trigger.SIDE_TASK, delivery_id=item.delivery.delivery_id),
                                            actor="bench").run.run_id
                (request_id,) = item.requests
                body = service.dispatcher.dispatch(run_id, "reply_to_collaboration",
                                                   {"request_id": request_id, "kind": "reply", "message": f"answer to {token}"},
                                                   tool_call_id="r", actor="bench").body()
                assert body["ok"], body
                service.runs.end(run_id, RunStatus.SUCCEEDED, actor="bench")
                flows.reply(token)

        return run_loop(pairs, rounds, source, target)
    finally:
        service.close()


def report(name: str, pairs: int, rounds: int, seconds: float, flows: Flows) -> None:
    latencies = flows.latencies_ms()
    print(f"{name}_cycles_per_s: {pairs * rounds / seconds:.1f} requests/s")
    print(f"{name}_contact_to_delivery_p50_ms: {statistics.median(latencies):.1f} ms")
    print(f"{name}_contact_to_delivery_p99_ms: {percentile(latencies, 99):.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=bench_root()) as tmp:
        probe = open_mailbox(Path(tmp) / "probe.sqlite3")  # the same opener the service uses
        mode = probe.connection().execute("PRAGMA synchronous").fetchone()[0]
        probe.close()
        assert mode == 2, "the mailbox must run with synchronous=FULL"
        print("mailbox_synchronous: FULL")
        print(f"targets: {args.pairs} sessions, 1 worker each")
        for name, bench in (("http", bench_http), ("service", bench_service)):
            data = Path(tmp) / name
            data.mkdir()
            seconds, flows = bench(data, args.pairs, args.rounds)
            report(name, args.pairs, args.rounds, seconds, flows)


if __name__ == "__main__":
    main()
