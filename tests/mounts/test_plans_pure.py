"""The pure deciders of view building, session links and GC."""

from __future__ import annotations

from mounts.fingerprint import EntryKind, ManifestEntry, SkillManifest
from mounts.gc_plan import StoreEntry, plan_gc
from mounts.link_plan import plan_link_changes
from mounts.view_plan import VersionDir, parse_version_name, plan_view_build, retired_versions

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
    assert parse_version_name(f"pdf-tools@{FP1}") == ("pdf-tools", FP1)
    for other in (".staging-0123abcd", f"x@{FP1[:-1]}", f"@{FP1}", f"../x@{FP1}", "plain"):
        assert parse_version_name(other) is None


def test_only_replaced_versions_past_their_grace_retire() -> None:
    versions = [VersionDir(f"a@{FP1}", 0.0), VersionDir(f"a@{FP2}", 0.0), VersionDir(f"b@{FP1}", 990.0),
                VersionDir(".staging-0123abcd", 0.0)]
    assert retired_versions(versions, {f"a@{FP2}"}, now=1000.0, grace_s=60) == (f"a@{FP1}",)


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
    entries = [
        StoreEntry(FP1, "used", 0.0),
        StoreEntry(FP1, "old", now - 8 * day),
        StoreEntry(FP2, "young", now - 2 * day),
        StoreEntry(FP2, "fresh", now - 60),
    ]
    plan = plan_gc(entries, {(FP1, "used")}, now=now, max_age_s=7 * day, grace_s=600)
    assert [e.name for e in plan.remove] == ["old"]
    assert (plan.kept_referenced, plan.kept_recent) == (1, 2)
    # max age 0 still leaves the grace period alone
    plan = plan_gc(entries, {(FP1, "used")}, now=now, max_age_s=0, grace_s=600)
    assert sorted(e.name for e in plan.remove) == ["old", "young"]
