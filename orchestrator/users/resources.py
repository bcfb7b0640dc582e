"""Per-user CPU and memory for a user's sandbox, set by the admin within the operator's maxima
(ORCH_USER_MAX_CPUS, ORCH_USER_MAX_MEMORY_MB); a user without an override gets
ORCH_SANDBOX_CPUS and ORCH_SANDBOX_MEMORY_MB. A change applies from the sandbox's next start
(the console's restart button, or `POST /v1/admin/users/{uid}/sandbox/restart`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from orchestrator import audit
from orchestrator.clock import now_iso
from orchestrator.errors import InvalidInput
from orchestrator.state_store import StateStore
from orchestrator.users.repository import UserRepository


@dataclass(frozen=True)
class Resources:
    cpus: float
    memory_mb: int


@dataclass(frozen=True)
class Maxima:
    cpus: float
    memory_mb: int


def check_resources(cpus: float | None, memory_mb: int | None, maxima: Maxima) -> None:
    """Pure: a 422 naming the field for a value above the operator's maximum (a value of None
    is "back to the default")."""
    if cpus is not None and cpus > maxima.cpus:
        raise InvalidInput(f"cpus {cpus} is above the operator's maximum {maxima.cpus} (ORCH_USER_MAX_CPUS)", field="cpus")
    if memory_mb is not None and memory_mb > maxima.memory_mb:
        raise InvalidInput(
            f"memory_mb {memory_mb} is above the operator's maximum {maxima.memory_mb} (ORCH_USER_MAX_MEMORY_MB)",
            field="memory_mb",
        )


def effective_resources(default: Resources, cpus: float | None, memory_mb: int | None) -> Resources:
    """Pure: what a user's sandbox gets: the override where there is one, else the default."""
    return Resources(cpus if cpus is not None else default.cpus, memory_mb if memory_mb is not None else default.memory_mb)


class ResourceOverrides:
    """The overrides, kept in memory (every sandbox start reads them) and in `user_resources`."""

    def __init__(self, store: StateStore, *, default: Resources, maxima: Maxima) -> None:
        self._store = store
        self.default = default
        self.maxima = maxima
        self._lock = threading.Lock()
        with store.read() as tx:
            rows = tx.all("SELECT user_id, cpus, memory_mb FROM user_resources")
        self._overrides: dict[int, tuple[float | None, int | None]] = {
            row["user_id"]: (row["cpus"], row["memory_mb"]) for row in rows
        }

    def override_of(self, user_id: int) -> tuple[float | None, int | None]:
        return self._overrides.get(user_id, (None, None))

    def of(self, user_id: int) -> Resources:
        return effective_resources(self.default, *self.override_of(user_id))

    def has_override(self, user_id: int) -> bool:
        return user_id in self._overrides

    def put(self, user_id: int, *, cpus: float | None, memory_mb: int | None, actor: str) -> Resources:
        """Set (or, with both None, clear) the user's override; refused above the maxima."""
        check_resources(cpus, memory_mb, self.maxima)
        with self._lock:
            with self._store.write() as tx:
                UserRepository.ensure(tx, user_id)
                if cpus is None and memory_mb is None:
                    tx.execute("DELETE FROM user_resources WHERE user_id = ?", (user_id,))
                else:
                    tx.execute(
                        "INSERT INTO user_resources (user_id, cpus, memory_mb, actor, changed_at) VALUES (?, ?, ?, ?, ?)"
                        " ON CONFLICT (user_id) DO UPDATE SET cpus = excluded.cpus, memory_mb = excluded.memory_mb,"
                        " actor = excluded.actor, changed_at = excluded.changed_at",
                        (user_id, cpus, memory_mb, actor, now_iso()),
                    )
                audit.record(tx, actor=actor, action="user.resources_set", runtime_user_id=user_id, cpus=cpus, memory_mb=memory_mb)
            if cpus is None and memory_mb is None:
                self._overrides.pop(user_id, None)
            else:
                self._overrides[user_id] = (cpus, memory_mb)
        return self.of(user_id)

    def forget(self, user_id: int) -> None:
        """A purged user's override (its row goes with the purge's transaction)."""
        with self._lock:
            self._overrides.pop(user_id, None)
