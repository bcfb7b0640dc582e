"""Tool calls that run to their end even when their caller went away (a bot that closed its
SSE stream, an MCP client that gave up): a call may already have acted in a sandbox, so it must
finish and record its outcome rather than be cancelled half-way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

_F = TypeVar("_F", bound="asyncio.Future[Any]")

# The loop keeps only weak references to tasks: these strong ones keep a call alive to its end.
_running: set[asyncio.Future[Any]] = set()


def keep_to_its_end(task: _F, on_done: Callable[[asyncio.Future[Any]], None] | None = None) -> _F:
    """Hold `task` until it is done (then call `on_done` with it); returns the task."""
    _running.add(task)

    def ended(done: asyncio.Future[Any]) -> None:
        _running.discard(done)
        if on_done is not None:
            on_done(done)

    task.add_done_callback(ended)
    return task
