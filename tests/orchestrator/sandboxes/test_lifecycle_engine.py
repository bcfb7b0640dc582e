"""The lifecycle engine (orchestrator/sandboxes/lifecycle_engine.py) against a fake driver: an
in-memory platform whose "agents" answer /health with the instance id the engine wrote into
their configuration, as a real agent does. The platforms themselves are exercised by the
docker, kubernetes and process tests; these pin the lifecycle's own decisions, quickly."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mounts.layout import DataLayout, GroupRef
from mounts.plan import plan_mounts
from orchestrator.call_ledger import on_sandbox
from orchestrator.errors import ToolError
from orchestrator.sandboxes.agent_deploy import AgentRelease
from orchestrator.sandboxes.agent_launch import AgentLaunch
from orchestrator.sandboxes.base import SandboxStatus, SandboxUser
from orchestrator.sandboxes.lifecycle_decision import Observed
from orchestrator.sandboxes.lifecycle_engine import LifecycleEngine
from orchestrator.sandboxes.sandbox_driver import Found, Inspection, Progress, Wanted
from orchestrator.sandboxes.slots import AgentSlot
from orchestrator.settings import SandboxSettings
from orchestrator.users.dirs import UserDirectories
from sandbox_agent.errors import AgentUnavailable
from sandbox_agent.wire import Health
from tests.conftest import make_settings

USER = 23
OTHER = 24


@dataclass
class FakeSandbox:
    """One sandbox on the fake platform."""

    plan_hash: str
    image: str
    state: Observed = Observed.RUNNING
    group_gids: frozenset[int] = frozenset()
    instance_id: str = ""  # what its agent answers with: read from the config the engine wrote
    build: str = "b1"
    answers: bool = True
    paused: bool = False
    serial: int = 0


class FakeAgentClient:
    """Stands in for `AgentClient`: answers from the fake platform's sandbox."""

    def __init__(self, platform: FakePlatform, user_id: int) -> None:
        self.platform = platform
        self.user_id = user_id
        self.transport = self  # the event loop's face: the engine never calls through it
        self.closed = False

    def health(self, timeout_s: float) -> Health:
        sandbox = self.platform.sandboxes.get(self.user_id)
        if sandbox is None or sandbox.state is not Observed.RUNNING or not sandbox.answers or sandbox.paused:
            raise AgentUnavailable("no answer", delivered=False)
        return Health(build=sandbox.build, uptime_s=1.0, busy=0, user_id=self.user_id, instance_id=sandbox.instance_id)

    def cancel(self, *, run_id: str | None, session_id: str | None) -> int:
        self.health(1.0)
        return 2

    def close(self) -> None:
        self.closed = True


@dataclass
class FakePlatform:
    sandboxes: dict[int, FakeSandbox] = field(default_factory=dict)
    verbs: list[tuple[str, int]] = field(default_factory=list)
    serial: int = 0


