"""The orchestrator's Prometheus metrics (docs/operations.md says what each one means).

One registry of this process (not prometheus_client's global one, so importing a library that
registers its own collectors changes nothing here). Recording is a dict lookup and a lock-free
add in prometheus_client, cheap enough for the warm tool-call path; what costs more (sandboxes
by state, in-flight calls per user, disk usage) is computed only when /metrics is scraped, by
collectors that read state the orchestrator already keeps.

Disk and inode usage per volume (a user's places, share/, a group workspace) come from a seam:
`register_disk_usage(source)` takes a callable returning `VolumeUsage` rows; the composition
root registers the disk quotas' `all_usage` when a quota mechanism is in force, else the four
families stay empty.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from orchestrator.log import kv

log = logging.getLogger(__name__)

_R = TypeVar("_R")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

REGISTRY = CollectorRegistry(auto_describe=True)

# Tool latency spans 1 ms (a warm read_file) to the 600 s shell maximum.
_CALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)
_START_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
_WRITE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)

TOOL_CALLS = Counter(
    "orchestrator_tool_calls", "Tool calls that ended, by tool, backend (host for host tools) and outcome "
    "(ok or the error code).", ["tool", "backend", "outcome"], registry=REGISTRY,
)  # fmt: skip
TOOL_CALL_SECONDS = Histogram(
    "orchestrator_tool_call_seconds", "Latency of tool calls by tool and backend.", ["tool", "backend"],
    buckets=_CALL_BUCKETS, registry=REGISTRY,
)  # fmt: skip
SANDBOX_STARTS = Counter(
    "orchestrator_sandbox_starts", "Sandboxes made ready for a call: kind=cold (started, created or "
    "restarted) or resume (thawed from a pause).", ["backend", "kind"], registry=REGISTRY,
)  # fmt: skip
SANDBOX_START_SECONDS = Histogram(
    "orchestrator_sandbox_start_seconds", "How long a cold start or a resume took until the agent answered.",
    ["backend", "kind"], buckets=_START_BUCKETS, registry=REGISTRY,
)  # fmt: skip
SANDBOX_IDLE_ACTIONS = Counter(
    "orchestrator_sandbox_idle_actions", "Idle sandboxes paused or stopped by the reaper.", ["backend", "action"],
    registry=REGISTRY,
)  # fmt: skip
AUDIT_WRITE_SECONDS = Histogram(
    "orchestrator_audit_write_seconds", "Time to write one audit row (inside its transaction).",
    buckets=_WRITE_BUCKETS, registry=REGISTRY,
)  # fmt: skip
STATE_WRITE_SECONDS = Histogram(
    "orchestrator_state_write_seconds", "Duration of one state-store write transaction, from BEGIN IMMEDIATE "
    "(including the wait for the write lock) to COMMIT.", buckets=_WRITE_BUCKETS, registry=REGISTRY,
)  # fmt: skip
EGRESS_CONNECTIONS = Counter(
    "orchestrator_egress_connections", "Connections through the egress proxy that ended, by verdict "
    "(allowed, host_not_allowed, address_forbidden, cap, bad_request, upstream_failed, cut, peer_refused).",
    ["verdict"], registry=REGISTRY,
)  # fmt: skip
EGRESS_BYTES = Counter(
    "orchestrator_egress_bytes", "Bytes relayed by the egress proxy: direction=up (sandbox to upstream) "
    "or down.", ["direction"], registry=REGISTRY,
)  # fmt: skip
PREVIEW_CONNECTIONS = Counter(
    "orchestrator_preview_connections", "Visitor connections to preview URLs that ended, by outcome (relayed, "
    "not_found, port_not_listening, sandbox_unavailable, daily_bytes, descriptor_share_exceeded, cookie_minted, "
    "no_access_cookie, idle, ...).",
    ["outcome"], registry=REGISTRY,
)  # fmt: skip
PREVIEW_BYTES = Counter(
    "orchestrator_preview_bytes", "Bytes relayed for preview URLs: direction=up (visitor to app) or down.",
    ["direction"], registry=REGISTRY,
)  # fmt: skip
PREVIEW_LINKS = Counter(
    "orchestrator_preview_links", "Preview links made (action=created) or revoked (action=revoked).", ["action"],
    registry=REGISTRY,
)  # fmt: skip
TRANSFERS = Counter(
    "orchestrator_transfers", "Payload transfers (send_file, send_image, publish_artifact) admitted, or "
    "refused with busy for want of a slot.", ["outcome"], registry=REGISTRY,
)  # fmt: skip


# Outcome codes partly come from the sandbox agent, which a hostile sandbox can make lie: only
# this many distinct ones get a series of their own, later ones count as "other".
OUTCOME_LABELS_MAX = 64
_OUTCOME = re.compile(r"[a-z][a-z0-9_]{0,39}")
_outcomes: set[str] = set()
_outcomes_lock = threading.Lock()


def outcome_label(code: str) -> str:
    """A bounded label value for an outcome code: the code itself while it is a plain code and
    fewer than OUTCOME_LABELS_MAX have been seen, else "other"."""
    if code in _outcomes:
        return code
    if not _OUTCOME.fullmatch(code):
        return "other"
    with _outcomes_lock:
        if len(_outcomes) >= OUTCOME_LABELS_MAX:
            return "other"
        _outcomes.add(code)
    return code


def observe_egress(verdict: str, bytes_up: int, bytes_down: int) -> None:
    """One ended egress connection. The verdict is the proxy's own word, never the sandbox's."""
    EGRESS_CONNECTIONS.labels(outcome_label(verdict)).inc()
    if bytes_up:
        EGRESS_BYTES.labels("up").inc(bytes_up)
    if bytes_down:
        EGRESS_BYTES.labels("down").inc(bytes_down)


def observe_preview(outcome: str, bytes_up: int, bytes_down: int) -> None:
    """One ended preview connection (the outcome is the relay's own word)."""
    PREVIEW_CONNECTIONS.labels(outcome_label(outcome)).inc()
    if bytes_up:
        PREVIEW_BYTES.labels("up").inc(bytes_up)
    if bytes_down:
        PREVIEW_BYTES.labels("down").inc(bytes_down)


def observe_tool_call(tool: str, backend: str, outcome: str, seconds: float) -> None:
    TOOL_CALLS.labels(tool, backend, outcome_label(outcome)).inc()
    TOOL_CALL_SECONDS.labels(tool, backend).observe(seconds)


def observe_start(backend: str, kind: str, seconds: float) -> None:
    SANDBOX_STARTS.labels(backend, kind).inc()
    SANDBOX_START_SECONDS.labels(backend, kind).observe(seconds)


# --- what is computed at scrape time ---------------------------------------------------------


@dataclass(frozen=True)
class VolumeUsage:
    """One row of the disk seam: what a volume (a user's places, share/, a group workspace:
    `volume` names it) uses and may use. A quota of None = none enforced."""

    volume: str
    used_bytes: int
    quota_bytes: int | None
    used_inodes: int
    quota_inodes: int | None


def top_users(in_flight: Iterable[tuple[int, int]], n: int) -> tuple[list[tuple[str, int]], int]:
    """Pure: the `n` users with the most calls in flight (ties: lower id first) as label
    values, and the sum of the others: the label set stays bounded however many users run."""
    busy = sorted(((count, user) for user, count in in_flight if count > 0), key=lambda cu: (-cu[0], cu[1]))
    shown = [(str(user), count) for count, user in busy[:n]]
    return shown, sum(count for count, _ in busy[n:])


class _ScrapeCollector(Collector):
    """Asks the registered sources at scrape time; a failing source costs its families, never
    the whole scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.states: Callable[[], Iterable[tuple[str, str]]] | None = None  # (backend, state) per sandbox
        self.in_flight: Callable[[], Iterable[tuple[int, int]]] | None = None  # (user, calls)
        self.disk: Callable[[], Iterable[VolumeUsage]] | None = None
        self.top_n = 20

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            states, in_flight, disk, top_n = self.states, self.in_flight, self.disk, self.top_n
        by_state = GaugeMetricFamily("orchestrator_sandboxes", "Sandboxes by backend and state.", labels=["backend", "state"])
        counts: dict[tuple[str, str], int] = {}
        for key in _safely("sandbox states", states):
            counts[key] = counts.get(key, 0) + 1
        for (backend, state), count in sorted(counts.items()):
            by_state.add_metric([backend, state], count)
        yield by_state
        users = GaugeMetricFamily(
            "orchestrator_calls_in_flight", f"Tool calls in flight per user: the {top_n} users with the most, the "
            "rest summed under user=\"other\".", labels=["user"],
        )  # fmt: skip
        shown, rest = top_users(_safely("calls in flight", in_flight), top_n)
        for user, count in shown:
            users.add_metric([user], count)
        users.add_metric(["other"], rest)
        yield users
        families = {
            name: GaugeMetricFamily(f"orchestrator_disk_{name}", text, labels=["volume"])
            for name, text in (
                ("used_bytes", "Bytes a volume (a user's places, share/, a group workspace) uses."),
                ("quota_bytes", "That volume's disk quota in bytes."),
                ("used_inodes", "Inodes that volume uses."),
                ("quota_inodes", "That volume's inode quota."),
            )
        }
        for row in _safely("disk usage", disk):
            families["used_bytes"].add_metric([row.volume], row.used_bytes)
            families["used_inodes"].add_metric([row.volume], row.used_inodes)
            if row.quota_bytes is not None:
                families["quota_bytes"].add_metric([row.volume], row.quota_bytes)
            if row.quota_inodes is not None:
                families["quota_inodes"].add_metric([row.volume], row.quota_inodes)
        yield from families.values()


def _safely(what: str, source: Callable[[], Iterable[_R]] | None) -> list[_R]:
    if source is None:
        return []
    try:
        return list(source())
    except Exception as exc:  # a metrics source must never break the scrape
        log.warning("a metrics source failed %s", kv(source=what, error=exc))
        return []


_SCRAPE = _ScrapeCollector()
REGISTRY.register(_SCRAPE)


def register_sources(
    *,
    states: Callable[[], Iterable[tuple[str, str]]],
    in_flight: Callable[[], Iterable[tuple[int, int]]],
    top_n: int,
) -> None:
    """The composition root's sources of the scrape-time gauges (the latest service wins)."""
    with _SCRAPE._lock:
        _SCRAPE.states, _SCRAPE.in_flight, _SCRAPE.top_n = states, in_flight, top_n


def register_disk_usage(source: Callable[[], Iterable[VolumeUsage]] | None) -> None:
    """The seam for per-volume disk and inode usage (the disk quotas' `all_usage`, adapted by
    the composition root); None unregisters it."""
    with _SCRAPE._lock:
        _SCRAPE.disk = source


def exposition() -> bytes:
    """The Prometheus text of every metric, as /metrics serves it."""
    return generate_latest(REGISTRY)
