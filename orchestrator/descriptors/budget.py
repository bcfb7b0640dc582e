"""The server's file-descriptor budget: how the process's RLIMIT_NOFILE is split, and whether
one more descriptor-holding thing (an egress connection, an SSE or MCP stream) may open.

Every descriptor the process may hold is one of three kinds: the reserve (the API's own
connections and requests, /healthz, SQLite, logs, the backends' clients: never lent out), a
feature pool (egress connections; streamed responses; preview connections), and what none claims. Each user may
take at most its share of each pool, and the pools together never exceed what the reserve
leaves, so no user (and no number of users) can run the process out of descriptors.

`plan_budget` and `decide` are pure; `DescriptorBudget` keeps the counts (thread-safe: the
egress proxy's loop and the HTTP loop both take from it) and hands out `DescriptorHold`s.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from orchestrator.errors import OrchestratorError

if TYPE_CHECKING:
    from orchestrator.settings import DescriptorSettings


class Feature(str, Enum):
    EGRESS = "egress"  # a connection of a sandbox through the egress proxy
    STREAMS = "streams"  # a streamed HTTP answer (shell SSE, MCP progress streams)
    PREVIEWS = "previews"  # a visitor's connection to a preview URL (docs/previews.md)


# What one unit costs, in descriptors (the budget counts descriptors, not connections).
EGRESS_PENDING_COST = 2  # the Unix connection from the forwarder and the TCP one it hands over
# Then the upstream socket and the relay's splice pipe (two ends) per direction, less the Unix
# connection closed after the handoff: 2 - 1 + 1 + 4 = 6 in all.
EGRESS_TUNNEL_EXTRA = 4
STREAM_COST = 2  # the client's connection and the call to the sandbox's agent
# The visitor's connection, the tunnel through the sandbox's agent, and the relay's two splice
# pipes (two ends each).
PREVIEW_COST = 6
UNIT_COST = {
    Feature.EGRESS: EGRESS_PENDING_COST + EGRESS_TUNNEL_EXTRA, Feature.STREAMS: STREAM_COST, Feature.PREVIEWS: PREVIEW_COST,
}

RESERVE_MIN = 256


class BudgetSettingsError(ValueError):
    """The budget settings do not fit the process's descriptor limit; the text says which."""


@dataclass(frozen=True)
class BudgetPlan:
    limit: int  # RLIMIT_NOFILE (soft) of the process
    reserve: int  # never lent to a feature
    pools: dict[Feature, int]  # descriptors each feature may hold in all
    user_shares: dict[Feature, int]  # descriptors one user may hold of each pool

    def as_json(self) -> dict[str, object]:
        return {
            "limit": self.limit,
            "reserve": self.reserve,
            "pools": {f.value: n for f, n in self.pools.items()},
            "user_shares": {f.value: n for f, n in self.user_shares.items()},
        }


