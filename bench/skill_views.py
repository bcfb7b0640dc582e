"""Skill views: disk use with hard links vs a copy per user, materializing a new
user's views vs `shutil.copytree`, and the warm sync per session.

usage: .venv/bin/python bench/skill_views.py [--users 200] [--skills 20] [--rounds 15]
Prints `name: value unit` lines. Real files in a fresh directory under /tmp; the timed pairs
(copytree, then materialization) alternate in one run so they share the machine's noise.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mounts.skillstore.content_store import ContentStore  # noqa: E402
from mounts.layout import DataLayout  # noqa: E402
from mounts.skillstore.session_links import SessionLinker  # noqa: E402
from mounts.skillstore.sources import SkillSources  # noqa: E402
from mounts.skillstore.sync import SkillSync  # noqa: E402
from mounts.skillstore.views import SkillViews  # noqa: E402

FILES_AT_ROOT = 12  # + SKILL.md
FILES_IN_SCRIPTS = 12  # one subdirectory, `scripts/`: 25 files and 2 directories per skill
TOTAL_BYTES = 10 * 1024 * 1024


def make_skills(root: Path, skills: int, rng: random.Random) -> None:
    files = skills * (1 + FILES_AT_ROOT + FILES_IN_SCRIPTS)
    average = TOTAL_BYTES // files
    for s in range(skills):
        skill = root / f"skill-{s:02}"
        (skill / "scripts").mkdir(parents=True)
        (skill / "SKILL.md").write_text(f"# skill {s}\n" + "Use this skill to do things.\n" * (average // 30))
        for i in range(FILES_AT_ROOT):
            (skill / f"ref-{i:02}.md").write_bytes(rng.randbytes(rng.randint(average // 4, average * 7 // 4)))
        for i in range(FILES_IN_SCRIPTS):
            path = skill / "scripts" / f"tool-{i:02}.py"
            path.write_bytes(rng.randbytes(rng.randint(average // 4, average * 7 // 4)))
            os.chmod(path, 0o755)


def disk_used(*roots: Path) -> int:
    """Bytes allocated under the roots, every inode counted once (what `du` reports)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [*dirnames, *filenames, None]:
                path = dirpath if name is None else os.path.join(dirpath, name)
                st = os.lstat(path)
                key = (st.st_dev, st.st_ino)
                if key not in seen:
                    seen.add(key)
                    total += st.st_blocks * 512
    return total


def build(data: Path) -> SkillSync:
    layout = DataLayout(data)
    store = ContentStore(layout)
    store.ensure_dirs()
    views = SkillViews(layout, store)
    return SkillSync(layout, SkillSources(layout), views, SessionLinker(layout))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--skills", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    rng = random.Random(2024)
    base = Path(tempfile.mkdtemp(prefix="bench-skill-views-", dir="/tmp"))
    try:
        data = base / "data"
        layout = DataLayout(data)
        make_skills(layout.skills_root, args.skills, rng)
        files = sum(len(f) for _, _, f in os.walk(layout.skills_root))
        source_bytes = sum(p.stat().st_size for p in layout.skills_root.rglob("*") if p.is_file())
        print(f"skills: {args.skills} count")
        print(f"files_per_user_set: {files} files")
        print(f"bytes_per_user_set: {source_bytes / 1048576:.2f} MiB")

        sync = build(data)
        start = time.perf_counter()
        sync.sources.system()
        print(f"fingerprint_all_sources: {ms(time.perf_counter() - start)} ms")
        start = time.perf_counter()
        assert sync.sync_to_session("default", 1, "s").failed == ()
        print(f"first_user_with_store_writes: {ms(time.perf_counter() - start)} ms")

        # A new user's views from the stored manifests vs one shutil.copytree per user, in pairs.
        copies, syncs, views_only = [], [], []
        copy_root = base / "copies"
        next_user = 2
        for round_no in range(args.rounds):
            target = copy_root / str(round_no)
            start = time.perf_counter()
            shutil.copytree(layout.skills_root, target, symlinks=True)
            copies.append(time.perf_counter() - start)
            start = time.perf_counter()
            assert sync.sync_to_session("default", next_user, "s").failed == ()
            syncs.append(time.perf_counter() - start)
            next_user += 1
            # the views alone (no listing, session links or locks): from the stored manifests
            system = sync.sources.system()
            start = time.perf_counter()
            sync.views.ensure_user_dirs(next_user)
            for name, source in system.skills.items():
                assert source.fingerprint is not None
                sync.views.ensure_view(next_user, name, source.fingerprint, source.path)
            views_only.append(time.perf_counter() - start)
            next_user += 1
        one_copy = disk_used(copy_root / "0")
        shutil.rmtree(copy_root)
        copytree_ms = statistics.median(copies)
        print(f"copytree_user_set: {ms(copytree_ms)} ms")
        print(f"new_user_views: {ms(statistics.median(views_only))} ms")
        print(f"new_user_sync: {ms(statistics.median(syncs))} ms")
        # each round's pair ran back to back: the median of the per-round ratios
        print(f"new_user_views_vs_copytree: {statistics.median(v / c for v, c in zip(views_only, copies)):.3f} ratio")
        print(f"new_user_sync_vs_copytree: {statistics.median(s / c for s, c in zip(syncs, copies)):.3f} ratio")

        for user in range(next_user, args.users + 1):
            sync.sync_to_session("default", user, "s")
        users = max(args.users, next_user - 1)
        store_bytes = disk_used(layout.content_store)
        linked = disk_used(layout.skill_views_root)
        per_user_copies = users * one_copy
        print(f"users: {users} count")
        print(f"disk_one_copy: {one_copy / 1024:.0f} KiB")
        print(f"disk_copy_per_user: {per_user_copies / 1048576:.1f} MiB")
        print(f"disk_hardlinked: {linked / 1048576:.1f} MiB")
        print(f"disk_store: {store_bytes / 1048576:.1f} MiB")
        print(f"disk_extra_per_user_view_set: {(linked - store_bytes) / users / 1024:.0f} KiB")
        print(f"disk_hardlinked_vs_copies: {100 * linked / per_user_copies:.2f} %")

        # Warm syncs: fingerprints unchanged, one session per user.
        warm = []
        for _ in range(3):
            for user in range(1, users + 1):
                start = time.perf_counter()
                sync.sync_to_session("default", user, "s")
                warm.append(time.perf_counter() - start)
        warm.sort()
        print(f"warm_sync: {ms(statistics.median(warm))} ms")
        print(f"warm_sync_p95: {ms(warm[int(len(warm) * 0.95)])} ms")

        # After a restart: memory is empty; hash the sources once, then each session's first
        # sync finds its views and links in place.
        restarted = build(data)
        start = time.perf_counter()
        restarted.sources.system()
        print(f"restart_fingerprint_all_sources: {ms(time.perf_counter() - start)} ms")
        first = []
        for user in range(1, users + 1):
            start = time.perf_counter()
            restarted.sync_to_session("default", user, "s")
            first.append(time.perf_counter() - start)
        print(f"first_sync_after_restart: {ms(statistics.median(first))} ms")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
