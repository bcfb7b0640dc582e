"""The pure deciders of view building, session links and GC."""

from __future__ import annotations

from mounts.skillstore.fingerprint import EntryKind, ManifestEntry, SkillManifest
from mounts.skillstore.gc_plan import StoreEntry, plan_gc
from mounts.skillstore.link_plan import plan_link_changes
from mounts.layout import view_link_target, view_version_fingerprint, view_version_name
from mounts.skillstore.view_plan import VersionDir, plan_view_build, retired_versions

FP1, FP2 = "1" * 64, "2" * 64


def test_view_build_plan_creates_parents_first_and_seals_children_first() -> None:
    m = SkillManifest.of(
        [
            ManifestEntry("a-b", EntryKind.FILE, sha256=FP1),
            ManifestEntry("a/b/c", EntryKind.FILE, sha256=FP1),
            ManifestEntry("a/b", EntryKind.DIR),
            ManifestEntry("a", EntryKind.DIR),
            ManifestEntry("l", EntryKind.SYMLINK, target="a-b"),
        ]
    )
    plan = plan_view_build(m)
    assert plan.dirs == ("a", "a/b") and plan.dirs_bottom_up == ("a/b", "a")
    assert set(plan.files) == {"a-b", "a/b/c"} and plan.symlinks == (("l", "a-b"),)


def test_version_names_parse_back_and_reject_everything_else() -> None:
    name = view_version_name(FP1)
    assert view_version_fingerprint(name) == FP1
    # the view's symlink target fits in an ext4 inode (< 60 bytes): no data block per view
    assert len(view_link_target(FP1)) < 60
    for other in (".staging-0123abcd", name[:-1], name.upper(), name[:-1] + "1", FP1, "plain", name + "a"):
        assert view_version_fingerprint(other) is None


def test_only_replaced_versions_past_their_grace_retire() -> None:
    v1, v2, v3 = view_version_name(FP1), view_version_name(FP2), view_version_name("3" * 64)
    versions = [VersionDir(v1, 0.0), VersionDir(v2, 0.0), VersionDir(v3, 990.0), VersionDir(".staging-0123abcd", 0.0)]
    assert retired_versions(versions, {v2}, now=1000.0, grace_s=60) == (v1,)


def test_link_changes_touch_only_links_into_the_users_own_skill_places() -> None:
    roots = ["/d/skill-views/7", "/d/userskills/7"]
    existing = {
        "keep": "/d/skill-views/7/keep",
        "moved": "/d/skill-views/7/moved",
        "gone": "/d/skill-views/7/gone",
        "mine": "/home/me/notes",  # the sandbox user's own symlink
        "prefix": "/d/skill-views/70/x",  # prefix confusion: not ours
    }
    desired = {"keep": "/d/skill-views/7/keep", "moved": "/d/userskills/7/moved", "new": "/d/skill-views/7/new"}
    changes = plan_link_changes(desired, existing, roots)
    assert changes.create == (("moved", "/d/userskills/7/moved"), ("new", "/d/skill-views/7/new"))
    assert changes.remove == ("gone",)


def test_gc_removes_only_unreferenced_entries_older_than_both_limits() -> None:
    day = 86400.0
    now = 100 * day
    fp3, fp4 = "3" * 64, "4" * 64
    entries = [
        StoreEntry(FP1, "used", 0.0),
        StoreEntry(FP1, "same-content-other-name", 0.0),  # a version of FP1 serves both names
        StoreEntry(FP2, "old", now - 8 * day),
        StoreEntry(fp3, "young", now - 2 * day),
        StoreEntry(fp4, "fresh", now - 60),
    ]
    plan = plan_gc(entries, {FP1}, now=now, max_age_s=7 * day, grace_s=600)
    assert [e.name for e in plan.remove] == ["old"]
    assert (plan.kept_referenced, plan.kept_recent) == (2, 2)
    # max age 0 still leaves the grace period alone
    plan = plan_gc(entries, {FP1}, now=now, max_age_s=0, grace_s=600)
    assert sorted(e.name for e in plan.remove) == ["old", "young"]
