"""Recorded tool-call results: what makes a `tool_call_id` idempotent (docs/client.md).

A call that names a `tool_call_id` gets a row keyed by (run_id, tool_call_id), written in the
same transaction as its `started` audit row and completed with its outcome in the transaction
that completes that audit row. A repeat with the same key returns the recorded outcome, or
waits (bounded) for the running call, instead of running it again; the same key with another
tool or other arguments is a 409. Rows expire after a TTL and are swept on write, a few at a
time. A result larger than the size cap is not kept: repeats then get a tool error saying the
call ran and its result was not kept, never a second run. The same happens when the kept body
would not fit the host-copy budget of the run's runtime user, or the host is below its disk
watermark (`orchestrator/quotas/host_copies.py`): recorded bodies are charged to that user
until their rows are deleted.

The decisions are pure functions; `CallRecords` holds the SQL, `PendingCalls` the in-process
wake-ups of waiting repeats, and `Repeats` is the idempotency around the admission of a call
(`tools/admission.py`): the one place a repeat is recognised, answered or waited for.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any, TypeVar

from orchestrator.clock import iso
from orchestrator.errors import Conflict, RunEnded
from orchestrator.quotas.host_copies import HostCopies, HostCopyRefused
from orchestrator.sandboxes.agent_calls import call_timeout_s
from orchestrator.settings import CallSettings
from orchestrator.state_store import Transaction
from orchestrator.tools.admission import Admission, Admitted, Refused, Repeat

RUNNING, DONE = "running", "done"
SWEEP_BATCH = 100  # expired rows removed per write: the sweep never makes one call slow
# A repeat waits for the running call as long as the host waits for the sandbox's answer,
# and this much more (the call's own result write). A client waits longer still.
REPEAT_WAIT_MARGIN_S = 10.0


def repeat_wait_s(settings: CallSettings, tool: str, arguments: dict[str, Any]) -> float:
    return call_timeout_s(settings, tool, arguments) + REPEAT_WAIT_MARGIN_S


class ToolCallIdReused(Conflict):
    """The same (run, tool_call_id) was sent before with another tool or other arguments."""

    code = "tool_call_id_reused"


def arguments_digest(tool: str, arguments: dict[str, Any]) -> str:
    """What a repeat must match: the tool and its arguments, in canonical JSON."""
    canonical = json.dumps([tool, arguments], sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class CallRecord:
    run_id: str
    tool_call_id: str
    tool: str
    digest: str
    status: str
    body: dict[str, Any] | None
    instance: str
    expires_at: str


class RecordState(Enum):
    NEW = "new"  # no live record: run the call
    RECORDED = "recorded"  # finished before: answer its recorded body
    WAIT = "wait"  # running in this server: wait for it
    INTERRUPTED = "interrupted"  # left running by a server that is gone: it may have run


def decide(record: CallRecord | None, *, digest: str, instance: str, now: str) -> RecordState:
    """What a call with a tool_call_id does, given the live record of its key (pure)."""
    if record is None or record.expires_at <= now:
        return RecordState.NEW
    if record.digest != digest:
        raise ToolCallIdReused(
            f"tool_call_id {record.tool_call_id!r} was already used in this run for another call "
            f"({record.tool} with other arguments); use a new tool_call_id for a new call",
            field="tool_call_id",
            tool=record.tool,
        )
    if record.status == DONE:
        return RecordState.RECORDED
    return RecordState.WAIT if record.instance == instance else RecordState.INTERRUPTED


def interrupted_body(tool_call_id: str) -> dict[str, Any]:
    return {
        "ok": False,
        "error": {
            "code": "interrupted",
            "message": f"the call with tool_call_id {tool_call_id!r} was interrupted (the server stopped or the call "
            "failed) before its result was recorded; it may have run partly. Use a new tool_call_id to run it again",
        },
    }


def still_running_body(tool_call_id: str, waited_s: float) -> dict[str, Any]:
    return {
        "ok": False,
        "error": {
            "code": "in_progress",
            "message": f"the call with tool_call_id {tool_call_id!r} is still running after {waited_s:.0f} s of "
            "waiting; repeat it with the same tool_call_id later for its result",
        },
    }


def outcome_of(body: dict[str, Any]) -> str:
    return "ok" if body.get("ok") else (body.get("error") or {}).get("code", "error")


def kept_body(body: dict[str, Any], max_bytes: int) -> str:
    """The JSON kept for repeats: the body, or when larger than `max_bytes`, a tool error
    that says the call ran and how it ended (a repeat never runs it again)."""
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    if len(text.encode()) <= max_bytes:
        return text
    return json.dumps(not_kept_body(outcome_of(body), too_large_to_keep(max_bytes)))


def too_large_to_keep(max_bytes: int) -> str:
    return f"it was larger than {max_bytes} bytes (ORCH_TOOL_CALL_RESULT_MAX_BYTES)"


def not_kept_body(outcome: str, why: str) -> dict[str, Any]:
    """The tool error a repeat gets for a call whose result was not kept, and `why`."""
    return {
        "ok": False,
        "error": {
            "code": "result_not_kept",
            "message": f"the call ran (outcome {outcome}) but its result was not kept for repeats: {why}",
            "outcome": outcome,
        },
    }


def _expiry(now: datetime, ttl_s: float) -> str:
    return iso(now + timedelta(seconds=ttl_s))


class CallRecords:
    """The `tool_call_results` rows. Every method runs inside the caller's transaction."""

    def __init__(self, *, ttl_s: float, max_result_bytes: int, copies: HostCopies) -> None:
        self.ttl_s = ttl_s
        self.max_result_bytes = max_result_bytes
        self.copies = copies
        # Rows written by this server process; a running row of another instance is stale.
        self.instance = uuid.uuid4().hex

    @staticmethod
    def get_in(tx: Transaction, run_id: str, tool_call_id: str) -> CallRecord | None:
        row = tx.one(
            "SELECT run_id, tool_call_id, tool, digest, status, body, instance, expires_at FROM tool_call_results "
            "WHERE run_id = ? AND tool_call_id = ?",
            (run_id, tool_call_id),
        )
        if row is None:
            return None
        return CallRecord(
            run_id=row["run_id"],
            tool_call_id=row["tool_call_id"],
            tool=row["tool"],
            digest=row["digest"],
            status=row["status"],
            body=json.loads(row["body"]) if row["body"] is not None else None,
            instance=row["instance"],
            expires_at=row["expires_at"],
        )

    def start_in(self, tx: Transaction, run_id: str, tool_call_id: str, tool: str, digest: str, now: datetime) -> None:
        at = iso(now)
        self._delete_in(tx, "t.expires_at <= ? LIMIT ?", (at, SWEEP_BATCH))
        self._delete_in(tx, "t.run_id = ? AND t.tool_call_id = ?", (run_id, tool_call_id))  # an expired one, replaced
        tx.execute(
            "INSERT OR REPLACE INTO tool_call_results "
            "(run_id, tool_call_id, tool, digest, status, body, instance, started_at, expires_at) "
            "VALUES (?, ?, ?, ?, ?, NULL, ?, ?, ?)",
            (run_id, tool_call_id, tool, digest, RUNNING, self.instance, at, _expiry(now, self.ttl_s)),
        )

    def complete_in(
        self, tx: Transaction, run_id: str, tool_call_id: str, body: dict[str, Any], now: datetime, *, user_id: int
    ) -> None:
        """Record the call's outcome, charged to `user_id` (the run's runtime user); a body
        the user's host-copy budget or the host's disk cannot take is recorded as not kept."""
        text = kept_body(body, self.max_result_bytes)
        try:
            self.copies.charge(user_id, "results", len(text.encode()))
        except HostCopyRefused as refused:
            text = json.dumps(not_kept_body(outcome_of(body), refused.problem))
            self.copies.add(user_id, "results", len(text.encode()))  # a few hundred bytes: bounded by the TTL
        size = len(text.encode())
        tx.on_rollback(lambda: self.copies.release(user_id, "results", size))
        old = tx.one(
            "SELECT length(CAST(body AS BLOB)) AS bytes FROM tool_call_results WHERE run_id = ? AND tool_call_id = ?",
            (run_id, tool_call_id),
        )
        if old is not None and old["bytes"]:  # recorded before (an interrupted call): replaced
            tx.on_commit(lambda: self.copies.release(user_id, "results", old["bytes"]))
        # The TTL runs from the call's start: leaving expires_at alone spares an index update.
        tx.execute(
            "UPDATE tool_call_results SET status = ?, body = ?, completed_at = ? WHERE run_id = ? AND tool_call_id = ?",
            (DONE, text, iso(now), run_id, tool_call_id),
        )

    def sweep_in(self, tx: Transaction, now: datetime) -> int:
        return self._delete_in(tx, "t.expires_at <= ?", (iso(now),))

    def _delete_in(self, tx: Transaction, where: str, params: tuple[object, ...]) -> int:
        """Delete the rows `where` picks; once committed, their bodies' charges go back."""
        rows = tx.all(
            "SELECT t.rowid AS id, r.runtime_user_id AS user_id, length(CAST(t.body AS BLOB)) AS bytes "
            f"FROM tool_call_results t LEFT JOIN runs r ON r.run_id = t.run_id WHERE {where}",
            params,
        )
        if not rows:
            return 0
        tx.execute(f"DELETE FROM tool_call_results WHERE rowid IN ({', '.join('?' for _ in rows)})", [r["id"] for r in rows])
        charged = [(r["user_id"], r["bytes"]) for r in rows if r["user_id"] is not None and r["bytes"]]

        def release() -> None:
            for user_id, size in charged:
                self.copies.release(user_id, "results", size)

        tx.on_commit(release)
        return len(rows)

    @staticmethod
    def charged_usage(tx: Transaction) -> dict[tuple[int, str], int]:
        """What the recorded bodies take, per runtime user: the counters' start (one query)."""
        rows = tx.all(
            "SELECT r.runtime_user_id AS user_id, SUM(length(CAST(t.body AS BLOB))) AS bytes "
            "FROM tool_call_results t JOIN runs r ON r.run_id = t.run_id WHERE t.body IS NOT NULL "
            "GROUP BY r.runtime_user_id"
        )
        return {(row["user_id"], "results"): row["bytes"] or 0 for row in rows}


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class PendingCalls:
    """Calls with a tool_call_id running in this process, each with a future its repeats
    wait on (set from whichever thread completes the call)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[tuple[str, str], Future[None]] = {}

    def open(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._futures[key] = Future()

    def future(self, key: tuple[str, str]) -> Future[None] | None:
        with self._lock:
            return self._futures.get(key)

    def close(self, key: tuple[str, str]) -> None:
        with self._lock:
            future = self._futures.pop(key, None)
        if future is not None and not future.done():
            future.set_result(None)


_T = TypeVar("_T")
_REREAD_S = 0.01  # a record completed between its read and the wait: read it again this soon


class Repeats:
    """The idempotency of a `tool_call_id` within its run, as a wrapper around the admission
    of a call: `admit` turns a repeat into `Repeat` before it takes a slot or runs, `started`
    records a call that runs, `answer` waits (bounded) for a first call still running here.
    A tool that keys its own effect by (run, tool_call_id) answers its repeats itself (and
    may safely run again after a crash): it gets no record here."""

    def __init__(self, records: CallRecords) -> None:
        self.records = records
        self.pending = PendingCalls()

    def admit(
        self, tx: Transaction, admission: Refused | Admitted, *, run_id: str, name: str,
        raw_arguments: dict[str, Any], tool_call_id: str | None,
    ) -> Admission:  # fmt: skip
        if tool_call_id is None:
            return admission
        if isinstance(admission, Refused):
            if isinstance(admission.error, RunEnded):  # a repeat of a finished call still gets its answer
                body = self._finished(tx, run_id, name, raw_arguments, tool_call_id)
                return Repeat(body) if body is not None else admission
            return admission
        if admission.spec.keyed_by_call_id:
            return admission
        digest = arguments_digest(name, raw_arguments)
        record = self.records.get_in(tx, run_id, tool_call_id)
        state = decide(record, digest=digest, instance=self.records.instance, now=iso(utc_now()))
        if state is RecordState.RECORDED:
            assert record is not None and record.body is not None
            return Repeat(record.body)
        if state is RecordState.INTERRUPTED:
            return Repeat(interrupted_body(tool_call_id))
        if state is RecordState.WAIT:
            return Repeat(None)
        return replace(admission, tool_call_id=tool_call_id, digest=digest)

    def _finished(
        self, tx: Transaction, run_id: str, name: str, raw_arguments: dict[str, Any], tool_call_id: str
    ) -> dict[str, Any] | None:
        record = self.records.get_in(tx, run_id, tool_call_id)
        if record is None or record.body is None:
            return None
        digest = arguments_digest(name, raw_arguments)
        if decide(record, digest=digest, instance=self.records.instance, now=iso(utc_now())) is not RecordState.RECORDED:
            return None
        return record.body

    def started(self, tx: Transaction, run_id: str, call: Admitted) -> None:
        """Record the call as running, in the transaction of its `started` audit row; its
        repeats in this process wait for it from before the commit."""
        assert call.tool_call_id is not None
        self.records.start_in(tx, run_id, call.tool_call_id, call.spec.name, call.digest, utc_now())
        self.pending.open((run_id, call.tool_call_id))

    def completed(self, run_id: str, tool_call_id: str) -> None:
        """Wake the call's waiting repeats (its record is complete, or will never be)."""
        self.pending.close((run_id, tool_call_id))

    async def answer(
        self, run_id: str, tool_call_id: str | None, wait_s: Callable[[], float],
        attempt: Callable[[], Awaitable[_T | Repeat]],
    ) -> _T | dict[str, Any]:  # fmt: skip
        """`attempt` (admit, and run when admitted); a repeat answers the first call's result
        body, waiting up to `wait_s()` for one still running here (then `in_progress`)."""
        waited_from: float | None = None
        while True:
            answer = await attempt()
            if not isinstance(answer, Repeat):
                return answer
            if answer.body is not None:
                return answer.body
            assert tool_call_id is not None  # only a call with an id is a repeat
            now = time.monotonic()
            waited_from = now if waited_from is None else waited_from
            left = waited_from + wait_s() - now
            if left <= 0:
                return still_running_body(tool_call_id, now - waited_from)
            future = self.pending.future((run_id, tool_call_id))
            if future is None:  # completed between the read and now: read it again
                await asyncio.sleep(_REREAD_S)
                continue
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), left)
            except asyncio.TimeoutError:
                pass
