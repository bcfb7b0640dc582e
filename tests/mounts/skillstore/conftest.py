"""Fixtures for the skill store tests: real directories, real files, the real components."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from mounts.skillstore.content_store import ContentStore
from mounts.layout import DataLayout
from mounts.skillstore.session_links import PrepareDir, SessionLinker
from mounts.skillstore.gc import SkillStoreGc
from mounts.skillstore.sources import SkillSources
from mounts.skillstore.sync import SkillSync
from mounts.skillstore.views import SkillViews


def write_skill(root: Path, files: dict[str, str | bytes], *, executable: tuple[str, ...] = ()) -> Path:
    """A skill directory with a SKILL.md (unless `files` names one) and the given files."""
    root.mkdir(parents=True, exist_ok=True)
    files = {"SKILL.md": f"# {root.name}\n", **files}
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        os.chmod(path, 0o755 if rel in executable else 0o644)
    return root


@dataclass
class SkillWorld:
    layout: DataLayout
    store: ContentStore
    sources: SkillSources
    views: SkillViews
    linker: SessionLinker
    sync: SkillSync
    gc: SkillStoreGc

    def system_skill(self, name: str, files: dict[str, str | bytes] | None = None, **kw: tuple[str, ...]) -> Path:
        return write_skill(self.layout.skill_source(name), files or {}, **kw)

    def personal_skill(self, uid: int, name: str, files: dict[str, str | bytes] | None = None) -> Path:
        return write_skill(self.layout.userskill_source(uid, name), files or {})

    def changed(self, *paths: Path) -> None:
        """What the file watcher reports after an edit."""
        self.sources.invalidate_paths(paths)

    def real(self, path: Path) -> Path:
        """A view is a symlink to its version; the scanner wants the directory itself."""
        return Path(os.path.realpath(path))

    def link_names(self, uid: int, sid: str) -> list[str]:
        d = self.layout.session_skills_dir(uid, sid)
        return sorted(p.name for p in d.iterdir() if p.is_symlink()) if d.exists() else []


def make_world(data_dir: Path, prepare: PrepareDir | None = None) -> SkillWorld:
    layout = DataLayout(data_dir)
    store = ContentStore(layout)
    store.ensure_dirs()
    sources = SkillSources(layout)
    views = SkillViews(layout, store)
    linker = SessionLinker(layout, prepare)
    sync = SkillSync(layout, sources, views, linker)
    return SkillWorld(layout, store, sources, views, linker, sync, SkillStoreGc(layout, store, views))


@pytest.fixture
def world(tmp_path: Path) -> SkillWorld:
    return make_world(tmp_path / "data")
