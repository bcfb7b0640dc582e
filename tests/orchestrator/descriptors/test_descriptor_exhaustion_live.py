"""The descriptor attack, end to end: `orchestrator serve` started with a small RLIMIT_NOFILE
(a host whose limit is the common 1,024 or less), two hostile users' sandbox shells (real
sandboxes: process-backend agents in network namespaces of their own, or docker containers on
`--network none`, each with its real in-sandbox egress forwarder) each hold hundreds of idle
connections to their forwarder, idle CONNECT tunnels and connections that never send a head,
and reopen every one the host closes. Meanwhile another user must still
create sessions, reach its own egress upstream and get its audit rows, /healthz must answer,
and the server's log must stay small."""

from __future__ import annotations

import json
import os
import shlex
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.agent_env import traversable_tmp  # noqa: F401 - the fixture
from tests.conftest import ADMIN_TOKEN, API_TOKEN
from tests.live_server import free_port, serve_process
from tests.orchestrator.egress.sandbox_client import command
from tests.orchestrator.egress.upstream import HELLO, loopback_upstream

AS_ROOT = os.geteuid() == 0
pytestmark = [
    pytest.mark.skipif(not AS_ROOT, reason="a sandbox network of its own needs a root orchestrator"),
    pytest.mark.slow,
]

NOFILE = 512  # the served process's limit, soft and hard: nothing to raise it to
HOSTILE, OTHER = (30, 32), 31
TUNNELS, IDLE, HOLD_S = 64, 400, 14
# Bytes of server log the attack may cost while it is measured (~15 s): the hostile users'
# connections that are served still write their egress line each, within the egress audit
# budget (600 a user a minute); unbounded it was megabytes (6.5 MB in ~15 s before the fix).
LOG_GROWTH_MAX = 256 * 1024
FREE_MIN = 64  # descriptors the server always keeps free under attack

# Run by the hostile sandbox's shell: TUNNELS idle CONNECT tunnels and IDLE connections that
# never send a byte, all to the in-sandbox forwarder; each one the host closes is reopened at
# once, for HOLD_S seconds. A marker file says when the first round is open.
HOARD = r"""
import json, os, selectors, socket, sys, time
host, port = os.environ["HTTP_PROXY"].split("//")[1].rsplit(":", 1)
target, tunnels, idle, hold, marker = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
sel = selectors.DefaultSelector()
def open_one(head):
    try:
        s = socket.create_connection((host, int(port)), timeout=5)
        if head:
            s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    except OSError:
        return 0
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ, head)
    return 1
opened = sum(open_one(True) for _ in range(tunnels)) + sum(open_one(False) for _ in range(idle))
open(marker, "w").close()
reopened, deadline = 0, time.monotonic() + hold
while time.monotonic() < deadline:
    for key, _ in sel.select(0.2):
        try:
            data = key.fileobj.recv(4096)
        except OSError:
            data = b""
        if data:
            continue  # an answer head: the tunnel is up (or refused and about to close)
        sel.unregister(key.fileobj)
        key.fileobj.close()
        reopened += open_one(key.data)
print(json.dumps({"opened": opened, "reopened": reopened}))
"""


def _run_of(http: httpx.Client, user_id: int) -> tuple[str, str]:
    session = http.post("/v1/sessions", json={"owner_user_id": user_id, "channel": "web"})
    assert session.status_code == 201, session.text
    session_id = session.json()["session_id"]
    run = http.post(f"/v1/sessions/{session_id}/runs", json={"trigger": "web"})
    assert run.status_code == 201, run.text
    return session_id, run.json()["run_id"]


def _shell(http: httpx.Client, run_id: str, cmd: str, timeout_s: float = 60) -> dict:
    answer = http.post(f"/v1/runs/{run_id}/tools/shell", json={"arguments": {"command": cmd, "timeout_s": timeout_s}})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["ok"], body
    return body["result"]


def _allow(url: str, user_id: int, target: str) -> None:
    response = httpx.put(
        f"{url}/v1/admin/users/{user_id}/egress", json={"allow": [target]},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30,
    )  # fmt: skip
    assert response.status_code == 200, response.text


def _server_process():
    import psutil

    return next(c for c in psutil.Process().children(recursive=True) if "serve" in c.cmdline())


