"""What a run needs from skill sync: the skills it may use, and those that failed (left out)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class SkillCatalogEntry:
    name: str
    path: str  # runtime/{runtime}/{sid}/skills/{name}
    kind: str  # system | personal


@dataclass(frozen=True)
class RunSkills:
    available: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    catalog: tuple[SkillCatalogEntry, ...] = field(default_factory=tuple)


class SkillProvider(Protocol):
    def sync_for_run(
        self, agent_id: str, runtime_user_id: int, session_id: str, *, owner_user_id: int | None = None
    ) -> RunSkills:
        """Sync the runtime user's skill links into the session and say what is usable.
        `owner_user_id` only goes into the logs (they carry session=, owner=, runtime_user=)."""


class NoSkills:
    """A provider for deployments without skills."""

    def sync_for_run(
        self, agent_id: str, runtime_user_id: int, session_id: str, *, owner_user_id: int | None = None
    ) -> RunSkills:
        return RunSkills()
