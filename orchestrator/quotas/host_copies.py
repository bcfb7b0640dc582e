"""Host-side copies of what a user's sandbox produced, charged to that user (docs/disk-quotas.md).

Three kinds live on the data filesystem, outside every user's disk quota:
- `deliveries`: the bytes of `send_file` / `send_image` in `outbox/`, until the bot deletes
  them or they expire;
- `results`: the bodies recorded for calls with a `tool_call_id` in `state/`, until they expire;
- `transfers`: spool files of transfers in flight (a send streaming into the outbox, a large
  `read_bytes` answer on its way to the caller), until the transfer ends.

Each user has one budget for the three together (ORCH_USER_HOST_COPIES_MB). A copy is
charged before its bytes are written, piece by piece as it grows, so a copy that would pass the
budget mid-stream is refused and its caller removes what it wrote; below the host watermark
every new charge is refused. The counters live in memory (no scan per call), rebuilt from the
state store at start; `host_copy_problem` decides, `HostCopies` counts.
"""

from __future__ import annotations

import errno
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from mounts.fs.spool import SpoolWriteFailed
from orchestrator.errors import ToolError
from orchestrator.quotas.model import MIB

Kind = Literal["deliveries", "results", "transfers"]
KINDS: tuple[Kind, ...] = ("deliveries", "results", "transfers")
SETTING = "ORCH_USER_HOST_COPIES_MB"


@dataclass(frozen=True)
class HostCopyUsage:
    """One user's host-side copies, in bytes."""

    deliveries: int = 0
    results: int = 0
    transfers: int = 0

    @property
    def total(self) -> int:
        return self.deliveries + self.results + self.transfers

    def summary(self, budget: int) -> str:
        """`6.0 of 8.0 MiB: deliveries 6.0 MiB, recorded results 0.0 MiB, transfers 0.0 MiB`."""
        return (
            f"{self.total / MIB:.1f} of {budget / MIB:.1f} MiB: deliveries {self.deliveries / MIB:.1f} MiB, "
            f"recorded results {self.results / MIB:.1f} MiB, transfers {self.transfers / MIB:.1f} MiB"
        )


def host_copy_problem(usage: HostCopyUsage, *, adding: int, budget: int) -> str | None:
    """Why `adding` more bytes do not fit the user's budget (None: they do). Pure."""
    if usage.total + adding <= budget:
        return None
    return f"your host storage for copies out of your sandbox is full ({usage.summary(budget)}; {SETTING})"


def how_to_free(next_delivery_expiry: str | None, result_ttl_s: float) -> str:
    """What frees a user's host copies, in words a model can act on (pure)."""
    waiting = (
        f"your oldest one expires at {next_delivery_expiry}" if next_delivery_expiry else "you have none waiting"
    )
    return (
        "Deliveries are freed once the chat bot has posted and deleted them, or when they expire "
        f"({waiting}); recorded tool results expire {result_ttl_s / 3600:g} h after their call. "
        "Try again after that, or with a smaller file."
    )


class HostCopyRefused(SpoolWriteFailed):
    """A copy refused: over the user's budget (`no_space`) or below the host watermark
    (`host_disk_low`). A `SpoolWriteFailed`, so a sink raising it mid-stream stops the transfer
    the way a full disk does, and the transfer's temp file is removed."""

    def __init__(self, code: str, problem: str, how_to_free: Callable[[], str]) -> None:
        super().__init__(OSError(errno.ENOSPC, problem))
        self.code = code
        self.problem = problem
        self._how_to_free = how_to_free  # asked only for a tool error: it may read the state store

    def tool_error(self, tool: str) -> ToolError:
        return ToolError(
            self.code, f"{tool} was refused: {self.problem}. Nothing was sent or kept. {self._how_to_free()}"
        )


# What frees the host's disk (the watermark): not the user's to do.
HOST_LOW_HOW_TO_FREE = "The host's disk is nearly full; try again once the operator has freed space."


class HostCopies:
    """The per-user counters of host-side copies. Thread-safe: host tools run in worker
    threads, read_bytes spools on the event loop."""

    def __init__(
        self,
        *,
        budget_bytes: int,
        watermark: Callable[[], str | None],
        how_to_free: Callable[[int], str] = lambda user_id: "Wait for your earlier copies to expire.",
    ) -> None:
        self.budget_bytes = budget_bytes
        self._watermark = watermark  # the host's free-space problem, None when enough is free
        self.how_to_free = how_to_free  # the user's way out, in words (the composition root's)
        self._lock = threading.Lock()
        self._used: Counter[tuple[int, Kind]] = Counter()

    def rebuild(self, usage: Mapping[tuple[int, Kind], int]) -> None:
        """Start from what the state store says is on disk (at start)."""
        with self._lock:
            self._used = Counter({key: size for key, size in usage.items() if size > 0})

    def usage(self, user_id: int) -> HostCopyUsage:
        with self._lock:
            return self._usage(user_id)

    def _usage(self, user_id: int) -> HostCopyUsage:
        return HostCopyUsage(**{kind: self._used[(user_id, kind)] for kind in KINDS})

    def check(self, user_id: int, adding: int = 1) -> None:
        """Before a copy starts: raise `HostCopyRefused` when `adding` bytes would not fit."""
        self._charge(user_id, None, adding)

    def charge(self, user_id: int, kind: Kind, size: int) -> None:
        """Count `size` more bytes of the user's, or raise `HostCopyRefused` (nothing counted)."""
        self._charge(user_id, kind, size)

    def _charge(self, user_id: int, kind: Kind | None, size: int) -> None:
        problem = self._watermark()
        if problem is not None:
            raise HostCopyRefused("host_disk_low", problem, lambda: HOST_LOW_HOW_TO_FREE)
        with self._lock:
            problem = host_copy_problem(self._usage(user_id), adding=size, budget=self.budget_bytes)
            if problem is None and kind is not None:
                self._used[(user_id, kind)] += size
        if problem is not None:
            raise HostCopyRefused("no_space", problem, lambda: self.how_to_free(user_id))

    def add(self, user_id: int, kind: Kind, size: int) -> None:
        """Count bytes already written (a record kept as it was decided); never refuses."""
        with self._lock:
            self._used[(user_id, kind)] += size

    def release(self, user_id: int, kind: Kind, size: int) -> None:
        with self._lock:
            key = (user_id, kind)
            self._used[key] = max(0, self._used[key] - size)
            if not self._used[key]:
                del self._used[key]

    def move(self, user_id: int, source: Kind, target: Kind, size: int) -> None:
        """A transfer's bytes became a delivery: the same bytes, counted under another kind."""
        with self._lock:
            self._used[(user_id, source)] = max(0, self._used[(user_id, source)] - size)
            self._used[(user_id, target)] += size


class ChargedWrites:
    """The meter of one spool: each write charged to the user as `transfers` before it is
    written, given back on a start-over or when the spool ends uncommitted."""

    def __init__(self, copies: HostCopies, user_id: int) -> None:
        self._copies = copies
        self.user_id = user_id
        self.charged = 0

    def __call__(self, delta: int) -> None:
        if delta > 0:
            self._copies.charge(self.user_id, "transfers", delta)
        elif delta < 0:
            self._copies.release(self.user_id, "transfers", -delta)
        self.charged += delta

    def settle(self, *, kept_as: Kind | None) -> None:
        """The spool ended: its bytes are now `kept_as` (a delivery), or gone."""
        charged, self.charged = self.charged, 0
        if kept_as is None:
            self._copies.release(self.user_id, "transfers", charged)
        else:
            self._copies.move(self.user_id, "transfers", kept_as, charged)
