"""Syncing a runtime user's skills into a session (a failed skill has no link).

`sync_to_session(agent, runtime_user, session)` makes `runtime/{uid}/{sid}/skills/` hold one
link per usable skill: system skills through the user's hard-linked view, personal skills
straight to `userskills/{uid}/{name}` (a personal skill shadows a system skill of the same
name). A skill that cannot be materialized or linked, or is invalid, has its link removed and
is returned in `failed`; one failure never stops the others.

The sync state is keyed by (agent, user, session), so two speakers of one group session never
touch each other's state or links. It is a bounded in-memory cache over what is on disk: when
the source generations are unchanged and the links are still in place, a sync is a handful of
syscalls (a warm sync); otherwise (first sync since start, or a skill changed) the views and
links are brought up to date, which finds existing views and links in place without
rebuilding them.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from mounts import ids
from mounts.fs.lock import flocked
from mounts.layout import DataLayout
from mounts.log_fields import kv
from mounts.skillstore.session_links import LinksDirUnavailable, SessionLinker
from mounts.skillstore.scan import InvalidSkill, SkillVanished, SourceChanged
from mounts.skillstore.sources import SkillKind, SkillSource, SkillSources, SourceSet
from mounts.skillstore.views import SkillViews

log = logging.getLogger(__name__)

MAX_SYNC_STATES = 100_000


@dataclass(frozen=True)
class LinkedSkill:
    name: str
    kind: SkillKind
    path: str  # the link: runtime/{uid}/{sid}/skills/{name}


@dataclass(frozen=True)
class SyncResult:
    failed: tuple[str, ...] = ()
    linked: tuple[LinkedSkill, ...] = ()

    @property
    def available(self) -> tuple[str, ...]:
        return tuple(skill.name for skill in self.linked)


@dataclass(frozen=True)
class _SyncState:
    system_generation: int
    personal_generation: int
    links: dict[str, str]
    result: SyncResult


class SkillSync:
    def __init__(
        self,
        layout: DataLayout,
        sources: SkillSources,
        views: SkillViews,
        linker: SessionLinker,
        *,
        max_states: int = MAX_SYNC_STATES,
    ) -> None:
        self.layout = layout
        self.sources = sources
        self.views = views
        self.linker = linker
        self._states: OrderedDict[tuple[str, int, str], _SyncState] = OrderedDict()
        self._states_lock = threading.Lock()
        self._max_states = max_states

    def state_keys(self) -> list[tuple[str, int, str]]:
        with self._states_lock:
            return list(self._states)

    def sync_to_session(self, agent: str, runtime_user: int, session: str, *, owner: int | None = None) -> SyncResult:
        agent_id = ids.name(agent, "agent_id")
        uid = ids.user_id(runtime_user, "runtime_user_id")
        sid = ids.session_id(session)
        key = (agent_id, uid, sid)
        system = self.sources.system()
        personal = self.sources.personal(uid)
        with self._states_lock:
            state = self._states.get(key)
        if (
            state is not None
            and state.system_generation == system.generation
            and state.personal_generation == personal.generation
            and self.linker.verify(uid, sid, state.links)
        ):
            with self._states_lock:
                if key in self._states:
                    self._states.move_to_end(key)
            return state.result
        fields = {"session": sid, "owner": owner, "runtime_user": uid, "agent": agent_id}
        result, links, settled = self._full_sync(uid, sid, system, personal, fields)
        new_state = _SyncState(
            # Only a settled result may be served warm: after a source changed under this sync,
            # or a failure that may pass (I/O, a link in the way), the next sync tries again.
            system.generation if settled else 0,
            personal.generation if settled else 0,
            links,
            result,
        )
        with self._states_lock:
            self._states[key] = new_state
            self._states.move_to_end(key)
            while len(self._states) > self._max_states:
                self._states.popitem(last=False)
        return result

    # the full pass ----------------------------------------------------------------------
    def _full_sync(
        self, uid: int, sid: str, system: SourceSet, personal: SourceSet, fields: dict[str, object]
    ) -> tuple[SyncResult, dict[str, str], bool]:
        failed: dict[str, str] = {}
        settled = True
        chosen: dict[str, SkillSource] = {**system.skills, **personal.skills}  # personal shadows system
        with flocked(self.layout.user_view_lock(uid), exclusive=True):
            with flocked(self.layout.skill_store_lock, exclusive=False):
                self.views.ensure_user_dirs(uid)
                self.views.clean_user(uid)
                for name, source in sorted(system.skills.items()):
                    if name in personal.skills or source.manifest is None:
                        continue
                    problem, source_settled = self._ensure_view(uid, source, fields)
                    settled &= source_settled
                    if problem is not None:
                        failed[name] = problem
                for name in self.views.view_names(uid):
                    if name not in system.skills:
                        self.views.remove_view(uid, name)
            desired: dict[str, str] = {}
            for name, source in sorted(chosen.items()):
                if name in failed:
                    continue
                if source.problem is not None:
                    failed[name] = source.problem
                    continue
                desired[name] = str(link_target_path(self.layout, uid, source))
            try:
                for name, problem in self.linker.apply(uid, sid, desired).items():
                    failed[name] = problem
                    desired.pop(name)
                    settled = False
            except LinksDirUnavailable as exc:
                for name in desired:
                    failed[name] = str(exc)
                desired = {}
                settled = False
        for name, problem in sorted(failed.items()):
            log.warning("skill left out %s", kv(**fields, skill=name, reason=problem))
        linked = tuple(
            LinkedSkill(name, chosen[name].kind, self.linker.link_path(uid, sid, name)) for name in sorted(desired)
        )
        return SyncResult(tuple(sorted(failed)), linked), desired, settled

    def _ensure_view(self, uid: int, source: SkillSource, fields: dict[str, object]) -> tuple[str | None, bool]:
        """Bring the user's view of one system skill to the source's fingerprint.

        Returns (problem or None, whether the outcome may be reused until the source changes)."""
        for attempt in (1, 2):
            assert source.fingerprint is not None
            try:
                outcome = self.views.ensure_view(uid, source.name, source.fingerprint, source.path)
                if outcome.built:
                    log.info(
                        "skill view updated %s",
                        kv(
                            **fields,
                            skill=source.name,
                            fingerprint=source.fingerprint[:16],
                            copied_files=outcome.copied_files,
                        ),
                    )
                return None, attempt == 1
            except (SourceChanged, SkillVanished, InvalidSkill) as exc:
                # The source moved on since it was hashed: hash it again and retry once.
                self.sources.invalidate_skill(SkillKind.SYSTEM, None, source.name)
                fresh = self.sources.system().skills.get(source.name)
                if attempt == 2 or fresh is None or fresh.manifest is None:
                    reason = fresh.problem if fresh is not None and fresh.problem else str(exc)
                    return f"view could not be materialized: {reason}", False
                source = fresh
            except OSError as exc:
                return f"view could not be materialized: {exc.strerror or exc}", False
        raise AssertionError("unreachable")


def link_target_path(layout: DataLayout, uid: int, source: SkillSource) -> Path:
    """Where a session link of this skill points."""
    if source.kind is SkillKind.SYSTEM:
        return layout.user_view(uid, source.name)
    return layout.userskill_source(uid, source.name)
