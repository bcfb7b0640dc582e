"""The skill provider of runs (SPEC §5, §7; seed 002 §5.3, D7): syncs the runtime user's skill
links into the session and tells the run what it may use. It also owns what keeps the skill
store current and small: the hot-update watcher callback and the GC."""

from __future__ import annotations

import logging
from pathlib import Path

from mounts.content_store import ContentStore
from mounts.layout import DataLayout
from mounts.session_links import PrepareDir, SessionLinker
from mounts.skill_gc import GcReport, SkillStoreGc
from mounts.skill_sources import SkillSources
from mounts.skill_sync import SkillSync, SyncResult
from mounts.skill_views import SkillViews
from orchestrator.skills_port import RunSkills, SkillCatalogEntry

log = logging.getLogger(__name__)

DAY_S = 86_400.0


def run_skills(result: SyncResult) -> RunSkills:
    """D7: available = what is linked now (system + the runtime user's personal - failed)."""
    return RunSkills(
        available=result.available,
        failed=result.failed,
        catalog=tuple(SkillCatalogEntry(s.name, s.path, s.kind.value) for s in result.linked),
    )


class SkillService:
    def __init__(self, layout: DataLayout, *, prepare_links_dir: PrepareDir | None = None) -> None:
        self.layout = layout
        self.store = ContentStore(layout)
        self.store.ensure_dirs()
        self.sources = SkillSources(layout)
        self.views = SkillViews(layout, self.store)
        self.linker = SessionLinker(layout, prepare_links_dir)
        self.sync = SkillSync(layout, self.sources, self.views, self.linker)
        self.gc = SkillStoreGc(layout, self.store, self.views)

    def sync_for_run(
        self, agent_id: str, runtime_user_id: int, session_id: str, *, owner_user_id: int | None = None
    ) -> RunSkills:
        return run_skills(self.sync.sync_to_session(agent_id, runtime_user_id, session_id, owner=owner_user_id))

    @property
    def watched_dirs(self) -> list[Path]:
        return [self.layout.skills_root, self.layout.userskills_root]

    def on_source_change(self, paths: set[Path]) -> None:
        """The file watcher's callback: invalidate, then re-hash right away (off the run path)."""
        self.sources.invalidate_paths(paths)
        self.sources.refresh_dirty()

    def collect_garbage(self, *, max_age_days: float, dry_run: bool = False, verify: bool = False) -> GcReport:
        return self.gc.collect(max_age_s=max_age_days * DAY_S, dry_run=dry_run, verify=verify)
