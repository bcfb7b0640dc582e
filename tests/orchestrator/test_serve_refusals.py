"""What `orchestrator serve` refuses, as real processes (docs/operations.md): a second server on
one data dir (naming the first's pid), a public bind without tokens, a bad setting — each one
clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import API_TOKEN, KEPT_ENV
from tests.live_server import free_port, wait_for_health



def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_") or k in KEPT_ENV}
    return {**env, "ORCH_DATA_DIR": str(data_dir), **extra}


def _serve(env: dict[str, str], *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "serve", "--port", str(free_port()), *flags],
        env=env, capture_output=True, text=True, timeout=60,
    )


def _one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("orchestrator ")]
    return line


def test_a_second_server_on_the_same_data_dir_refuses_and_names_the_first(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    log_path = tmp_path / "first.log"
    with open(log_path, "w") as log:
        first = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "serve", "--port", str(port)],
            env=_env(data_dir, ORCH_API_TOKEN=API_TOKEN), stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_health(first, url, str(log_path), 60, "the first server")
        second = _serve(_env(data_dir, ORCH_API_TOKEN=API_TOKEN))
        line = _one_line(second)
        assert f"pid {first.pid}" in line and str(data_dir) in line, line
        # The first one still serves, and logged its requests.
        headers = {"Authorization": f"Bearer {API_TOKEN}", "X-Acting-User": "5"}
        assert httpx.get(f"{url}/v1/users/5", headers=headers, timeout=10).status_code == 404
    finally:
        first.terminate()
        first.wait(timeout=30)
    output = log_path.read_text()
    assert re.search(r"access method=GET route=/v1/users/\{user_id\} status=404 duration_ms=\S+ request_id=\w+ acting_user=5", output), output
    # Once the first has stopped, the data dir is free again.
    third_port = free_port()
    with open(tmp_path / "third.log", "w") as log:
        third = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "serve", "--port", str(third_port)],
            env=_env(data_dir, ORCH_API_TOKEN=API_TOKEN), stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        wait_for_health(third, f"http://127.0.0.1:{third_port}", str(tmp_path / "third.log"), 60, "the third server")
    finally:
        third.terminate()
        third.wait(timeout=30)


def test_a_public_bind_without_tokens_exits_non_zero(tmp_path: Path) -> None:
    line = _one_line(_serve(_env(tmp_path / "data"), "--host", "0.0.0.0"))
    assert "refusing to listen on 0.0.0.0 without a token" in line and "ORCH_API_TOKEN" in line
    assert not (tmp_path / "data" / "state").exists()  # nothing was opened


def test_a_bad_setting_is_one_line_naming_the_variable_and_its_values(tmp_path: Path) -> None:
    line = _one_line(_serve(_env(tmp_path / "data", ORCH_BACKEND="dockr")))
    assert line == "orchestrator serve: invalid setting ORCH_BACKEND='dockr': it must be 'auto', 'docker', 'process' or 'kubernetes'"
    line = _one_line(_serve(_env(tmp_path / "data", ORCH_IDLE_TIMEOUT_S="soon")))
    assert line.startswith("orchestrator serve: invalid setting ORCH_IDLE_TIMEOUT_S='soon': it must be a valid number")
    gc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "gc", "--dry-run"],
        env=_env(tmp_path / "data", ORCH_URL_FETCH_ALLOW_LOOPBACK="maybe"), capture_output=True, text=True, timeout=60,
    )
    assert _one_line(gc).endswith("ORCH_URL_FETCH_ALLOW_LOOPBACK='maybe': it must be true or false (also 1/0, yes/no, on/off)")


def _limited(soft: int, hard: int):
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_descriptor_budget_that_does_not_fit_the_limit_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "serve", "--port", str(free_port())],
        env=_env(tmp_path / "data", ORCH_FD_RESERVE="600"), capture_output=True, text=True, timeout=60,
        preexec_fn=_limited(512, 512),
    )  # fmt: skip
    line = _one_line(result)
    assert "the descriptor reserve (600, ORCH_FD_RESERVE) must be below the process's descriptor limit (512)" in line
    assert not (tmp_path / "data" / "state").exists()  # refused before anything was opened
    line = _one_line(_serve(_env(tmp_path / "data", ORCH_FD_EGRESS_PCT="90", ORCH_FD_STREAMS_PCT="20")))
    assert (
        "ORCH_FD_EGRESS_PCT (90), ORCH_FD_STREAMS_PCT (20) and ORCH_FD_PREVIEWS_PCT (10) together take more than 100 %"
        in line
    )


def test_serve_raises_its_descriptor_limit_to_the_hard_one_or_the_setting(tmp_path: Path) -> None:
    for extra, expected in (({}, 4096), ({"ORCH_FD_LIMIT": "2048"}, 2048)):
        port = free_port()
        log_path = tmp_path / "serve.log"
        with open(log_path, "w") as log:
            server = subprocess.Popen(
                [sys.executable, "-m", "orchestrator", "serve", "--port", str(port)],
                env=_env(tmp_path / "data", **extra), stdout=log, stderr=subprocess.STDOUT, preexec_fn=_limited(512, 4096),
            )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for_health(server, url, str(log_path), 60, "the server")
            assert httpx.get(f"{url}/healthz", timeout=10).json()["descriptors"]["limit"] == expected
        finally:
            server.terminate()
            server.wait(timeout=30)
        assert f"descriptor limit before=512 now={expected} hard=4096" in log_path.read_text()