class FakeDriver:
    """A `SandboxDriver` on an in-memory platform (no containers, no pods, no processes)."""

    name = "fake"
    api_name = "the fake platform"
    api_errors: tuple[type[BaseException], ...] = (ConnectionError,)
    ready_timeout_s = 0.5
    reconnects = True
    spares_calls_in_flight = False
    ready_poll_s = (0.001, 0.005)
    progress_every_s = 0.0

    def __init__(self, layout: DataLayout, *, pauses: bool = True, restarts_in_place: bool = True) -> None:
        self.layout = layout
        self.pauses = pauses
        self.restarts_in_place = restarts_in_place
        self.platform = FakePlatform()
        self.image = "img-1"
        self.build = "b1"  # what a newly started agent reports
        self.starts_fail: str | None = None
        self.listing_fails = False
        self.inspection_fails = False

    def _note(self, verb: str, user_id: int) -> None:
        self.platform.verbs.append((verb, user_id))

    def verbs(self, user_id: int = USER) -> list[str]:
        return [verb for verb, user in self.platform.verbs if user == user_id]

    def launch_options(self) -> dict[str, Any]:
        return {}

    def api_error(self, exc: BaseException) -> str:
        return str(exc)

    def close(self) -> None:
        pass

    def wanted(self, user: SandboxUser) -> Wanted:
        return Wanted(user.plan.plan_hash, self.image, self.build)

    def wanted_now(self, user: SandboxUser) -> tuple[str, str | None] | None:
        return user.plan.plan_hash, self.image

    def inspect(self, slot: AgentSlot, wanted: Wanted | None) -> Inspection:
        self._note("inspect", slot.user_id)
        if self.inspection_fails:
            raise ConnectionError("the fake platform is down")
        sandbox = self.platform.sandboxes.get(slot.user_id)
        if sandbox is None:
            return Inspection(Observed.ABSENT)
        outdated = wanted is not None and (sandbox.plan_hash, sandbox.image) != (wanted.plan_hash, wanted.image)
        return Inspection(
            sandbox.state, outdated, sandbox.plan_hash, sandbox.image, f"s{sandbox.serial}", sandbox.group_gids, sandbox
        )

    def listed(self) -> list[Found]:
        if self.listing_fails:
            raise ConnectionError("the fake platform is down")
        return [
            Found(user_id, f"fake-{user_id}", sandbox.state in (Observed.RUNNING, Observed.STARTING), sandbox)
            for user_id, sandbox in self.platform.sandboxes.items()
        ]

    def status(self, found: Found, slot: AgentSlot) -> SandboxStatus:
        assert found.user_id is not None
        return SandboxStatus(found.user_id, self.name, found.handle.state.value, busy=slot.count.in_flight)

    def adopt(self, slot: AgentSlot, found: Found) -> None:
        self._note("adopt", slot.user_id)
        found.handle.paused = False

    def discard(self, found: Found) -> None:
        assert found.user_id is not None
        self._note("discard", found.user_id)
        del self.platform.sandboxes[found.user_id]

    def sandbox_name(self, user_id: int) -> str:
        return f"fake-{user_id}"

    def client(self, slot: AgentSlot, token: str) -> FakeAgentClient:  # type: ignore[override]
        return FakeAgentClient(self.platform, slot.user_id)

    def _configured_instance(self, user_id: int) -> str:
        """What a real agent does: it reads the configuration the engine wrote for it."""
        return str(json.loads(self.layout.agent_config_path(user_id).read_text())["instance_id"])

    def usable(self, slot: AgentSlot) -> bool:
        return True

    def create(self, slot: AgentSlot, user: SandboxUser, launch: AgentLaunch, release: AgentRelease) -> None:
        self._note("create", user.user_id)
        self.platform.serial += 1
        self.platform.sandboxes[user.user_id] = FakeSandbox(
            user.plan.plan_hash, self.image, group_gids=frozenset(user.plan.group_gids),
            instance_id=self._configured_instance(user.user_id), build=release.build, serial=self.platform.serial,
        )  # fmt: skip
        slot.sandbox_id = f"s{self.platform.serial}"

    def _run_agent(self, slot: AgentSlot, sandbox: FakeSandbox) -> None:
        sandbox.state = Observed.RUNNING
        sandbox.instance_id = self._configured_instance(slot.user_id)
        sandbox.build = self.build

    def start(self, slot: AgentSlot, seen: Inspection) -> None:
        self._note("start", slot.user_id)
        self._run_agent(slot, seen.handle)

    def restart(self, slot: AgentSlot, seen: Inspection) -> None:
        self._note("restart", slot.user_id)
        self._run_agent(slot, seen.handle)

    def remove(self, slot: AgentSlot, seen: Inspection | None, *, kill: bool) -> None:
        self._note("kill" if kill else "remove", slot.user_id)
        self.platform.sandboxes.pop(slot.user_id, None)

    def stop(self, slot: AgentSlot, reason: str) -> None:
        sandbox = self.platform.sandboxes.get(slot.user_id)
        if sandbox is not None and sandbox.state is Observed.RUNNING:
            self._note("stop", slot.user_id)
            sandbox.state, sandbox.paused = Observed.STOPPED, False

    def pause(self, slot: AgentSlot) -> bool:
        self._note("pause", slot.user_id)
        self.platform.sandboxes[slot.user_id].paused = True
        return True

    def resume(self, slot: AgentSlot) -> None:
        self._note("resume", slot.user_id)
        self.platform.sandboxes[slot.user_id].paused = False

    def progress(self, slot: AgentSlot) -> Progress:
        return Progress(failed=self.starts_fail)

    def refused_for_good(self, error: AgentUnavailable) -> bool:
        return False

    def start_failed(self, slot: AgentSlot) -> dict[str, str]:
        self._note("failed", slot.user_id)
        return {"sandbox": self.sandbox_name(slot.user_id), "logs": "the agent said goodbye"}


