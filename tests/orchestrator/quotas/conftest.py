"""Fixtures of the disk-quota tests. Loop images need root, loop devices and e2fsprogs: without
them these tests skip, except when ORCH_REQUIRE_LOOP=1 (CI, `.ci/run`): then they fail."""

from __future__ import annotations

import os

import pytest

from orchestrator.quotas.loopfs import loop_problem

REQUIRE_LOOP = os.environ.get("ORCH_REQUIRE_LOOP") == "1"


def loop_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "loop images need a root orchestrator"
    return loop_problem()


def require_loop() -> None:
    problem = loop_unavailable()
    if problem is None:
        return
    if REQUIRE_LOOP:
        pytest.fail(f"ORCH_REQUIRE_LOOP=1 but {problem}", pytrace=False)
    pytest.skip(problem)
