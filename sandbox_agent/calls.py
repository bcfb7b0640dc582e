"""The agent's calls in flight, with the run and session each was made for, so that ending a
run or deleting a session can stop its calls (`POST /v1/calls/cancel`): their process trees
are killed and the cancel answers once they have ended.

A cancelled run or session is remembered (a bounded set), so a call for it that was still on
its way when the cancel came is refused instead of running after the cleanup.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from sandbox_agent import process_tree
from sandbox_agent.wire import CallContext

REMEMBERED_CANCELS = 4096
CANCEL_WAIT_S = 10.0


class CallCancelled(Exception):
    """The call's run or session was cancelled before it started."""


def cancelled_message(context: CallContext | None) -> str:
    what = []
    if context is not None and context.run_id:
        what.append(f"run {context.run_id}")
    if context is not None and context.session_id:
        what.append(f"session {context.session_id}")
    return (
        f"The call was stopped: its {' / '.join(what) or 'run'} ended or was deleted, and its "
        "processes were killed."
    )


class InFlightCall:
    """One call in flight. A shell attaches its process tree so a cancel can kill it."""

    def __init__(self, context: CallContext | None) -> None:
        self.context = context
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._cancelled = False
        self._tree: process_tree.Leader | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def attach(self, leader: process_tree.Leader) -> bool:
        """Note the call's shell; False when the call is already cancelled (kill it now)."""
        with self._lock:
            self._tree = leader
            return not self._cancelled

    def detach(self) -> None:
        with self._lock:
            self._tree = None

    def cancel(self, kill: Callable[[process_tree.Leader], object]) -> None:
        with self._lock:
            self._cancelled = True
            tree = self._tree
        if tree is not None:
            kill(tree)

    def matches(self, run_id: str | None, session_id: str | None) -> bool:
        context = self.context
        if context is None:
            return False
        return bool(
            (run_id is not None and context.run_id == run_id)
            or (session_id is not None and context.session_id == session_id)
        )


class CallRegistry:
    def __init__(self, kill: Callable[[process_tree.Leader], object] = process_tree.kill_call) -> None:
        self._kill = kill
        self._lock = threading.Lock()
        self._calls: set[InFlightCall] = set()
        self._cancelled: OrderedDict[tuple[str, str], None] = OrderedDict()

    def begin(self, context: CallContext | None) -> InFlightCall:
        """Register a call; `CallCancelled` when its run or session was cancelled already."""
        call = InFlightCall(context)
        with self._lock:
            if context is not None and self._was_cancelled(context):
                raise CallCancelled(cancelled_message(context))
            self._calls.add(call)
        return call

    def end(self, call: InFlightCall) -> None:
        with self._lock:
            self._calls.discard(call)
        call.done.set()

    def _was_cancelled(self, context: CallContext) -> bool:
        keys = (("run", context.run_id), ("session", context.session_id))
        return any(value is not None and (kind, value) in self._cancelled for kind, value in keys)

    def _remember(self, kind: str, value: str | None) -> None:
        if value is None:
            return
        self._cancelled[(kind, value)] = None
        self._cancelled.move_to_end((kind, value))
        while len(self._cancelled) > REMEMBERED_CANCELS:
            self._cancelled.popitem(last=False)

    def cancel(self, run_id: str | None, session_id: str | None, *, wait_s: float = CANCEL_WAIT_S) -> int:
        """Kill the process trees of the matching calls and wait until they have ended;
        returns how many there were."""
        with self._lock:
            self._remember("run", run_id)
            self._remember("session", session_id)
            matching = [call for call in self._calls if call.matches(run_id, session_id)]
        for call in matching:
            call.cancel(self._kill)
        deadline = time.monotonic() + wait_s
        for call in matching:
            call.done.wait(max(0.0, deadline - time.monotonic()))
        return len(matching)