def plan_budget(
    limit: int, *, reserve: int | None, pool_pct: dict[Feature, float], user_pct: float
) -> BudgetPlan:
    """Split `limit`: the reserve (unset: a quarter of the limit, at least RESERVE_MIN), then
    each pool its percentage of the rest, each user its percentage of each pool. Raises
    BudgetSettingsError when the split leaves a pool or a user share too small to hold one
    unit of its feature, or the pools add up to more than the rest."""
    if reserve is None:
        reserve = max(RESERVE_MIN, limit // 4)
    if reserve >= limit:
        raise BudgetSettingsError(
            f"the descriptor reserve ({reserve}, ORCH_FD_RESERVE) must be below the process's descriptor limit "
            f"({limit}): raise ORCH_FD_LIMIT (and the hard limit, `ulimit -Hn`) or lower the reserve"
        )
    if sum(pool_pct.values()) > 100:
        raise BudgetSettingsError(
            f"the descriptor pools take {sum(pool_pct.values()):g} % (ORCH_FD_EGRESS_PCT + ORCH_FD_STREAMS_PCT "
            "+ ORCH_FD_PREVIEWS_PCT): "
            "at most 100 %"
        )
    lendable = limit - reserve
    pools = {feature: int(lendable * pct / 100) for feature, pct in pool_pct.items()}
    shares = {feature: int(pools[feature] * user_pct / 100) for feature in pools}
    for feature, share in shares.items():
        if share < UNIT_COST[feature]:
            raise BudgetSettingsError(
                f"one user's share of the {feature.value} descriptors would be {share} (of a pool of {pools[feature]} "
                f"out of a limit of {limit} less a reserve of {reserve}), less than the {UNIT_COST[feature]} one "
                f"{feature.value} connection needs: raise ORCH_FD_LIMIT, or the pool's or the user's percentage"
            )
    return BudgetPlan(limit=limit, reserve=reserve, pools=pools, user_shares=shares)


def plan_for(limit: int, settings: DescriptorSettings) -> BudgetPlan:
    """The plan the ORCH_FD_* settings give for a process whose limit is `limit`."""
    return plan_budget(
        limit,
        reserve=settings.reserve,
        pool_pct={
            Feature.EGRESS: settings.egress_pct,
            Feature.STREAMS: settings.streams_pct,
            Feature.PREVIEWS: settings.previews_pct,
        },
        user_pct=settings.user_pct,
    )


class DescriptorsRefused(OrchestratorError):
    """One more descriptor-holding connection would pass a budget; nothing was opened."""

    status_code = 503
    code = "descriptors_exhausted"


class DescriptorShareExceeded(DescriptorsRefused):
    status_code = 429
    code = "descriptor_share_exceeded"


def decide(plan: BudgetPlan, feature: Feature, *, pool_used: int, user_used: int, count: int) -> DescriptorsRefused | None:
    """Pure: None when `count` more descriptors of `feature` fit both the user's share and the
    pool, else the refusal to give (the user's share is checked first: it is the user's own
    doing, and says what the user can do about it)."""
    share, pool = plan.user_shares[feature], plan.pools[feature]
    if user_used + count > share:
        return DescriptorShareExceeded(
            f"this user already holds {user_used} of its {share} server descriptors for {feature.value}; "
            "close some connections (or let them finish) and retry",
            feature=feature.value,
        )
    if pool_used + count > pool:
        return DescriptorsRefused(
            f"the server's {pool} descriptors for {feature.value} are all in use (by every user together); retry shortly",
            feature=feature.value,
        )
    return None


class DescriptorBudget:
    def __init__(self, plan: BudgetPlan) -> None:
        self.plan = plan
        self._lock = threading.Lock()
        self._pool_used: Counter[Feature] = Counter()
        self._user_used: dict[Feature, Counter[int]] = {feature: Counter() for feature in plan.pools}
        self.refused: Counter[str] = Counter()  # feature:code -> refusals since start

    def try_acquire(self, user_id: int, feature: Feature, count: int) -> DescriptorHold:
        """A hold of `count` descriptors for `user_id`, or DescriptorsRefused (nothing taken)."""
        hold = DescriptorHold(self, user_id, feature)
        hold.grow(count)
        return hold

    def _take(self, user_id: int, feature: Feature, count: int) -> None:
        with self._lock:
            users = self._user_used[feature]
            refusal = decide(self.plan, feature, pool_used=self._pool_used[feature], user_used=users[user_id], count=count)
            if refusal is not None:
                self.refused[f"{feature.value}:{refusal.code}"] += 1
                raise refusal
            self._pool_used[feature] += count
            users[user_id] += count

    def _give_back(self, user_id: int, feature: Feature, count: int) -> None:
        with self._lock:
            self._pool_used[feature] -= count
            users = self._user_used[feature]
            users[user_id] -= count
            if users[user_id] <= 0:
                del users[user_id]

    def in_use(self, feature: Feature, user_id: int | None = None) -> int:
        with self._lock:
            return self._pool_used[feature] if user_id is None else self._user_used[feature][user_id]

    def usage(self, top: int = 5) -> dict[str, object]:
        """What the admin's /healthz shows: each pool's use, its largest users, refusals."""
        with self._lock:
            return {
                feature.value: {
                    "in_use": self._pool_used[feature],
                    "users": len(self._user_used[feature]),
                    "top_users": [{"user_id": u, "in_use": n} for u, n in self._user_used[feature].most_common(top)],
                }
                for feature in self.plan.pools
            } | {"refused": dict(self.refused)}


class DescriptorHold:
    """Descriptors one connection holds; `grow` takes more (or raises, keeping what it had),
    `release` gives all back (idempotent, so every exit path may call it)."""

    def __init__(self, budget: DescriptorBudget, user_id: int, feature: Feature) -> None:
        self._budget, self.user_id, self.feature = budget, user_id, feature
        self.count = 0

    def grow(self, count: int) -> None:
        self._budget._take(self.user_id, self.feature, count)
        self.count += count

    def release(self) -> None:
        count, self.count = self.count, 0
        if count:
            self._budget._give_back(self.user_id, self.feature, count)
