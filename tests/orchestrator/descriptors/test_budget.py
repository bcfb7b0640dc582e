"""The descriptor budget's decisions, without a socket: how a limit is split, who may take
one more, and what a refusal says."""

from __future__ import annotations

import threading

import pytest

from orchestrator.descriptors.budget import (
    EGRESS_PENDING_COST,
    EGRESS_TUNNEL_EXTRA,
    RESERVE_MIN,
    BudgetSettingsError,
    DescriptorBudget,
    DescriptorShareExceeded,
    DescriptorsRefused,
    Feature,
    decide,
    plan_budget,
    plan_for,
)
from orchestrator.settings import DescriptorSettings, Settings

PCT = {Feature.EGRESS: 60.0, Feature.STREAMS: 20.0}


def test_the_default_split_of_a_1024_limit_keeps_a_reserve_and_bounds_every_user() -> None:
    plan = plan_budget(1024, reserve=None, pool_pct=PCT, user_pct=25)
    assert plan.reserve == RESERVE_MIN
    assert plan.pools == {Feature.EGRESS: 460, Feature.STREAMS: 153}
    assert plan.user_shares == {Feature.EGRESS: 115, Feature.STREAMS: 38}
    # However many users come, the pools together never reach into the reserve.
    assert sum(plan.pools.values()) <= plan.limit - plan.reserve
    assert all(plan.user_shares[f] <= plan.pools[f] for f in plan.pools)


def test_a_large_limit_reserves_a_quarter() -> None:
    plan = plan_budget(1 << 20, reserve=None, pool_pct=PCT, user_pct=25)
    assert plan.reserve == 1 << 18


@pytest.mark.parametrize(
    ("limit", "reserve", "pct", "user_pct", "says"),
    [
        (512, 512, PCT, 25, "must be below the process's descriptor limit (512)"),
        (1024, None, {Feature.EGRESS: 80.0, Feature.STREAMS: 30.0}, 25, "at most 100 %"),
        (300, None, PCT, 10, "one user's share of the egress descriptors would be 2"),
    ],
)
def test_a_split_that_does_not_fit_is_refused_with_what_to_change(
    limit: int, reserve: int | None, pct: dict[Feature, float], user_pct: float, says: str
) -> None:
    with pytest.raises(BudgetSettingsError) as refused:
        plan_budget(limit, reserve=reserve, pool_pct=pct, user_pct=user_pct)
    assert says in str(refused.value)
    assert "ORCH_FD_" in str(refused.value)


def test_the_users_share_is_checked_before_the_pool() -> None:
    plan = plan_budget(1024, reserve=None, pool_pct=PCT, user_pct=25)
    assert decide(plan, Feature.EGRESS, pool_used=0, user_used=0, count=6) is None
    over_share = decide(plan, Feature.EGRESS, pool_used=455, user_used=110, count=6)
    assert isinstance(over_share, DescriptorShareExceeded)
    assert over_share.status_code == 429 and over_share.code == "descriptor_share_exceeded"
    assert "holds 110 of its 115" in over_share.message
    pool_full = decide(plan, Feature.EGRESS, pool_used=455, user_used=0, count=6)
    assert pool_full is not None and not isinstance(pool_full, DescriptorShareExceeded)
    assert pool_full.status_code == 503 and pool_full.code == "descriptors_exhausted"
    assert pool_full.body()["feature"] == "egress"


def test_holds_take_grow_and_give_back_exactly_once() -> None:
    budget = DescriptorBudget(plan_budget(1024, reserve=None, pool_pct=PCT, user_pct=25))
    share = budget.plan.user_shares[Feature.EGRESS]
    holds = []
    while budget.in_use(Feature.EGRESS, 7) + EGRESS_PENDING_COST <= share:
        holds.append(budget.try_acquire(7, Feature.EGRESS, EGRESS_PENDING_COST))
    with pytest.raises(DescriptorShareExceeded):
        budget.try_acquire(7, Feature.EGRESS, EGRESS_PENDING_COST)
    other = budget.try_acquire(8, Feature.EGRESS, EGRESS_PENDING_COST)  # another user is not held back
    with pytest.raises(DescriptorShareExceeded):
        holds[0].grow(EGRESS_TUNNEL_EXTRA)  # refused: the hold keeps what it had
    assert holds[0].count == EGRESS_PENDING_COST
    for hold in holds:
        hold.release()
        hold.release()
    other.release()
    assert budget.in_use(Feature.EGRESS) == 0 and budget.in_use(Feature.EGRESS, 7) == 0
    assert budget.usage()["refused"] == {"egress:descriptor_share_exceeded": 2}
    assert budget.usage()["egress"] == {"in_use": 0, "users": 0, "top_users": []}


def test_many_users_together_stop_at_the_pool_and_never_pass_it() -> None:
    budget = DescriptorBudget(plan_budget(1024, reserve=None, pool_pct=PCT, user_pct=25))
    pool = budget.plan.pools[Feature.EGRESS]
    taken: list[int] = []
    refusals: list[DescriptorsRefused] = []

    def user(user_id: int) -> None:
        for _ in range(200):
            try:
                budget.try_acquire(user_id, Feature.EGRESS, EGRESS_PENDING_COST)
                taken.append(EGRESS_PENDING_COST)
            except DescriptorsRefused as refusal:
                refusals.append(refusal)

    threads = [threading.Thread(target=user, args=(u,)) for u in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(taken) == budget.in_use(Feature.EGRESS) <= pool
    assert pool - sum(taken) < EGRESS_PENDING_COST  # filled, to the last unit that fits
    assert {r.code for r in refusals} == {"descriptor_share_exceeded", "descriptors_exhausted"}


def test_the_plan_follows_the_settings() -> None:
    settings = Settings(fd_reserve=300, fd_egress_pct=50, fd_streams_pct=10, fd_user_pct=50)
    plan = plan_for(1300, DescriptorSettings.of(settings))
    assert (plan.reserve, plan.pools[Feature.EGRESS], plan.user_shares[Feature.STREAMS]) == (300, 500, 50)


def test_pools_over_100_percent_are_a_bad_setting() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="ORCH_FD_EGRESS_PCT"):
        Settings(fd_egress_pct=90, fd_streams_pct=20)
