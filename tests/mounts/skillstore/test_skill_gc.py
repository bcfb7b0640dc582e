"""GC of the content store: what goes, what stays, leftovers, verification, and a GC racing
materializations."""

from __future__ import annotations

import fcntl
import os
import threading
import time

from mounts.skillstore.scan import scan_skill
from tests.mounts.skillstore.conftest import SkillWorld

DAY = 86400.0


def age(world: SkillWorld, fp: str, name: str, days: float) -> None:
    t = time.time() - days * DAY
    os.utime(world.layout.content_entry(fp, name), (t, t))


def store_names(world: SkillWorld) -> set[tuple[str, str]]:
    found = set()
    for fp_dir in world.layout.content_store.iterdir():
        if fp_dir.name.startswith("."):
            continue
        found |= {(fp_dir.name, n) for n in os.listdir(fp_dir) if not n.startswith(".")}
    return found


def test_unreferenced_old_entries_go_and_referenced_or_recent_ones_stay(world: SkillWorld) -> None:
    src = world.system_skill("pdf", {"SKILL.md": "v1"})
    world.sync.sync_to_session("default", 5, "s")
    fp1 = world.views.current(5, "pdf")
    (src / "SKILL.md").write_text("v2")
    world.changed(src / "SKILL.md")
    world.sync.sync_to_session("default", 5, "s")
    fp2 = world.views.current(5, "pdf")
    assert fp1 and fp2
    orphan = world.system_skill("orphan", {"SKILL.md": "never viewed"})
    fp3 = scan_skill(orphan).fingerprint
    world.store.ensure_entry(fp3, "orphan", orphan)
    for fp, name in ((fp1, "pdf"), (fp2, "pdf"), (fp3, "orphan")):
        age(world, fp, name, 30)

    # fp1's version is retired but inside its grace period: still referenced
    report = world.gc.collect(max_age_s=7 * DAY)
    assert report.removed == ((fp3, "orphan"),)
    assert not world.layout.content_fp_dir(fp3).exists()  # its manifest went with it
    assert store_names(world) == {(fp1, "pdf"), (fp2, "pdf")}

    # once the replaced version is past its grace, it and its content go; the live view stays
    world.views.retired_grace_s = 0.0
    os.utime(world.layout.user_view_version(5, fp1), (0, 0))
    dry = world.gc.collect(max_age_s=7 * DAY, dry_run=True)
    assert dry.removed == ((fp1, "pdf"),) and store_names(world) == {(fp1, "pdf"), (fp2, "pdf")}
    report = world.gc.collect(max_age_s=7 * DAY)
    assert report.removed == ((fp1, "pdf"),) and report.retired_versions_removed == 1
    assert report.freed_bytes == 2
    assert store_names(world) == {(fp2, "pdf")}
    assert (world.layout.session_skill_link(5, "s", "pdf") / "SKILL.md").read_text() == "v2"


def test_recently_used_entries_are_kept_even_with_zero_days(world: SkillWorld) -> None:
    orphan = world.system_skill("orphan")
    fp = scan_skill(orphan).fingerprint
    world.store.ensure_entry(fp, "orphan", orphan)
    report = world.gc.collect(max_age_s=0)
    assert report.removed == () and report.kept_recent == 1
    assert world.gc.collect(max_age_s=0, grace_s=0, now=time.time() + 1).removed == ((fp, "orphan"),)


def test_deleted_hard_linked_content_stays_readable_through_views(world: SkillWorld) -> None:
    # A view's files are hard links: removing the store's names keeps the data.
    world.system_skill("pdf", {"a.txt": "still here"})
    world.sync.sync_to_session("default", 5, "s")
    fp = world.views.current(5, "pdf")
    assert fp
    entry = world.layout.content_entry(fp, "pdf")
    # (GC never takes a referenced entry; take it by hand to show what hard links guarantee)
    from mounts.fs.tree_removal import remove_tree

    remove_tree(entry)
    assert (world.layout.user_view(5, "pdf") / "a.txt").read_text() == "still here"


def test_leftovers_of_killed_runs_go_and_live_ones_stay(world: SkillWorld) -> None:
    src = world.system_skill("pdf")
    world.sync.sync_to_session("default", 5, "s")
    fp = world.views.current(5, "pdf")
    assert fp and src
    dead = [
        world.layout.content_staging(fp, "deadbeef01"),
        world.layout.content_trash(fp, "deadbeef02"),
        world.layout.user_view_staging(5, "deadbeef03"),
        world.layout.user_view_trash(5, "deadbeef04"),
        world.layout.content_store_trash("deadbeef05"),
    ]
    for path in dead:
        path.mkdir()
        (path / "partial").write_text("x")
        os.chmod(path, 0o555)
    alive = world.layout.content_staging(fp, "a11ce0001")
    alive.mkdir()
    fd = os.open(alive, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a live writer holds
    try:
        report = world.gc.collect(max_age_s=7 * DAY)
        assert report.leftovers_removed == len(dead)
        assert not any(p.exists() for p in dead)
        assert alive.exists()
    finally:
        os.close(fd)
    world.gc.collect(max_age_s=7 * DAY)
    assert not alive.exists()


def test_verify_finds_a_corrupt_entry_and_the_next_sync_rebuilds_from_source(world: SkillWorld) -> None:
    world.system_skill("pdf", {"a.txt": "good"})
    world.sync.sync_to_session("default", 5, "s")
    fp = world.views.current(5, "pdf")
    assert fp
    stored = world.layout.content_entry(fp, "pdf") / "a.txt"
    os.chmod(stored, 0o644)  # simulate bit rot / a careless admin
    stored.write_text("evil")
    os.chmod(stored, 0o444)
    report = world.gc.collect(max_age_s=7 * DAY, verify=True)
    assert report.corrupt == ((fp, "pdf"),)
    assert not world.store.has_entry(fp, "pdf")
    assert world.sync.sync_to_session("default", 5, "s").available == ("pdf",)
    assert (world.layout.session_skill_link(5, "s", "pdf") / "a.txt").read_text() == "good"
    assert world.store.verify_entry(fp, "pdf") is None


def test_gc_racing_materializations_never_breaks_a_view(world: SkillWorld) -> None:
    src = world.system_skill("pdf", {f"f{i}.txt": "0" for i in range(40)})
    stop = threading.Event()
    errors: list[BaseException] = []
    gc_runs = 0

    def collect_forever() -> None:
        nonlocal gc_runs
        while not stop.is_set():
            try:
                world.gc.collect(max_age_s=0, grace_s=0, now=time.time() + 3600)
                gc_runs += 1
            except BaseException as exc:
                errors.append(exc)
                return

    world.views.retired_grace_s = 0.0
    collector = threading.Thread(target=collect_forever)
    collector.start()
    try:
        for version in range(1, 40):
            for i in range(40):
                (src / f"f{i}.txt").write_text(str(version))
            world.changed(src)
            for uid in (5, 6):
                result = world.sync.sync_to_session("default", uid, "s")
                assert result.failed == (), result
                view = world.layout.session_skill_link(uid, "s", "pdf")
                assert {(view / f"f{i}.txt").read_text() for i in range(40)} == {str(version)}
    finally:
        stop.set()
        collector.join()
    assert not errors and gc_runs > 5
