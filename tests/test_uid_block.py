"""The test run's uid span: free of every live instance's block and every other run's span."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO
from tests.live_server import free_port, serve_process
from tests.uid_block import FIRST_BASE, SPAN, free_base


def test_the_first_span_when_nothing_is_taken() -> None:
    assert free_base([]) == FIRST_BASE


def test_a_live_default_orchestrator_pushes_the_span_above_its_block() -> None:
    default_block = (100_000, 1_000_100_000)  # a `make run` on the default settings
    base = free_base([default_block])
    assert base is not None and base > default_block[1]
    assert (base - FIRST_BASE) % SPAN == 0


def test_other_runs_spans_are_skipped_and_a_full_host_has_none() -> None:
    first = free_base([])
    assert first is not None
    second = free_base([(first, first + SPAN - 1)])
    assert second == first + SPAN
    assert free_base([(0, 2_100_000_000)]) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="uid blocks are claimed by root orchestrators only")
def test_the_suite_runs_beside_a_root_orchestrator_on_the_default_block(tmp_path: Path) -> None:
    """A root orchestrator serves on the default block (100000 .. 1e9 + 100000) first; a test
    run started after it, given no block of its own, claims a free one and passes. The registry
    is a private one, so this test's own services never meet the one it starts."""
    registry = tmp_path / "registry"
    data = tmp_path / "data"
    data.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("ORCH_SANDBOX_UID_BASE", "ORCH_MAX_USER_ID")}
    env["ORCH_UID_REGISTRY_DIR"] = str(registry)
    defaults = {"ORCH_UID_REGISTRY_DIR": str(registry), "ORCH_SANDBOX_UID_BASE": "100000", "ORCH_MAX_USER_ID": "1000000000"}
    with serve_process(str(data), free_port(), defaults) as url:
        assert httpx.get(f"{url}/healthz", timeout=10).json()["isolation"]["uid_block"] == [100000, 1000100000]
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'inner'}",
             "tests/orchestrator/tools/test_container_tools_api.py", "-k", "group_scenario"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout
