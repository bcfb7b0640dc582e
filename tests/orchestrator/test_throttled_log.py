"""Repeated errors cost a line per interval with their count, never a traceback each."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket

import pytest

from orchestrator.throttled_log import IntervalCounter, ThrottledLog, budget_loop_accept_errors


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_first_is_told_at_once_then_a_count_per_interval() -> None:
    clock = Clock()
    counter = IntervalCounter(10.0, clock)
    assert counter.note("a") == 1
    assert [counter.note("a") for _ in range(999)] == [0] * 999
    assert counter.note("b") == 1  # keys apart
    clock.now = 10.0
    assert counter.note("a") == 1000  # the 999 held back and this one
    assert counter.note("a") == 0
    clock.now = 25.0
    assert counter.note("a") == 2


def test_a_flood_of_accept_errors_on_a_loop_is_a_few_lines_without_traceback(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    throttled = ThrottledLog(logging.getLogger("test.accept"), 10.0, clock)
    loop = asyncio.new_event_loop()
    try:
        budget_loop_accept_errors(loop, throttled)
        listener = socket.socket()
        with caplog.at_level(logging.INFO):
            for i in range(5000):  # what asyncio's accept loop reports on EMFILE, as it reports it
                clock.now = i * 0.01
                loop.call_exception_handler({
                    "message": "socket.accept() out of system resource",
                    "exception": OSError(errno.EMFILE, "Too many open files"), "socket": listener,
                })  # fmt: skip
            loop.call_exception_handler({"message": "something else", "exception": ValueError("x")})
        listener.close()
    finally:
        loop.close()
    accept_lines = [r for r in caplog.records if "accept failed" in r.getMessage()]
    assert len(accept_lines) == 5  # at once, then one per 10 s of the 50 s
    assert all(r.exc_info is None for r in accept_lines)
    assert "error=EMFILE" in accept_lines[0].getMessage() and "count=1" in accept_lines[0].getMessage()
    assert "count=1000" in accept_lines[1].getMessage()
    # Anything else still reaches asyncio's own handler, traceback and all.
    assert any(r.exc_info is not None and "something else" in r.getMessage() for r in caplog.records)
