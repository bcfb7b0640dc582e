"""The skill provider of runs: syncs the runtime user's skill
links into the session and tells the run what it may use. It also owns what keeps the skill
store current and small: the hot-update watcher callback and the GC."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from mounts import ids
from mounts.fs.flags import READ_FLAGS
from mounts.skillstore.fingerprint import SKILL_DOC

from mounts.skillstore.content_store import ContentStore
from mounts.layout import DataLayout
from mounts.skillstore.session_links import SessionLinker
from mounts.skillstore.gc import GcReport, SkillStoreGc
from mounts.skillstore.sources import SkillSources
from mounts.skillstore.sync import SkillSync, SyncResult
from mounts.skillstore.views import SkillViews
from orchestrator.log import kv
from orchestrator.mcp.skill_resources import front_matter
from orchestrator.skills.port import RunSkills, SkillCatalogEntry
from orchestrator.users.dirs import UserDirectories

log = logging.getLogger(__name__)

DAY_S = 86_400.0
SKILL_DOC_READ_MAX = 64 * 1024  # the front matter is at the top of SKILL.md


def run_skills(result: SyncResult) -> RunSkills:
    """Available = what is linked now (system + the runtime user's personal - failed)."""
    return RunSkills(
        available=result.available,
        failed=result.failed,
        catalog=tuple(SkillCatalogEntry(s.name, s.path, s.kind.value) for s in result.linked),
    )


class SkillService:
    def __init__(self, layout: DataLayout, directories: UserDirectories | None = None) -> None:
        """`directories` gives a user's skill places their owners and modes; the
        `orchestrator gc` command runs without it."""
        self.layout = layout
        self.directories = directories
        self.store = ContentStore(layout)
        self.store.ensure_dirs()
        self.sources = SkillSources(layout)
        self.views = SkillViews(
            layout, self.store, prepare_user_dir=directories.ensure_skill_views_dir if directories else None
        )
        self.linker = SessionLinker(layout, self._prepare_links_dir if directories else None)
        self.sync = SkillSync(layout, self.sources, self.views, self.linker)
        self.gc = SkillStoreGc(layout, self.store, self.views)
        self._declared: dict[str, str | None] = {}  # fingerprint -> the template its SKILL.md names

    def _prepare_links_dir(self, user_id: int, session_id: str) -> None:
        # A session's skills dir belongs to the sandbox user, like the rest of its runtime dir.
        assert self.directories is not None
        self.directories.ensure_session_runtime(user_id, session_id, is_owner=False)

    def sync_for_run(
        self, agent_id: str, runtime_user_id: int, session_id: str, *, owner_user_id: int | None = None
    ) -> RunSkills:
        return run_skills(self.sync.sync_to_session(agent_id, runtime_user_id, session_id, owner=owner_user_id))

    def templates_needed(self, runtime_user_id: int, skills: RunSkills) -> dict[str, str]:
        """The sandbox template each usable skill of a run declares (`template:` in its SKILL.md
        front matter), by skill name. Read from the skill's source (the admin's `skills/` or the
        bot's `userskills/{uid}/`, which no sandbox can write), once per fingerprint."""
        needs = {}
        for entry in skills.catalog:
            sources = self.sources.system() if entry.kind == "system" else self.sources.personal(runtime_user_id)
            source = sources.skills.get(entry.name)
            if source is None or source.fingerprint is None:
                continue
            if source.fingerprint not in self._declared:
                if len(self._declared) > 10_000:  # a bound, not an eviction policy
                    self._declared.clear()
                self._declared[source.fingerprint] = _declared_template(source.path)
            template = self._declared[source.fingerprint]
            if template is not None:
                needs[entry.name] = template
        return needs

    @property
    def watched_dirs(self) -> list[Path]:
        return [self.layout.skills_root, self.layout.userskills_root]

    def on_source_change(self, paths: set[Path]) -> None:
        """The file watcher's callback: invalidate, then re-hash right away (off the run path)."""
        if any(path.parent == self.layout.userskills_root for path in paths):
            self.protect_personal_sources()  # a new user's personal skills appeared
        self.sources.invalidate_paths(paths)
        self.sources.refresh_dirty()

    def protect_personal_sources(self) -> None:
        """Give every `userskills/{uid}/` its read-only policy (root:{the user's gid} 0750), so
        one user's sandbox cannot read another's personal skills even without a mount
        namespace. Whoever provisions personal skills should create the directory so; this
        repairs it at start and as soon as the watcher sees a new one."""
        if self.directories is None:
            return
        try:
            names = os.listdir(self.layout.userskills_root)
        except FileNotFoundError:
            return
        for name in names:
            try:
                user_id = ids.user_id(int(name)) if name.isdigit() else None
            except ids.InvalidIdentifier:
                user_id = None
            if user_id is None:
                continue
            try:
                self.directories.ensure_userskills_dir(user_id)
            except (OSError, RuntimeError) as exc:
                log.warning("cannot protect personal skills %s", kv(user=user_id, error=exc))

    def collect_garbage(self, *, max_age_days: float, dry_run: bool = False, verify: bool = False) -> GcReport:
        return self.gc.collect(max_age_s=max_age_days * DAY_S, dry_run=dry_run, verify=verify)


def _declared_template(skill_dir: Path) -> str | None:
    """The `template:` of a skill's SKILL.md front matter, read without following a symlink."""
    try:
        fd = os.open(skill_dir / SKILL_DOC, READ_FLAGS)
    except OSError:
        return None
    try:
        text = os.read(fd, SKILL_DOC_READ_MAX).decode("utf-8", errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    return front_matter(text).template
