"""What the lifecycle engine keeps per user: the slot of one user's sandbox (its agent's clients,
its call count, what it runs, the flags a failed call sets), and the table of them with the
parts of the backend interface that only touch slots (`forget`, `cancel_calls`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.log import kv
from orchestrator.sandboxes.agent_calls import HEALTH_TIMEOUT_S
from orchestrator.sandboxes.agent_launch import read_agent_token
from orchestrator.call_ledger import SandboxEntry
from orchestrator.sandboxes.base import LiveAgent
from orchestrator.users.dirs import UserDirectories
from sandbox_agent.client import AgentClient
from sandbox_agent.errors import AgentUnavailable

log = logging.getLogger(__name__)


@dataclass
class AgentSlot:
    """One user's sandbox as this orchestrator knows it. Guarded by `lock`; `stalled` and
    `forgotten` are set by `forget` without it (plain flags): the next `ensure` acts on them."""

    user_id: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    plan_hash: str | None = None
    image: str | None = None  # as the driver names it (an image id, a reference)
    sandbox_id: str | None = None  # the container's id, the pod's uid
    stopped: bool = True  # none of ours runs (never started, idle-stopped, asked, or removed)
    running_build: str | None = None
    live: LiveAgent | None = None  # the clients of its agent (blocking: health, cancels)
    # The calls in flight on the sandbox, whichever client they went through: kept across
    # reconnections to the same sandbox.
    count: SandboxEntry = field(default_factory=SandboxEntry)
    stalled: bool = False  # its agent missed a call's deadline: the sandbox is replaced
    forgotten: bool = False  # its agent failed a call: the sandbox is inspected again

    def forget_agent(self) -> None:
        if self.live is not None:
            self.live.blocking.close()  # and `calls`, the transport it runs
        self.live = None
        self.running_build = None
        self.forgotten = False


def live_agent(slot: AgentSlot, agent: AgentClient) -> LiveAgent:
    """Both faces of one agent's client, on the slot's call count: the event loop's calls go
    through its transport, which the blocking façade runs too (one pool, per loop)."""
    return LiveAgent(slot.user_id, agent, agent.transport, slot.count)


def reconnect(slot: AgentSlot, directories: UserDirectories, client_for: Callable[[str], AgentClient]) -> bool:
    """Talk to the agent already running in the user's sandbox (adopted after a restart, or
    contact lost) with the token it was started with, read from the root-owned secrets dir,
    never from a directory the sandbox can write. False, keeping nothing, when there is no
    usable token or the agent does not answer as this user's: the caller replaces the sandbox.
    Else the slot's agent is live again, with the BUILD and the processes it reports."""
    token = read_agent_token(directories, slot.user_id)
    if token is None:
        log.warning("no usable agent token; replacing the sandbox %s", kv(user=slot.user_id))
        return False
    agent = client_for(token)
    try:
        health = agent.health(timeout_s=HEALTH_TIMEOUT_S)
    except AgentUnavailable as exc:
        log.warning("the running sandbox's agent does not answer %s", kv(user=slot.user_id, error=exc.message))
        agent.close()
        return False
    if health.user_id not in (None, slot.user_id):
        log.warning("the sandbox's agent answers for another user %s", kv(user=slot.user_id, answered=health.user_id))
        agent.close()
        return False
    slot.running_build = health.build
    slot.count.note_processes(health.processes)
    slot.live = live_agent(slot, agent)
    return True


class SlotTable:
    """The slots by user, made on first use. Thread-safe; a slot's own state is under its lock."""

    def __init__(self) -> None:
        self._slots: dict[int, AgentSlot] = {}
        self._lock = threading.Lock()

    def get(self, user_id: int) -> AgentSlot | None:
        with self._lock:
            return self._slots.get(user_id)

    def slot(self, user_id: int) -> AgentSlot:
        with self._lock:
            slot = self._slots.get(user_id)
            if slot is None:
                slot = self._slots[user_id] = AgentSlot(user_id)
            return slot

    def all(self) -> list[AgentSlot]:
        with self._lock:
            return list(self._slots.values())

    def drop_agents(self) -> None:
        """At shutdown: close every agent's clients (the sandboxes keep running)."""
        for slot in self.all():
            with slot.lock:
                slot.forget_agent()

    def forget(self, user_id: int, *, agent: LiveAgent | None = None, stalled: bool = False) -> None:
        slot = self.get(user_id)
        if slot is None or (agent is not None and slot.live is not agent):
            return  # already replaced: the new agent did not fail
        # No lock: a start may hold the slot's for seconds. At worst a just-replaced agent is
        # inspected once more by the next `ensure`.
        slot.stalled = slot.stalled or stalled
        slot.forgotten = True

    def cancel_calls(
        self, user_id: int, *, run_id: str | None, session_id: str | None, stop: Callable[[int], None]
    ) -> int:
        """The backend's `cancel_calls`: asked of the live agent, never starting one. Not under
        the slot's lock (a start holds it for seconds): a call still starting its sandbox has not
        reached the agent, and the router's next cancel does. An agent that does not answer a
        cancel is stopped (`stop`)."""
        slot = self.get(user_id)
        live = slot.live if slot is not None else None
        if live is None:
            return 0
        try:
            return live.blocking.cancel(run_id=run_id, session_id=session_id)
        except AgentUnavailable as exc:
            log.warning("sandbox did not answer a cancel; stopping it %s", kv(user=user_id, error=exc.message))
            stop(user_id)
            return 0