class FakeDeployment:
    build = "b1"

    def ensure(self) -> AgentRelease:
        return AgentRelease("r1", Path("/nonexistent"), self.build)


@dataclass
class World:
    engine: LifecycleEngine
    driver: FakeDriver
    deployment: FakeDeployment
    layout: DataLayout

    def user(self, user_id: int = USER, *, group: bool = False) -> SandboxUser:
        crew = GroupRef("telegram", "-1007")
        groups = (crew,) if group else ()
        return SandboxUser(user_id, plan_mounts(self.layout, user_id, groups, {crew: 60007} if group else {}))


def make_world(traversable_tmp: Path, **driver_options: bool) -> World:
    layout = DataLayout(traversable_tmp / "data")
    directories = UserDirectories(layout, 100000)
    settings = SandboxSettings.of(make_settings(layout.root, pause_after_s=60.0, idle_timeout_s=600.0))
    driver = FakeDriver(layout, **driver_options)
    deployment = FakeDeployment()
    engine: LifecycleEngine = LifecycleEngine(
        driver, settings, directories, deployment,  # type: ignore[arg-type]
        known_user=lambda user_id: user_id != 99,
    )  # fmt: skip
    return World(engine, driver, deployment, layout)


@pytest.fixture
def world(traversable_tmp: Path) -> Iterator[World]:
    made = make_world(traversable_tmp)
    yield made
    made.engine.close()


def test_the_first_call_creates_once_and_the_next_goes_the_warm_way(world: World) -> None:
    user = world.user()
    assert world.engine.warm(user) is None  # nothing adopted, nothing started
    live = world.engine.ensure(user)
    assert world.driver.verbs() == ["inspect", "create"]
    assert world.engine.warm(user) is live
    assert world.engine.ensure(user) is live
    assert world.driver.verbs() == ["inspect", "create"]  # neither asked the platform again


