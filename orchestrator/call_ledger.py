"""The calls in flight in this process, in one ledger: every question about them is answered
here, and each place a call passes enters it the one way (`CallLedger.holding`, a context
manager; `take` when the hold outlives the block that decides it).

What a call holds, and the question each answers:
- `RunCall(run_id)`: the dispatcher, for the whole call. A run with one is not idle:
  `end_if_idle` ends a run only when none is under way, and none starts meanwhile.
- `UserCall(user_id)`: the acting user's call slot (`ORCH_USER_MAX_CONCURRENT_CALLS`): one
  over the cap is refused with `busy` at once. `per_user` is what /metrics shows.
- `RoutedCall(user_id, run_id, session_id)`: the router, from choosing the sandbox to the
  answer. A cancelled run or session refuses it (`cancelled`) before it reaches a sandbox;
  a cancel waits until `routed` says none is left; `users_of`, `sessions_of`.
- `SandboxCall(sandbox)`: one attempt on one sandbox's agent. A paused sandbox refuses it
  (`SandboxPaused`); the reaper pauses or stops only a sandbox with none (`SandboxEntry`).

The agent inside the sandbox keeps its own registry of the calls it runs (another process);
the host never needs it for these questions. Thread-safe: calls are counted on the event loop
and in worker threads. Nothing runs under a lock but counting.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Union

from orchestrator.errors import ToolError

REMEMBERED_CANCELS = 10_000


class SandboxPaused(Exception):
    """A call found its agent paused after it was handed out; it never reached the agent."""


class SandboxEntry:
    """One sandbox in the ledger: its calls in flight, when it was last used, whether the
    reaper froze it, and the background processes its agent last reported. Its own lock makes
    `pause_if_idle` atomic with a `SandboxCall` on it (a sandbox's questions never wait for
    another sandbox's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.in_flight = 0
        self.last_used = time.monotonic()
        self.paused = False  # frozen by the reaper: no call may go to it until it is resumed
        # Background processes running in the sandbox as its agent last said (None: not known
        # yet, e.g. a container adopted after a restart). `runs_processes` is the one reader.
        self.processes: int | None = 0
        # No process the host started can run past this (monotonic): the agent kills each at
        # its maximum runtime. A sandbox that lies about its count is busy no longer than that.
        self.processes_until = 0.0

    def note_processes(self, count: int | None, *, started_for_s: float | None = None) -> None:
        """The agent's count; `started_for_s`: a process was just started (or may be running,
        unknown) for at most this long."""
        with self._lock:
            self.processes = count
            if started_for_s is not None:
                self.processes_until = max(self.processes_until, time.monotonic() + started_for_s)

    @property
    def busy(self) -> bool:
        """A call in flight, or background processes (by the last count): not idle, and not
        to be restarted for a plan or BUILD change."""
        return self.in_flight > 0 or (self.processes != 0 and time.monotonic() <= self.processes_until)

    def touch(self) -> None:
        with self._lock:
            self.last_used = time.monotonic()

    def pause_if_idle(self) -> bool:
        """Mark the sandbox paused unless a call is in flight, atomically with `SandboxCall`:
        after True no call reaches it until `unpause`, so none can be sent to a frozen agent."""
        with self._lock:
            if self.in_flight:
                return False
            self.paused = True
            return True

    def unpause(self) -> None:
        with self._lock:
            self.paused = False
            self.last_used = time.monotonic()  # the pause clock restarts from the call that woke it

    def _enter(self) -> None:
        with self._lock:
            if self.paused:  # handed out just before the reaper froze it: the request was not sent
                raise SandboxPaused()
            self.in_flight += 1

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1
            self.last_used = time.monotonic()


@dataclass(frozen=True)
class RunCall:
    run_id: str


@dataclass(frozen=True)
class UserCall:
    user_id: int


@dataclass(frozen=True)
class RoutedCall:
    user_id: int
    run_id: str | None = None
    session_id: str | None = None

    def keys(self) -> list[tuple[str, str]]:
        return _keys(self.run_id, self.session_id)


@dataclass(frozen=True, eq=False)
class SandboxCall:
    sandbox: SandboxEntry


Claim = Union[RunCall, UserCall, RoutedCall, SandboxCall]


def _keys(run_id: str | None, session_id: str | None) -> list[tuple[str, str]]:
    return [(kind, value) for kind, value in (("run", run_id), ("session", session_id)) if value]


class Held:
    """A claim held in the ledger until `release` (once; later calls do nothing)."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


class CallLedger:
    def __init__(self, *, user_max_calls: int = 8) -> None:
        self.user_max_calls = user_max_calls
        self._lock = threading.Lock()
        self._runs: Counter[str] = Counter()
        self._users: Counter[int] = Counter()
        self._routed: Counter[tuple[int, tuple[str, str]]] = Counter()
        self._cancelled: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._ending: dict[str, threading.Event] = {}  # runs `end_if_idle` is ending right now

    # The one way in and out.

    @contextmanager
    def holding(self, claim: Claim) -> Iterator[None]:
        held = self.take(claim)
        try:
            yield
        finally:
            held.release()

    def take(self, claim: Claim) -> Held:
        """Count `claim` now, or raise its refusal (`ToolError` busy / cancelled,
        `SandboxPaused`) counting nothing."""
        if isinstance(claim, SandboxCall):
            return _take_sandbox(claim.sandbox)
        if isinstance(claim, RunCall):
            self._enter_run(claim.run_id)
        elif isinstance(claim, UserCall):
            with self._lock:
                if self._users[claim.user_id] >= self.user_max_calls:
                    raise self.busy_error(claim.user_id)
                self._users[claim.user_id] += 1
        else:
            keys = claim.keys()
            with self._lock:
                refused = next((key for key in keys if key in self._cancelled), None)
                if refused is None:
                    for key in keys:
                        self._routed[(claim.user_id, key)] += 1
            if refused is not None:
                raise ToolError("cancelled", f"The {refused[0]} {refused[1]} ended or was deleted: the tool did not run.")
        return Held(lambda: self._leave(claim))

    def _enter_run(self, run_id: str) -> None:
        while True:
            with self._lock:
                ending = self._ending.get(run_id)
                if ending is None:
                    self._runs[run_id] += 1
                    return
            # Being ended as idle right now: once that is done the call goes on (and is refused
            # like any call of an ended run, or runs when the run was kept).
            ending.wait()

    def _leave(self, claim: Claim) -> None:
        with self._lock:
            if isinstance(claim, RunCall):
                _decrement(self._runs, claim.run_id)
            elif isinstance(claim, UserCall):
                _decrement(self._users, claim.user_id)
            elif isinstance(claim, RoutedCall):
                for key in claim.keys():
                    _decrement(self._routed, (claim.user_id, key))

    # Per run (the idle-run sweeper).

    def end_if_idle(self, run_id: str, end: Callable[[], object]) -> bool:
        """Do `end` if the run has no call under way, with no call starting meanwhile (one
        that comes waits until `end` is done). False: a call is under way."""
        with self._lock:
            if self._runs[run_id] > 0 or run_id in self._ending:
                return False
            ending = self._ending[run_id] = threading.Event()
        try:
            end()
        finally:
            with self._lock:
                del self._ending[run_id]
            ending.set()
        return True

    def run_calls(self, run_id: str) -> int:
        with self._lock:
            return self._runs[run_id]

    # Per user (call slots, /metrics).

    def per_user(self) -> list[tuple[int, int]]:
        """(user, calls holding a slot) of every user with one: what /metrics shows (top N)."""
        with self._lock:
            return list(self._users.items())

    def user_calls(self, user_id: int) -> int:
        with self._lock:
            return self._users[user_id]

    def busy_error(self, user_id: int) -> ToolError:
        cap = self.user_max_calls
        return ToolError(
            "busy",
            f"User {user_id} already has {cap} tool calls running, the most one user may have at once "
            f"(ORCH_USER_MAX_CONCURRENT_CALLS={cap}); other calls of this user are still running. This "
            "call did not run: wait for one of them to finish, then try again.",
        )

    # Per run or session as routed to sandboxes (cancels, the egress proxy).

    def cancel(self, run_id: str | None, session_id: str | None) -> None:
        """From now on a `RoutedCall` of this run or session is refused (remembered in memory
        only, bounded: after a restart the state DB refuses them at dispatch)."""
        with self._lock:
            for key in _keys(run_id, session_id):
                self._cancelled[key] = None
                self._cancelled.move_to_end(key)
            while len(self._cancelled) > REMEMBERED_CANCELS:
                self._cancelled.popitem(last=False)

    def routed(self, user_id: int, run_id: str | None, session_id: str | None) -> int:
        """The user's routed calls for this run or session (each counted once per id it names)."""
        keys = _keys(run_id, session_id)
        with self._lock:
            return sum(self._routed.get((user_id, key), 0) for key in keys)

    def users_of(self, run_id: str | None, session_id: str | None) -> set[int]:
        """The users with routed calls for this run or session."""
        keys = set(_keys(run_id, session_id))
        with self._lock:
            return {user_id for user_id, key in self._routed if key in keys}

    def sessions_of(self, user_id: int) -> set[str]:
        """The sessions the user's routed calls are for (the egress proxy: a credential
        delegated in one session applies only while no call of another session runs)."""
        with self._lock:
            return {key[1] for uid, key in self._routed if uid == user_id and key[0] == "session"}


def _take_sandbox(sandbox: SandboxEntry) -> Held:
    sandbox._enter()
    return Held(sandbox._leave)


@contextmanager
def on_sandbox(sandbox: SandboxEntry) -> Iterator[None]:
    """`CallLedger.holding(SandboxCall(sandbox))` where no ledger is at hand: a sandbox's count
    lives in its entry, so its hold needs none of the ledger's tables."""
    held = _take_sandbox(sandbox)
    try:
        yield
    finally:
        held.release()


def _decrement(counter: Counter, key: object) -> None:  # type: ignore[type-arg]
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
