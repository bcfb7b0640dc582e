"""Managing skill sources through the API (docs/skills.md, "Skills through the API").

System skills (`skills/{name}`) are the admin's; a user's personal skills
(`userskills/{uid}/{name}`) are provisioned by the bot for that user. Both are listed with what
the skill code knows about them (fingerprint, validity, why not), installed or replaced as a
whole from a checked package, and removed. After a change the skill sources are invalidated
and re-hashed at once, so the very next run sees it (the file watcher would, too, but later).
Every change is audited.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from mounts.skillstore.fingerprint import ManifestEntry
from mounts.skillstore.install import Installed, SkillInstaller, SkillNotInstalled
from mounts.skillstore.package import InvalidPackage, PackageLimits, build_package
from mounts.skillstore.sources import SkillKind, SkillSource, SourceSet
from orchestrator import audit
from orchestrator.errors import InvalidInput, NotFound
from orchestrator.log import kv
from orchestrator.skills.service import SkillService
from orchestrator.state_store import StateStore
from orchestrator.users.repository import UserRepository

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SkillInfo:
    """One skill source as the skill code knows it."""

    name: str
    kind: str  # system | personal
    user_id: int | None
    path: str
    valid: bool
    fingerprint: str | None
    problem: str | None
    files: int
    bytes: int
    entries: tuple[ManifestEntry, ...]


@dataclass(frozen=True)
class SkillListing:
    skills: tuple[SkillInfo, ...]
    ignored: tuple[tuple[str, str], ...]  # (entry name, why it is not a skill)


@dataclass(frozen=True)
class InstallReport:
    skill: SkillInfo
    created: bool
    changed: bool
    previous_fingerprint: str | None


def skill_info(source: SkillSource, user_id: int | None) -> SkillInfo:
    manifest = source.manifest
    return SkillInfo(
        name=source.name,
        kind=source.kind.value,
        user_id=user_id,
        path=str(source.path),
        valid=manifest is not None,
        fingerprint=source.fingerprint,
        problem=source.problem,
        files=len(manifest.files) if manifest else 0,
        bytes=manifest.total_bytes if manifest else 0,
        entries=manifest.entries if manifest else (),
    )


def _who(user_id: int | None) -> str:
    return "system skill" if user_id is None else f"personal skill of user {user_id}"


class SkillAdmin:
    def __init__(
        self,
        skills: SkillService,
        installer: SkillInstaller,
        store: StateStore,
        limits: PackageLimits,
    ) -> None:
        self.skills = skills
        self.installer = installer
        self.store = store
        self.limits = limits

    # reading ------------------------------------------------------------------------------
    def _sources(self, user_id: int | None) -> SourceSet:
        return self.skills.sources.system() if user_id is None else self.skills.sources.personal(user_id)

    def list(self, user_id: int | None = None) -> SkillListing:
        """System skills (`user_id` None) or one user's personal skills."""
        sources = self._sources(user_id)
        skills = tuple(skill_info(sources.skills[name], user_id) for name in sorted(sources.skills))
        return SkillListing(skills, sources.ignored)

    def get(self, user_id: int | None, name: str) -> SkillInfo:
        source = self._sources(user_id).skills.get(name)
        if source is None:
            raise NotFound(f"no {_who(user_id)} named {name}", field="name")
        return skill_info(source, user_id)

    # changing -----------------------------------------------------------------------------
    def _refresh(self, user_id: int | None, name: str) -> None:
        # Don't wait for the file watcher: the next run must see the change.
        kind = SkillKind.SYSTEM if user_id is None else SkillKind.PERSONAL
        self.skills.sources.invalidate_skill(kind, user_id, name)
        self._sources(user_id)  # re-hash now, off the next run's path

    def install(
        self, user_id: int | None, name: str, files: Mapping[str, tuple[bytes, bool]], *, actor: str
    ) -> InstallReport:
        """Install or replace the whole skill `name` (system when `user_id` is None)."""
        try:
            package = build_package(name, files, self.limits)
        except InvalidPackage as exc:
            raise InvalidInput(exc.message, field=exc.field) from None
        installed: Installed = self.installer.install(user_id, package)
        self._refresh(user_id, name)
        with self.store.write() as tx:
            if user_id is not None:
                UserRepository.ensure(tx, user_id)
            audit.record(
                tx,
                actor=actor,
                action="skill_installed",
                owner_user_id=user_id,
                skill=name,
                kind="system" if user_id is None else "personal",
                fingerprint=installed.fingerprint,
                previous_fingerprint=installed.previous_fingerprint,
                created=installed.created,
                changed=installed.changed,
                files=len(package.files),
                bytes=package.total_bytes,
            )
        log.info(
            "skill installed %s",
            kv(skill=name, user=user_id, fingerprint=installed.fingerprint[:12], created=installed.created,
               changed=installed.changed, files=len(package.files), actor=actor),
        )
        return InstallReport(self.get(user_id, name), installed.created, installed.changed, installed.previous_fingerprint)

    def remove(self, user_id: int | None, name: str, *, actor: str) -> str | None:
        """Remove the skill `name`; returns the fingerprint it had (None when it was invalid)."""
        try:
            removed = self.installer.remove(user_id, name)
        except SkillNotInstalled:
            raise NotFound(f"no {_who(user_id)} named {name}", field="name") from None
        self._refresh(user_id, name)
        with self.store.write() as tx:
            audit.record(
                tx,
                actor=actor,
                action="skill_removed",
                owner_user_id=user_id,
                skill=name,
                kind="system" if user_id is None else "personal",
                previous_fingerprint=removed.previous_fingerprint,
            )
        log.info("skill removed %s", kv(skill=name, user=user_id, actor=actor))
        return removed.previous_fingerprint