@pytest.fixture(params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def backend_env(request: pytest.FixtureRequest, traversable_tmp: Path) -> Iterator[tuple[Path, dict[str, str]]]:  # noqa: F811
    """The data dir and the backend's settings: process-backend agents in network namespaces
    of their own, or docker containers on `--network none` (each with its in-sandbox forwarder)."""
    data = traversable_tmp / "data"
    data.mkdir()
    if request.param == "process":
        yield data, {"ORCH_BACKEND": "process"}
        return
    from tests.orchestrator.sandboxes.docker.conftest import remove_containers
    from tests.sandbox_image import ensure_sandbox_image, recipe_tag

    try:
        yield data, {"ORCH_BACKEND": "docker", "ORCH_SANDBOX_IMAGE": recipe_tag(ensure_sandbox_image())}
    finally:
        remove_containers(data)


def test_hostile_users_idle_egress_connections_cannot_exhaust_the_servers_descriptors(
    backend_env: tuple[Path, dict[str, str]],
) -> None:
    data, backend = backend_env
    port = free_port()
    env = {
        **backend, "ORCH_API_TOKEN": API_TOKEN, "ORCH_ADMIN_TOKEN": ADMIN_TOKEN, "ORCH_EGRESS_ALLOW_LOOPBACK": "true",
    }  # fmt: skip
    log_path = Path(f"{data}.serve.log")
    with loopback_upstream() as upstream, serve_process(str(data), port, env, nofile=NOFILE) as url:
        target = f"127.0.0.1:{upstream}"
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=90)
        for user_id in (*HOSTILE, OTHER):
            _allow(url, user_id, target)
        hostile_runs = {user_id: _run_of(http, user_id) for user_id in HOSTILE}
        _, other_run = _run_of(http, OTHER)
        warm = json.loads(_shell(http, other_run, command("get", f"{target}/hello"))["stdout"])
        assert warm["status"] == 200, warm  # the other user's sandbox and listener are up
        server = _server_process()

        marker = "hoarded"
        hoards: dict[int, dict] = {}

        def attack(user_id: int, run_id: str) -> None:
            script = f"python3 -c {shlex.quote(HOARD)} {target} {TUNNELS} {IDLE} {HOLD_S} {marker}"
            hoards[user_id] = _shell(httpx.Client(base_url=url, headers=http.headers, timeout=120), run_id, script)

        attackers = [threading.Thread(target=attack, args=(u, run)) for u, (_, run) in hostile_runs.items()]
        for thread in attackers:
            thread.start()
        markers = [data / "runtime" / str(u) / session / marker for u, (session, _) in hostile_runs.items()]
        deadline = time.monotonic() + 30
        while not all(path.exists() for path in markers):
            assert all(t.is_alive() for t in attackers) and time.monotonic() < deadline, hoards
            time.sleep(0.1)
        time.sleep(1.0)  # the host has taken (or refused) the first round; reopening goes on
        log_before = log_path.stat().st_size
        peak = [0]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                peak[0] = max(peak[0], server.num_fds())
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()

        # Another user's calls while the hoard is held: each on a fresh connection (accept()).
        statuses, health = [], []
        for _ in range(40):
            try:
                statuses.append(httpx.post(
                    f"{url}/v1/sessions", json={"owner_user_id": OTHER, "channel": "web"}, headers=http.headers, timeout=10
                ).status_code)  # fmt: skip
            except httpx.HTTPError as exc:
                statuses.append(type(exc).__name__)
        for _ in range(5):
            started = time.monotonic()
            try:
                health.append((httpx.get(f"{url}/healthz", timeout=5).status_code, time.monotonic() - started))
            except httpx.HTTPError as exc:
                health.append((type(exc).__name__, time.monotonic() - started))
        try:
            other = json.loads(_shell(http, other_run, command("connect", f"{target}/hello"))["stdout"])
        except (AssertionError, httpx.HTTPError, ValueError) as exc:
            other = {"error": repr(exc)}
        for thread in attackers:
            thread.join(120)
        sampling.set()
        sampler.join()
        log_growth = log_path.stat().st_size - log_before
        # The other user's egress audit rows were written, none lost.
        audit = httpx.get(
            f"{url}/v1/admin/audit", params={"action": "egress_connection", "limit": 1000},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30,
        ).json()["entries"]  # fmt: skip
        mine = [row for row in audit if row["runtime_user_id"] == OTHER and row["detail"]["verdict"] == "allowed"]
        outcome = {"sessions": statuses, "healthz": health, "other_egress": other.get("status"), "peak_fds": peak[0],
                   "log_growth": log_growth, "other_rows": len(mine)}  # fmt: skip

        assert statuses == [201] * 40, outcome
        assert all(status == 200 and seconds < 2.0 for status, seconds in health), outcome
        assert other.get("status") == 200 and other.get("body") == HELLO.decode(), (outcome, other)
        assert peak[0] <= NOFILE - FREE_MIN, outcome  # the process never ran short
        assert log_growth < LOG_GROWTH_MAX, (outcome, log_path.read_text()[-3000:])
        assert len(mine) == 2, outcome
        # The hostile connections closed at once are one summary row per user and code, not a row each.
        refused = httpx.get(
            f"{url}/v1/admin/audit", params={"action": "egress_refused", "limit": 1000},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30,
        ).json()["entries"]  # fmt: skip
        assert {row["runtime_user_id"] for row in refused} == set(HOSTILE), refused
        assert len(refused) <= 2 * len(HOSTILE), refused
        assert all(row["detail"]["code"] == "descriptor_share_exceeded" for row in refused), refused
        budget = httpx.get(f"{url}/healthz", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5).json()
        egress = budget["descriptors"]["pools"]["egress"]
        assert budget["descriptors"]["limit"] == NOFILE and budget["descriptors"]["refused"]["egress:descriptor_share_exceeded"] > 0
        assert egress["in_use"] <= egress["size"], budget
        for user_id, hoard in hoards.items():
            assert hoard["exit_code"] == 0, hoard
            result = json.loads(hoard["stdout"])
            assert result["opened"] >= TUNNELS + IDLE // 2, result  # the attack did hold hundreds
