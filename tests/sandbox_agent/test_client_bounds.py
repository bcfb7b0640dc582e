"""Issue 12 item 6 and the peer check: the clients against a real Unix-socket server that lies
like a hostile sandbox could (tests/sandbox_agent/lying_agent.py), not a mock."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import psutil
import pytest

from sandbox_agent.client import AgentClient, AsyncAgentClient
from sandbox_agent.errors import AgentTimedOut, AgentToolError, AgentUnavailable, ToolFailure
from sandbox_agent.peer import ExpectedPeer
from sandbox_agent.tools.output import truncation_marker
from tests.sandbox_agent.lying_agent import lying_agent

AS_ROOT = os.geteuid() == 0
SANDBOX_UID = 100067
OTHER_UID = 100068


def call_with(kind: str, path: str, tool: str, **client_args: object):  # type: ignore[no-untyped-def]
    arguments = {"command": "x"} if tool == "shell" else {"path": "x"}
    if kind == "sync":
        with AgentClient(path, "t", **client_args) as client:  # type: ignore[arg-type]
            return client.call(tool, arguments, cwd="/", timeout_s=30)

    async def run():  # type: ignore[no-untyped-def]
        client = AsyncAgentClient(path, "t", **client_args)  # type: ignore[arg-type]
        try:
            return await client.call(tool, arguments, cwd="/", timeout_s=30)
        finally:
            client.close()

    return asyncio.run(run())


def refused(kind: str, path: str, tool: str) -> ToolFailure:
    """The failure of a call whose answer the client refuses: a value from the async client,
    raised by the sync façade."""
    if kind == "sync":
        with pytest.raises(AgentToolError) as info:
            call_with(kind, path, tool)
        return info.value.failure()
    failure = call_with(kind, path, tool)
    assert isinstance(failure, ToolFailure), failure
    return failure


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("mode", ["huge", "unannounced"])
def test_item6_a_300_mib_answer_is_refused_unread(traversable_tmp: Path, kind: str, mode: str) -> None:
    rss_before = psutil.Process().memory_info().rss
    with lying_agent(traversable_tmp, mode) as path:
        started = time.monotonic()
        failure = refused(kind, path, "shell")
        seconds = time.monotonic() - started
    grown_mib = (psutil.Process().memory_info().rss - rss_before) / 2**20
    assert failure.code == "output_too_large", failure.message
    assert grown_mib < 32 and seconds < 5, (grown_mib, seconds)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_item6_text_over_the_output_cap_is_cut_again_on_the_host(traversable_tmp: Path, kind: str) -> None:
    from sandbox_agent.answer_limits import DEFAULT_ANSWER_LIMITS

    cap = DEFAULT_ANSWER_LIMITS.output_cap_bytes
    with lying_agent(traversable_tmp, "overcap") as path:
        result = call_with(kind, path, "shell")
    assert result["stdout"] == "B" * cap + truncation_marker(1024 * 1024 - cap)
    assert result["truncated"] is True and result["stderr"] == ""


@pytest.mark.skipif(not AS_ROOT, reason="a listener of another uid needs root")
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_listener_of_another_uid_is_refused_before_anything_is_sent(traversable_tmp: Path, kind: str) -> None:
    with lying_agent(traversable_tmp, "health", uid=OTHER_UID) as path:
        with pytest.raises(AgentUnavailable) as info:
            call_with(kind, path, "read_file", expected_peer=ExpectedPeer(uid=SANDBOX_UID))
        assert info.value.delivered is False
        assert str(OTHER_UID) in info.value.message and str(SANDBOX_UID) in info.value.message
        with AgentClient(path, "t", expected_peer=ExpectedPeer(uid=OTHER_UID)) as client:  # the right uid: served
            assert client.health(timeout_s=5).build == "x"


@pytest.mark.parametrize("mode", ["streamflood", "streamforged"])
def test_a_streamed_shell_that_floods_or_forges_its_events_is_refused(traversable_tmp: Path, mode: str) -> None:
    """A streamed `shell` is bounded like any answer: output events past what the agent may
    stream are refused (not buffered), and an event of an unknown stream is not passed on."""
    seen: list[tuple[str, str]] = []
    rss_before = psutil.Process().memory_info().rss

    async def run():  # type: ignore[no-untyped-def]
        client = AsyncAgentClient(path, "t")
        try:
            return await client.stream("shell", {"command": "x"}, cwd="/", timeout_s=60, on_output=lambda s, t: seen.append((s, t)))
        finally:
            client.close()

    with lying_agent(traversable_tmp, mode) as path:
        if mode == "streamflood":
            failure = asyncio.run(run())
        else:
            with pytest.raises(AgentUnavailable):
                asyncio.run(run())
    if mode == "streamflood":
        assert isinstance(failure, ToolFailure) and failure.code == "output_too_large"
        assert (psutil.Process().memory_info().rss - rss_before) / 2**20 < 200
    else:
        assert seen == []


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_trickled_answer_ends_at_the_calls_deadline(traversable_tmp: Path, kind: str) -> None:
    """A byte now and then never trips a per-read timeout: the deadline is the whole call's (a
    host tool's thread waiting on a trickle is a thread every user shares)."""
    with lying_agent(traversable_tmp, "trickle") as path:
        started = time.monotonic()
        with pytest.raises(AgentTimedOut):
            if kind == "sync":
                with AgentClient(path, "t") as client:
                    client.health(timeout_s=1.0)
            else:
                async def run() -> None:
                    client = AsyncAgentClient(path, "t")
                    try:
                        await client.health(timeout_s=1.0)
                    finally:
                        client.close()

                asyncio.run(run())
        assert time.monotonic() - started < 3.0
