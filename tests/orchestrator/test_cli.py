"""`orchestrator serve` as a real process, as `make run` starts it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.live_server import free_port
from tests.conftest import KEPT_ENV


def wait_for_health(url: str, process: subprocess.Popen, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited early: {process.stdout.read() if process.stdout else ''}")
        try:
            return httpx.get(url, timeout=1).json()
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError("server did not answer /healthz")


def test_serve_answers_healthz_and_says_auth_is_off(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_") or k in KEPT_ENV}
    env["ORCH_DATA_DIR"] = str(tmp_path / "data")
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "serve", "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        health = wait_for_health(f"http://127.0.0.1:{port}/healthz", process)
        assert health["status"] == "ok" and health["runtime_identity"] == "execution"
        assert (tmp_path / "data" / "state" / "orchestrator.sqlite3").is_file()
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=10)
    assert "authentication is off" in output and "loopback" in output


def test_serve_refuses_a_newer_schema(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "data" / "state" / "orchestrator.sqlite3"
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 999")
    conn.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_") or k in KEPT_ENV}
    env["ORCH_DATA_DIR"] = str(tmp_path / "data")
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "serve", "--port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 2
    assert "schema version 999" in result.stderr
