"""Issue 12 item 4 through a live server (real HTTP, real agents as their own uids): one user
who stalls their own sandbox must not stall anyone else, nor themselves for long."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from tests.conftest import ADMIN_TOKEN, API_TOKEN, make_settings
from tests.live_server import live_server

AS_ROOT = os.geteuid() == 0
OWNER, ATTACKER = 17, 67
BOT = {"Authorization": f"Bearer {API_TOKEN}"}


@contextmanager
def serving(data_dir: Path, **settings: object) -> Iterator[tuple[OrchestratorService, httpx.Client]]:
    service = OrchestratorService(make_settings(data_dir, backend="process", **settings))
    with live_server(create_app(service)) as url, httpx.Client(base_url=url, headers=BOT, timeout=60) as http:
        yield service, http


def personal_run(http: httpx.Client, user_id: int) -> str:
    session = http.post("/v1/sessions", json={"owner_user_id": user_id, "channel": "web"})
    assert session.status_code == 201, session.text
    run = http.post(f"/v1/sessions/{session.json()['session_id']}/runs", json={"trigger": "web"})
    assert run.status_code == 201, run.text
    return run.json()["run_id"]


def call(http: httpx.Client, run_id: str, tool: str, timeout: float = 60, **arguments: object) -> dict:
    response = http.post(f"/v1/runs/{run_id}/tools/{tool}", json={"arguments": arguments}, timeout=timeout)
    assert response.status_code == 200, response.text
    return response.json()


def agent_pid(service: OrchestratorService, user_id: int) -> int:
    [status] = [s for s in service.sandboxes.backends["process"].status() if s.user_id == user_id]
    return status.detail["pid"]  # type: ignore[index]


def timed(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    started = time.monotonic()
    result = fn(*args, **kwargs)
    return result, time.monotonic() - started


@pytest.mark.skipif(not AS_ROOT, reason="agents run as their own uids only as root")
def test_item4_one_users_sleeping_shells_stall_nobody_else(agent_data_dir: Path) -> None:
    with serving(agent_data_dir) as (service, http):
        victim, attacker = personal_run(http, OWNER), personal_run(http, ATTACKER)
        assert call(http, victim, "write_file", path="notes.txt", content="mine\n")["ok"]
        assert call(http, attacker, "list_dir")["ok"]
        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            started = time.monotonic()
            floods = [
                pool.submit(lambda: (call(http, attacker, "shell", command="sleep 20"), time.monotonic() - started))
                for _ in range(40)
            ]
            time.sleep(1.5)  # every flood call has arrived: running, or refused
            read, read_s = timed(call, http, victim, "read_file", timeout=10, path="notes.txt")
            health, health_s = timed(http.get, "/healthz", timeout=10)
            admin, admin_s = timed(
                http.get, "/v1/admin/sandboxes", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10
            )
            done, _ = concurrent.futures.wait(floods, timeout=5)
            refused = [f.result() for f in done]
            # End the eight that run: kill the attacker's agent (their answers say it may have run).
            os.kill(agent_pid(service, ATTACKER), signal.SIGKILL)
            rest = [f.result(timeout=30) for f in floods if f not in done]
    assert read["ok"] and read["result"]["content"] == "mine\n" and read_s < 1.5, (read, read_s)
    assert health.status_code == 200 and health_s < 1.0, health_s
    assert admin.status_code == 200 and admin_s < 1.5, admin_s
    assert len(refused) == 32, f"{len(refused)} of 40 answered at once"
    for answer, seconds in refused:
        assert answer["ok"] is False and answer["error"]["code"] == "busy" and seconds < 3.0, (answer, seconds)
        assert "8" in answer["error"]["message"] and "other calls of this user are still running" in answer["error"]["message"]
    assert len(rest) == 8 and all(answer["ok"] is False for answer, _ in rest)


@pytest.mark.skipif(not AS_ROOT, reason="agents run as their own uids only as root")
def test_item4_a_stopped_agent_answers_within_the_short_timeout_and_is_replaced(agent_data_dir: Path) -> None:
    with serving(agent_data_dir, agent_call_timeout_s=2.0) as (service, http):
        attacker = personal_run(http, ATTACKER)
        assert call(http, attacker, "write_file", path="a.txt", content="a\n")["ok"]
        stopped = replaced = agent_pid(service, ATTACKER)
        os.kill(stopped, signal.SIGSTOP)  # what the user's own shell can do to its agent
        try:
            answer, seconds = timed(call, http, attacker, "read_file", timeout=20, path="a.txt")
            assert answer["ok"] is False and answer["error"]["code"] == "sandbox_unavailable", answer
            assert "may have run" in answer["error"]["message"] and seconds < 4.0, (answer, seconds)
            again, again_s = timed(call, http, attacker, "read_file", timeout=20, path="a.txt")
            assert again["ok"] and again["result"]["content"] == "a\n", again
            assert agent_pid(service, ATTACKER) != stopped
            assert not psutil.pid_exists(stopped) or psutil.Process(stopped).status() == psutil.STATUS_ZOMBIE
            # A host tool reading from the sandbox is bounded the same way.
            replaced = agent_pid(service, ATTACKER)
            os.kill(replaced, signal.SIGSTOP)
            sent, sent_s = timed(call, http, attacker, "send_file", timeout=20, path_or_url="a.txt")
            assert sent["ok"] is False and sent["error"]["code"] == "sandbox_unavailable" and sent_s < 4.0, (sent, sent_s)
            assert call(http, attacker, "send_file", timeout=20, path_or_url="a.txt")["ok"]
        finally:
            for pid in {stopped, replaced}:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.mark.skipif(not AS_ROOT, reason="agents run as their own uids only as root")
def test_item4_a_shells_deadline_is_its_own_timeout_plus_a_margin(agent_data_dir: Path) -> None:
    with serving(agent_data_dir, agent_call_timeout_s=1.0) as (_, http):
        run = personal_run(http, ATTACKER)
        answer = call(http, run, "shell", command="sleep 2; echo done", timeout_s=5)
    assert answer["ok"] and answer["result"]["stdout"] == "done\n", answer


@pytest.mark.skipif(not AS_ROOT, reason="the impersonating listener runs as the sandbox uid")
def test_failures_a_sandbox_forges_on_its_socket_are_its_own_answers_and_bound_the_metrics_labels(
    traversable_tmp: Path, agent_data_dir: Path
) -> None:
    """A tool's failure now travels as a value from the agent's answer to the bot. A sandbox
    answering every call with a failure of a new code (and a `path` that is an object) gets
    exactly that as its own tool result, never a 500; /metrics keeps at most its bounded set
    of outcome labels; another user's calls are untouched."""
    from orchestrator.metrics import OUTCOME_LABELS_MAX
    from tests.sandbox_agent.lying_agent import lying_agent

    with serving(agent_data_dir) as (service, http):
        run, other = personal_run(http, ATTACKER), personal_run(http, OWNER)
        assert call(http, run, "list_dir")["ok"] and call(http, other, "list_dir")["ok"]
        uid = service.directories.sandbox_uid(ATTACKER)
        with lying_agent(traversable_tmp, "forgedfailures", uid=uid) as fake:
            socket_path = service.layout.socket_path(ATTACKER)
            os.rename(socket_path, f"{socket_path}.real")
            os.rename(fake, socket_path)
            time.sleep(3.2)  # the pooled connection to the real agent is too old to be reused
            answers = [call(http, run, "read_file", path="a.txt") for _ in range(OUTCOME_LABELS_MAX + 20)]
            victim = call(http, other, "list_dir")
        exposition = http.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).text
    codes = [answer["error"]["code"] for answer in answers]
    assert all(answer["ok"] is False for answer in answers)
    assert len(set(codes)) == len(codes) and all(code.startswith("forged_") for code in codes)
    assert answers[0]["error"] == {"code": codes[0], "message": "lies", "path": {"nested": [int(codes[0][7:])]}, "note": "x" * 100}
    assert victim["ok"] is True
    outcomes = {
        line.split('outcome="', 1)[1].split('"', 1)[0]
        for line in exposition.splitlines()
        if line.startswith("orchestrator_tool_calls_total{")
    }
    assert "other" in outcomes and len(outcomes) <= OUTCOME_LABELS_MAX + 1, sorted(outcomes)


