"""The sandbox lifecycle, once for every platform: a `SandboxBackend` built on a driver's verbs
(`sandbox_driver.py`). It owns the per-user slot (`slots.py`) and its lock, adoption of a
predecessor's sandboxes, the warm path, `ensure` (drift decided by the one table of
`lifecycle_decision.py`), the readiness wait, resume / pause / stop, idle reaping
(`idle_action`), cancels and status (docs/lifecycle.md).

- The warm path of a tool call asks no platform: the slot caches what its sandbox runs (plan
  hash, image, agent BUILD) and the call goes straight to the agent.
- A per-user lock makes concurrent first calls start exactly one sandbox.
- After the router forgot the agent (a failed call) the next `ensure` inspects the sandbox and
  talks to its agent afresh; a sandbox whose agent missed a deadline is removed and replaced.
- An outdated sandbox keeps serving while calls or background processes run there, unless it
  carries a group the plan no longer gives.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from orchestrator import metrics
from orchestrator.log import kv
from orchestrator.sandboxes.agent_calls import HEALTH_TIMEOUT_S, sandbox_unavailable
from orchestrator.sandboxes.agent_deploy import AgentDeployment
from orchestrator.sandboxes.agent_launch import prepare_agent_launch
from orchestrator.call_ledger import SandboxEntry
from orchestrator.sandboxes.base import LiveAgent, SandboxStatus, SandboxUser, runs_processes
from orchestrator.sandboxes.lifecycle_decision import (
    IdleAction,
    LifecycleAction,
    Observed,
    decide,
    fit_of,
    idle_action,
    loses_group_access,
)
from orchestrator.sandboxes.sandbox_driver import Inspection, SandboxDriver
from orchestrator.sandboxes.slots import AgentSlot, SlotTable, live_agent, reconnect
from orchestrator.settings import SandboxSettings
from orchestrator.users.dirs import UnsafeDirectory, UserDirectories
from sandbox_agent.client import AgentClient
from sandbox_agent.errors import AgentUnavailable

log = logging.getLogger(__name__)

PARALLEL_STARTS = 4  # cold starts at once: more only thrash two cores and time out together


class LifecycleEngine:
    """The backend interface (`base.SandboxBackend`) on top of one driver."""

    def __init__(
        self,
        driver: SandboxDriver,
        settings: SandboxSettings,
        directories: UserDirectories,
        deployment: AgentDeployment,
        *,
        known_user: Callable[[int], bool],
        processes_run: Callable[[LiveAgent | None, SandboxEntry], bool] = runs_processes,
    ) -> None:
        self.driver = driver
        self._processes_run = processes_run  # `base.runs_processes`: background processes keep a sandbox
        self.name = driver.name
        self.settings = settings
        self.directories = directories
        self.deployment = deployment
        self.known_user = known_user
        self._slots = SlotTable()
        self._starts = threading.BoundedSemaphore(PARALLEL_STARTS)
        self._adopted = False
        self._adopt_lock = threading.Lock()

    # --- the backend's own lifecycle ------------------------------------------------------
    def close(self) -> None:
        """Drop the agents' clients; sandboxes keep running and are adopted by the next start."""
        self._slots.drop_agents()
        self.driver.close()

    def adopt(self) -> list[int]:
        """Take over this instance's sandboxes (once); remove those of users this orchestrator
        does not know. Returns the adopted users."""
        with self._adopt_lock:
            if self._adopted:
                return []
            adopted = []
            for found in self.driver.listed():
                if found.user_id is None or not self.known_user(found.user_id):
                    log.warning("removing the sandbox of an unknown user %s", kv(sandbox=found.name, user=found.user_id))
                    self.driver.discard(found)
                    continue
                slot = self._slot(found.user_id)
                with slot.lock:
                    self.driver.adopt(slot, found)
                    slot.count.touch()
                    # Its agent may run background processes: ask before an idle stop.
                    slot.count.note_processes(None, started_for_s=self.settings.agent.process_max_runtime_s)
                    slot.stopped = not found.running
                adopted.append(found.user_id)
                log.info("adopted a sandbox %s", kv(user=found.user_id, sandbox=found.name, running=found.running))
            self._adopted = True
            return adopted

    # --- SandboxBackend -------------------------------------------------------------------
    def ensure(self, user: SandboxUser) -> LiveAgent:
        try:
            self.adopt()
        except self.driver.api_errors as exc:
            raise sandbox_unavailable(user.user_id, f"{self.driver.api_name} does not answer: {self.driver.api_error(exc)}") from None
        slot = self._slot(user.user_id)
        with slot.lock:
            try:
                self._ensure_locked(slot, user)
            except self.driver.api_errors as exc:
                slot.forget_agent()
                raise sandbox_unavailable(user.user_id, f"{self.driver.api_name} refused: {self.driver.api_error(exc)}") from None
            assert slot.live is not None
            slot.count.touch()
            return slot.live

    def warm(self, user: SandboxUser) -> LiveAgent | None:
        """The slot's agent when the call can go straight to it: adopted, nothing drifted, and
        no slow path holds the slot (nothing here waits or asks the platform)."""
        wanted = self.driver.wanted_now(user) if self._adopted else None
        if wanted is None:
            return None
        slot = self._slots.get(user.user_id)
        if slot is None or not slot.lock.acquire(blocking=False):
            return None
        try:
            if (
                slot.live is None
                or not self.driver.usable(slot)
                or slot.count.paused
                or slot.stalled
                or slot.forgotten
                or (slot.plan_hash, slot.image) != wanted
                or slot.running_build != self.deployment.build
            ):
                return None
            return slot.live
        finally:
            slot.lock.release()

    def resume(self, user: SandboxUser) -> LiveAgent | None:
        slot = self._slots.get(user.user_id)
        if slot is None or not slot.count.paused:
            return None
        with slot.lock:
            if not slot.count.paused:
                return None  # resumed meanwhile: `warm`/`ensure` decide
            self._thaw_locked(slot)
        return self.warm(user)  # None when something drifted: `ensure` handles it

    def forget(self, user_id: int, *, agent: LiveAgent | None = None, stalled: bool = False) -> None:
        self._slots.forget(user_id, agent=agent, stalled=stalled)

    def cancel_calls(self, user_id: int, *, run_id: str | None = None, session_id: str | None = None) -> int:
        return self._slots.cancel_calls(user_id, run_id=run_id, session_id=session_id, stop=self.stop)

    def pause(self, user_id: int) -> bool:
        """Freeze the user's sandbox now (the admin's pause): False when none runs, a call is in
        flight, or the platform cannot pause. The next call resumes it."""
        if not self.driver.pauses:
            return False
        slot = self._slot(user_id)
        with slot.lock:
            if slot.stopped or slot.count.paused:
                return False
            return self._pause_locked(slot)

    def stop(self, user_id: int) -> None:
        slot = self._slot(user_id)
        with slot.lock:
            self._stop_locked(slot, reason="requested")

    def status(self) -> list[SandboxStatus]:
        statuses = [
            self.driver.status(found, self._slot(found.user_id)) for found in self.driver.listed() if found.user_id is not None
        ]
        return sorted(statuses, key=lambda s: s.user_id)

    # --- the slow path ----------------------------------------------------------------------
    def _ensure_locked(self, slot: AgentSlot, user: SandboxUser) -> None:
        wanted = self.driver.wanted(user)
        if slot.count.paused:
            self._thaw_locked(slot)  # e.g. the retry of a call: then judged like any other
        if slot.stalled:
            log.warning("replacing a stalled sandbox %s", kv(user=slot.user_id, sandbox=self.driver.sandbox_name(slot.user_id)))
            slot.forget_agent()
            self.driver.remove(slot, None, kill=True)
            slot.sandbox_id, slot.stopped, slot.stalled = None, True, False
        elif slot.forgotten:
            if self.driver.spares_calls_in_flight and slot.count.in_flight > 0 and self.driver.usable(slot):
                # Unreachable for new connections (e.g. the user's shell swapped its socket)
                # while other calls still run on it through open ones: those are not killed
                # for this one; it is replaced once they are done.
                raise sandbox_unavailable(user.user_id, "its agent stopped accepting connections")
            slot.forget_agent()  # inspect the sandbox and talk to its agent afresh
        if (
            slot.live is not None
            and (slot.plan_hash, slot.image) == (wanted.plan_hash, wanted.image)
            and slot.running_build == wanted.agent_build
        ):
            return  # as the warm path: nothing asked of the platform
        seen = self.driver.inspect(slot, wanted)
        if seen.state is Observed.RUNNING and slot.live is None and not self._reconnect(slot, seen):
            # Running but its agent does not answer (hung, or its token is gone): replace it.
            seen = seen.unanswered()
            slot.count.note_processes(0)  # nothing of that agent is kept
        # A call in flight, or background processes (asked afresh: this is the slow path).
        busy = slot.count.in_flight > 0 or self._processes_run(slot.live, slot.count)
        if busy and seen.group_gids is not None:  # a revoked group does not wait for the calls under way
            busy = not loses_group_access(seen.group_gids - {self.directories.shared_gid}, user.plan.group_gids)
        fit = fit_of(outdated=seen.outdated, running_build=slot.running_build, wanted_build=wanted.agent_build)
        action = decide(seen.state, fit, busy=busy, restarts_in_place=self.driver.restarts_in_place)
        if action is LifecycleAction.USE:
            slot.plan_hash, slot.image, slot.sandbox_id = seen.plan_hash, seen.image, seen.sandbox_id
            slot.stopped = False
            return
        log.info(
            "sandbox %s %s",
            action.value,
            kv(user=user.user_id, sandbox=self.driver.sandbox_name(user.user_id), observed=seen.state.value,
               fit=fit.value, running_build=slot.running_build, host_build=wanted.agent_build),
        )  # fmt: skip
        slot.forget_agent()
        slot.count.note_processes(0)  # a new agent (or sandbox) runs none of the old one's
        with self._starts:
            started = time.monotonic()
            self._launch(slot, user, action, seen, wanted.plan_hash, wanted.image)
            seconds = time.monotonic() - started
            log.info(
                "sandbox ready %s",
                kv(user=user.user_id, sandbox=self.driver.sandbox_name(user.user_id), action=action.value,
                   build=slot.running_build, seconds=round(seconds, 3)),
            )  # fmt: skip
            metrics.observe_start(self.name, "cold", seconds)

    def _launch(
        self, slot: AgentSlot, user: SandboxUser, action: LifecycleAction, seen: Inspection, plan_hash: str, image: str | None
    ) -> None:
        if action is LifecycleAction.WAIT:
            # Current and on its way, but its agent is not up yet (adopted while starting, or a
            # start this orchestrator did not see through): started afresh, as its token may be
            # older than the one on disk.
            action = LifecycleAction.RECREATE
        try:
            release = self.deployment.ensure()
            options = {"in_sandbox": True, "parent_pid": None} | self.driver.launch_options()
            launch = prepare_agent_launch(self.settings, self.directories, user, **options)
        except (OSError, RuntimeError, UnsafeDirectory) as exc:
            raise sandbox_unavailable(user.user_id, f"preparing it failed: {exc}") from exc
        if action is LifecycleAction.RECREATE:
            self.driver.remove(slot, seen, kill=False)
        if action in (LifecycleAction.CREATE, LifecycleAction.RECREATE):
            self.driver.create(slot, user, launch, release)
        elif action is LifecycleAction.START:
            self.driver.start(slot, seen)
            slot.sandbox_id = seen.sandbox_id
        else:  # RESTART_AGENT: same sandbox, same mounts; the agent code is mounted read-only,
            self.driver.restart(slot, seen)  # so the restart runs the new BUILD
            slot.sandbox_id = seen.sandbox_id
        slot.plan_hash, slot.image, slot.stopped = plan_hash, image, False
        self._wait_ready(slot, self.driver.client(slot, launch.token), launch.config.instance_id)

    def _reconnect(self, slot: AgentSlot, seen: Inspection) -> bool:
        """The agent already running in the sandbox (`slots.reconnect`). False: the caller
        replaces the sandbox (always, for a driver that does not reconnect)."""
        if not self.driver.reconnects:
            return False
        slot.sandbox_id = seen.sandbox_id
        return reconnect(slot, self.directories, lambda token: self.driver.client(slot, token))

    def _wait_ready(self, slot: AgentSlot, agent: AgentClient, instance: str) -> None:
        """Ready = our agent (the instance id we wrote) answers /health. Meanwhile the platform
        is asked how the start goes: a problem that waiting will not solve fails it at once, in
        its own words."""
        timeout = self.driver.ready_timeout_s
        deadline = time.monotonic() + timeout
        next_progress = time.monotonic()
        delay, longest = self.driver.ready_poll_s
        waiting_for: str | None = None
        answers = True
        while True:
            now = time.monotonic()
            if now >= next_progress:
                progress = self.driver.progress(slot)
                if progress.failed is not None:
                    self._fail_start(slot, agent, progress.failed)
                waiting_for, answers = progress.waiting_for, progress.answers
                next_progress = now + self.driver.progress_every_s
            if answers:
                try:
                    health = agent.health(timeout_s=HEALTH_TIMEOUT_S)
                    if health.instance_id == instance:
                        slot.running_build = health.build
                        slot.live = live_agent(slot, agent)
                        return
                except AgentUnavailable as exc:
                    if self.driver.refused_for_good(exc):
                        self._fail_start(slot, agent, exc.message)
            if time.monotonic() >= deadline:
                self._fail_start(slot, agent, waiting_for or f"its agent did not answer /health within {timeout:g} s")
            time.sleep(delay)
            delay = min(delay * 2, longest)

    def _fail_start(self, slot: AgentSlot, agent: AgentClient, why: str) -> None:
        agent.close()
        name = self.driver.sandbox_name(slot.user_id)
        detail = self.driver.start_failed(slot)
        slot.stopped = True  # nothing of it is worth keeping but its logs: the next call starts afresh
        log.error("sandbox failed to start %s", kv(user=slot.user_id, why=why, **({"sandbox": name} | detail)))
        detail["logs"] = detail.get("logs", "")[-2000:]
        raise sandbox_unavailable(slot.user_id, f"it did not start: {why}", **detail)

    def _thaw_locked(self, slot: AgentSlot) -> None:
        started = time.monotonic()
        self.driver.resume(slot)
        slot.count.unpause()
        metrics.observe_start(self.name, "resume", time.monotonic() - started)
        log.info("sandbox resumed %s", kv(user=slot.user_id, sandbox=self.driver.sandbox_name(slot.user_id)))

    def _stop_locked(self, slot: AgentSlot, *, reason: str) -> None:
        slot.forget_agent()
        slot.count.note_processes(0)  # a stopped sandbox's processes are gone with it
        self.driver.stop(slot, reason)  # a paused one is thawed first: a frozen process cannot act on a stop
        slot.stopped = True
        slot.count.unpause()

    def _pause_locked(self, slot: AgentSlot) -> bool:
        """Freeze the slot's sandbox; False when a call came first or the platform refused (it
        then stays running, and is stopped later as before)."""
        if not slot.count.pause_if_idle():
            return False
        if not self.driver.pause(slot):
            slot.count.unpause()
            return False
        log.info("idle sandbox paused %s", kv(user=slot.user_id, sandbox=self.driver.sandbox_name(slot.user_id)))
        return True

    # --- idleness ---------------------------------------------------------------------------
    def reap_idle(self, now: float | None = None) -> list[int]:
        """Pause the sandboxes idle for the pause time, stop those idle for `idle_timeout_s`;
        returns the users stopped. Adopts first (once): the first round after a start takes
        over the sandboxes of the last run."""
        try:
            self.adopt()
        except self.driver.api_errors as exc:
            log.warning("the platform's API does not answer; adoption waits %s", kv(error=self.driver.api_error(exc)))
            return []
        now = time.monotonic() if now is None else now
        stopped = []
        for slot in self._slots.all():
            if not slot.lock.acquire(blocking=False):
                continue  # being started or used right now: not idle
            try:
                if slot.stopped:
                    continue
                try:
                    action = self._idle_action_locked(slot, now)
                except self.driver.api_errors as exc:
                    log.warning("inspecting an idle sandbox failed %s", kv(user=slot.user_id, error=self.driver.api_error(exc)))
                    continue
                if action is IdleAction.STOP:
                    try:
                        self._stop_locked(slot, reason="idle")
                    except self.driver.api_errors as exc:
                        slot.stopped = False
                        log.warning("stopping an idle sandbox failed %s", kv(user=slot.user_id, error=self.driver.api_error(exc)))
                        continue
                    stopped.append(slot.user_id)
                elif not (action is IdleAction.PAUSE and self._pause_locked(slot)):
                    continue
                metrics.SANDBOX_IDLE_ACTIONS.labels(self.name, action.value).inc()
            finally:
                slot.lock.release()
        return stopped

    def _idle_action_locked(self, slot: AgentSlot, now: float) -> IdleAction:
        processes = False
        if not slot.count.paused:  # a frozen agent ran none when it was paused
            if slot.live is None and slot.count.processes != 0:
                # Adopted, or contact lost: ask its agent.
                seen = self.driver.inspect(slot, None)
                if seen.state is Observed.RUNNING:
                    self._reconnect(slot, seen)
            processes = self._processes_run(slot.live, slot.count)
        return idle_action(
            idle_s=now - slot.count.last_used,
            in_flight=slot.count.in_flight,
            paused=slot.count.paused,
            has_running_processes=processes,  # background processes: busy, whatever the calls
            pause_after_s=self.settings.pause_after_s if self.driver.pauses else 0.0,
            idle_timeout_s=self.settings.idle_timeout_s,
        )

    def _slot(self, user_id: int) -> AgentSlot:
        return self._slots.slot(user_id)