def test_concurrent_first_calls_start_exactly_one_sandbox(world: World) -> None:
    user = world.user()
    agents = []
    threads = [threading.Thread(target=lambda: agents.append(world.engine.ensure(user))) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert world.driver.verbs().count("create") == 1
    assert len({id(agent) for agent in agents}) == 1


def test_a_changed_plan_recreates_an_idle_sandbox(world: World) -> None:
    world.engine.ensure(world.user())
    changed = world.user(group=True)
    assert world.engine.warm(changed) is None
    world.engine.ensure(changed)
    assert world.driver.verbs() == ["inspect", "create", "inspect", "remove", "create"]


def test_a_busy_sandbox_keeps_serving_an_outdated_plan_until_it_is_idle(world: World) -> None:
    live = world.engine.ensure(world.user())
    changed = world.user(group=True)  # gains a group: nothing revoked
    with on_sandbox(live.count):
        assert world.engine.ensure(changed) is live
    assert "remove" not in world.driver.verbs()
    world.engine.ensure(changed)
    assert world.driver.verbs()[-2:] == ["remove", "create"]


def test_a_revoked_group_does_not_wait_for_the_calls_under_way(world: World) -> None:
    live = world.engine.ensure(world.user(group=True))
    with on_sandbox(live.count):
        assert world.engine.ensure(world.user()) is not live
    assert world.driver.verbs()[-2:] == ["remove", "create"]


@pytest.mark.parametrize(("restarts_in_place", "verbs"), [(True, ["restart"]), (False, ["remove", "create"])])
def test_a_drifted_agent_build_restarts_the_agent(traversable_tmp: Path, restarts_in_place: bool, verbs: list[str]) -> None:
    world = make_world(traversable_tmp, restarts_in_place=restarts_in_place)
    user = world.user()
    first = world.engine.ensure(user)
    world.deployment.build = world.driver.build = "b2"
    assert world.engine.warm(user) is None
    assert world.engine.ensure(user) is not first
    assert world.driver.verbs()[3:] == verbs  # after inspect, create, inspect
    assert world.engine.warm(user) is not None


@pytest.mark.parametrize(("state", "verbs"), [(Observed.STOPPED, ["start"]), (Observed.ENDED, ["remove", "create"])])
def test_a_stopped_sandbox_starts_again_and_an_ended_one_is_replaced(
    world: World, state: Observed, verbs: list[str]
) -> None:
    user = world.user()
    world.engine.ensure(user)
    world.engine.forget(USER)
    world.driver.platform.sandboxes[USER].state = state
    world.engine.ensure(user)
    assert world.driver.verbs()[3:] == verbs


def test_a_forgotten_agent_is_reconnected_when_its_sandbox_still_answers(world: World) -> None:
    user = world.user()
    first = world.engine.ensure(user)
    world.engine.forget(USER, agent=first)
    assert world.engine.warm(user) is None
    second = world.engine.ensure(user)
    assert second is not first and world.driver.verbs() == ["inspect", "create", "inspect"]


def test_a_running_sandbox_whose_agent_does_not_answer_is_replaced(world: World) -> None:
    user = world.user()
    world.engine.ensure(user)
    world.engine.forget(USER)
    world.driver.platform.sandboxes[USER].answers = False
    world.engine.ensure(user)
    assert world.driver.verbs()[3:] == ["remove", "create"]


def test_a_stalled_sandbox_is_killed_and_created_afresh(world: World) -> None:
    user = world.user()
    first = world.engine.ensure(user)
    world.engine.forget(USER, agent=first, stalled=True)
    world.engine.ensure(user)
    assert world.driver.verbs()[2:] == ["kill", "inspect", "create"]


def test_forgetting_an_agent_already_replaced_changes_nothing(world: World) -> None:
    user = world.user()
    first = world.engine.ensure(user)
    world.engine.forget(USER, agent=first, stalled=True)
    second = world.engine.ensure(user)
    world.engine.forget(USER, agent=first, stalled=True)  # the old one failed late
    assert world.engine.warm(user) is second


def test_a_start_the_platform_reports_failed_is_a_clear_refusal(world: World) -> None:
    world.driver.starts_fail = "the image is missing"
    with pytest.raises(ToolError) as failed:
        world.engine.ensure(world.user())
    assert failed.value.code == "sandbox_unavailable"
    assert "it did not start: the image is missing" in failed.value.message
    assert failed.value.details["logs"] == "the agent said goodbye"
    assert world.driver.verbs()[-1] == "failed"


def test_an_agent_that_never_answers_times_out_within_the_ready_timeout(world: World) -> None:
    original = world.driver.create

    def create_silent(slot: AgentSlot, user: SandboxUser, launch: AgentLaunch, release: AgentRelease) -> None:
        original(slot, user, launch, release)
        world.driver.platform.sandboxes[USER].answers = False

    world.driver.create = create_silent  # type: ignore[method-assign]
    with pytest.raises(ToolError) as failed:
        world.engine.ensure(world.user())
    assert "its agent did not answer /health within 0.5 s" in failed.value.message


def test_the_reaper_pauses_then_stops_an_idle_sandbox_and_the_next_call_resumes(world: World) -> None:
    user = world.user()
    live = world.engine.ensure(user)
    last = live.count.last_used
    assert world.engine.reap_idle(now=last + 30) == [] and world.driver.verbs()[-1] == "create"
    assert world.engine.reap_idle(now=last + 61) == [] and world.driver.verbs()[-1] == "pause"
    assert world.engine.warm(user) is None  # a paused agent takes no call
    assert world.engine.resume(user) is live and world.driver.verbs()[-1] == "resume"
    assert world.engine.reap_idle(now=live.count.last_used + 601) == [USER]
    assert world.driver.verbs()[-2:] == ["resume", "stop"]
    assert world.engine.warm(user) is None
    world.engine.ensure(user)
    assert world.driver.verbs()[-1] == "start"  # our own stop: the same sandbox starts again


def test_a_call_in_flight_keeps_the_reaper_away(world: World) -> None:
    live = world.engine.ensure(world.user())
    with on_sandbox(live.count):
        assert world.engine.reap_idle(now=live.count.last_used + 10_000) == []
    assert world.driver.verbs() == ["inspect", "create"]


def test_a_platform_without_a_freezer_is_never_paused(traversable_tmp: Path) -> None:
    world = make_world(traversable_tmp, pauses=False)
    live = world.engine.ensure(world.user())
    assert world.engine.reap_idle(now=live.count.last_used + 61) == []
    assert world.engine.pause(USER) is False
    assert world.engine.reap_idle(now=live.count.last_used + 601) == [USER]
    assert "pause" not in world.driver.verbs()


def test_the_admins_pause_waits_for_no_call_and_refuses_one_in_flight(world: World) -> None:
    live = world.engine.ensure(world.user())
    with on_sandbox(live.count):
        assert world.engine.pause(USER) is False
    assert world.engine.pause(USER) is True
    assert world.engine.pause(USER) is False  # already paused
    world.engine.ensure(world.user())  # a retry thaws it, then judges it like any other
    assert world.driver.verbs()[-1] == "resume"


def test_adoption_takes_over_known_users_and_removes_the_others(world: World) -> None:
    world.driver.platform.sandboxes[USER] = FakeSandbox("p", "img-1", paused=True)
    world.driver.platform.sandboxes[99] = FakeSandbox("p", "img-1")
    assert world.engine.adopt() == [USER]
    assert world.engine.adopt() == []  # once
    assert world.driver.verbs(USER) == ["adopt"] and world.driver.verbs(99) == ["discard"]
    assert [s.user_id for s in world.engine.status()] == [USER]


def test_a_platform_that_does_not_answer_is_sandbox_unavailable_and_the_reaper_waits(world: World) -> None:
    world.driver.listing_fails = True
    with pytest.raises(ToolError) as failed:
        world.engine.ensure(world.user())
    assert failed.value.code == "sandbox_unavailable"
    assert "the fake platform does not answer" in failed.value.message
    assert world.engine.reap_idle() == []


def test_cancel_asks_the_live_agent_and_stops_one_that_does_not_answer(world: World) -> None:
    assert world.engine.cancel_calls(USER, run_id="r") == 0  # nothing live: nothing started
    assert world.driver.verbs() == []
    world.engine.ensure(world.user())
    assert world.engine.cancel_calls(USER, run_id="r") == 2
    world.driver.platform.sandboxes[USER].answers = False
    assert world.engine.cancel_calls(USER, run_id="r") == 0
    assert world.driver.verbs()[-1] == "stop"


def test_an_adopted_sandbox_s_agent_is_asked_for_its_processes_before_an_idle_stop(world: World) -> None:
    world.engine.ensure(world.user())  # a predecessor started it: its token is on disk
    successor: LifecycleEngine = LifecycleEngine(
        world.driver, world.engine.settings, world.engine.directories, world.deployment,  # type: ignore[arg-type]
        known_user=lambda _: True,
    )  # fmt: skip
    assert successor.adopt() == [USER]
    slot = successor._slot(USER)
    assert slot.live is None and slot.count.processes is None  # not known: its agent is asked
    world.driver.inspection_fails = True
    assert successor.reap_idle(now=slot.count.last_used + 601) == []  # the platform did not answer: kept
    world.driver.inspection_fails = False
    assert successor.reap_idle(now=slot.count.last_used + 601) == [USER]  # its agent says none run
    assert world.driver.verbs()[-3:] == ["inspect", "inspect", "stop"]