@pytest.mark.skipif(not AS_ROOT, reason="the impersonating listener runs as the sandbox uid")
def test_item6_a_sandbox_lying_on_its_socket_with_300_mib_gets_an_error_and_no_memory(
    traversable_tmp: Path, agent_data_dir: Path
) -> None:
    from tests.sandbox_agent.lying_agent import lying_agent

    with serving(agent_data_dir) as (service, http):
        run = personal_run(http, ATTACKER)
        assert call(http, run, "list_dir")["ok"]
        uid = service.directories.sandbox_uid(ATTACKER)
        with lying_agent(traversable_tmp, "huge", uid=uid) as fake:
            # The sandbox's own uid now answers on its agent's socket path.
            socket_path = service.layout.socket_path(ATTACKER)
            os.rename(socket_path, f"{socket_path}.real")
            os.rename(fake, socket_path)
            time.sleep(3.2)  # the pooled connection to the real agent is too old to be reused
            rss_before = psutil.Process().memory_info().rss
            answer = call(http, run, "shell", timeout=30, command="echo hi")
            grown_mib = (psutil.Process().memory_info().rss - rss_before) / 2**20
    assert answer["ok"] is False and answer["error"]["code"] == "output_too_large", str(answer)[:300]
    assert grown_mib < 64, grown_mib
