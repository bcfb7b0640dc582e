"""The admin's hand on one user's sandbox: stop, restart, pause, resume (POST
/v1/admin/users/{uid}/sandbox/{action} and the console's buttons), each audited."""

from __future__ import annotations

from enum import Enum

from orchestrator import audit
from orchestrator.errors import Conflict
from orchestrator.sandboxes.router import SandboxRouter
from orchestrator.state_store import StateStore


class SandboxAction(str, Enum):
    STOP = "stop"
    RESTART = "restart"
    PAUSE = "pause"
    RESUME = "resume"


def sandbox_state(states: dict[int, str], user_id: int) -> str:
    """Pure: a user's sandbox state as the backends report it; `stopped` when none knows it."""
    return states.get(user_id, "stopped")


class SandboxControl:
    def __init__(self, store: StateStore, sandboxes: SandboxRouter) -> None:
        self._store = store
        self._sandboxes = sandboxes

    def states(self) -> dict[int, str]:
        """Every known sandbox's state by user (a running one wins over a stopped leftover)."""
        found: dict[int, str] = {}
        for status in self._sandboxes.status():
            if found.get(status.user_id) in ("running", "paused", "starting"):
                continue
            found[status.user_id] = status.state
        return found

    def state_of(self, user_id: int) -> str:
        return sandbox_state(self.states(), user_id)

    def act(self, user_id: int, action: SandboxAction, *, actor: str) -> str:
        """Do it; returns the sandbox's state after. A pause without a running, idle sandbox,
        or a resume of one not paused, is a 409 and changes nothing."""
        backend = self._sandboxes.backend_for(user_id)
        if action is SandboxAction.STOP:
            for each in self._sandboxes.backends.values():
                each.stop(user_id)
            state = "stopped"
        elif action is SandboxAction.RESTART:
            for each in self._sandboxes.backends.values():
                each.stop(user_id)
            backend.ensure(self._sandboxes.sandbox_user(user_id))
            state = "running"
        elif action is SandboxAction.PAUSE:
            if not backend.pause(user_id):
                raise Conflict(
                    f"user {user_id} has no running sandbox that can be paused now (none, a call in flight,"
                    f" or the {backend.name} backend does not pause)",
                    field="action",
                )
            state = "paused"
        else:
            if backend.resume(self._sandboxes.sandbox_user(user_id)) is None:
                raise Conflict(f"the sandbox of user {user_id} is not paused", field="action")
            state = "running"
        with self._store.write() as tx:
            audit.record(tx, actor=actor, action=f"sandbox.{action.value}", runtime_user_id=user_id, backend=backend.name)
        return state
