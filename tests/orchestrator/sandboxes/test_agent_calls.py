"""How long the host waits for an agent's answer (orchestrator/sandboxes/agent_calls.py): pure."""

from __future__ import annotations

from pathlib import Path

from orchestrator.client import tool_call_timeout_s
from orchestrator.sandboxes.agent_calls import SHELL_MARGIN_S, call_timeout_s
from sandbox_agent.wire import KERNEL_START_MARGIN_S
from orchestrator.settings import CallSettings
from tests.conftest import make_settings


def test_run_code_waits_for_its_timeout_and_a_kernel_start(tmp_path: Path) -> None:
    settings = CallSettings.of(make_settings(tmp_path, tool_timeout_s=60, tool_timeout_max_s=600, agent_call_timeout_s=30))
    assert call_timeout_s(settings, "shell", {"timeout_s": 5}) == 5 + SHELL_MARGIN_S
    assert call_timeout_s(settings, "run_code", {"timeout_s": 5}) == 5 + SHELL_MARGIN_S + KERNEL_START_MARGIN_S
    assert call_timeout_s(settings, "run_code", {"timeout_s": 9999}) == 600 + SHELL_MARGIN_S + KERNEL_START_MARGIN_S
    assert call_timeout_s(settings, "run_code", {}) == 60 + SHELL_MARGIN_S + KERNEL_START_MARGIN_S
    assert call_timeout_s(settings, "kernel_restart", {}) == 30 + KERNEL_START_MARGIN_S
    assert call_timeout_s(settings, "kernel_list", {}) == 30


def test_the_client_waits_longer_than_the_server() -> None:
    for arguments in ({"timeout_s": 5}, {"timeout_s": 600}, {}):
        assert tool_call_timeout_s("run_code", arguments, 60.0) > tool_call_timeout_s("shell", arguments, 60.0)
    assert tool_call_timeout_s("run_code", {"timeout_s": 600}, 60.0) == 600 + 60 + 60
    assert tool_call_timeout_s("kernel_restart", {}, 60.0) == 120.0
