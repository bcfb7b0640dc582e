"""Fingerprints and manifests (pure)."""

from __future__ import annotations

import dataclasses

import pytest

from mounts.skillstore.fingerprint import (
    EntryKind,
    ManifestEntry,
    ManifestError,
    SkillManifest,
    manifest_problems,
    symlink_problem,
)

D, F, L = EntryKind.DIR, EntryKind.FILE, EntryKind.SYMLINK
SHA_A = "a" * 64
SHA_B = "b" * 64


def tree(*entries: ManifestEntry) -> SkillManifest:
    return SkillManifest.of([ManifestEntry("SKILL.md", F, sha256=SHA_A, size=3), *entries])


def link(path: str, target: str) -> ManifestEntry:
    return ManifestEntry(path, L, target=target)


def test_fingerprint_is_independent_of_listing_order() -> None:
    entries = [ManifestEntry("b", F, sha256=SHA_A), ManifestEntry("a", D), ManifestEntry("a/x", F, sha256=SHA_B)]
    assert SkillManifest.of(entries).fingerprint == SkillManifest.of(reversed(entries)).fingerprint


@pytest.mark.parametrize(
    "change",
    [
        {"path": "scripts/other.sh"},
        {"executable": False},
        {"sha256": SHA_B},
    ],
)
def test_every_recorded_field_changes_the_fingerprint(change: dict) -> None:
    base = ManifestEntry("scripts/run.sh", F, executable=True, sha256=SHA_A, size=10)
    before = tree(ManifestEntry("scripts", D), base).fingerprint
    after = tree(ManifestEntry("scripts", D), dataclasses.replace(base, **change)).fingerprint
    assert before != after


def test_type_and_symlink_target_change_the_fingerprint() -> None:
    as_dir = tree(ManifestEntry("x", D)).fingerprint
    as_link = tree(link("x", "SKILL.md")).fingerprint
    as_other_link = tree(link("x", "./SKILL.md")).fingerprint
    assert len({as_dir, as_link, as_other_link}) == 3


def test_size_is_not_part_of_the_identity_beyond_the_content_hash() -> None:
    # The content hash already fixes the size; the size is kept for reports only.
    a = tree(ManifestEntry("f", F, sha256=SHA_B, size=1)).fingerprint
    b = tree(ManifestEntry("f", F, sha256=SHA_B, size=2)).fingerprint
    assert a == b


def test_separators_in_names_cannot_alias_two_trees() -> None:
    one = SkillManifest.of([ManifestEntry("a", F, sha256=SHA_A), ManifestEntry("b", L, target="c")])
    two = SkillManifest.of([ManifestEntry("a", F, sha256=SHA_A), ManifestEntry("b\nc", L, target="")])
    assert one.fingerprint != two.fingerprint


@pytest.mark.parametrize("bad", ["", "/abs", "a//b", "a/./b", "../x", "a/..", "nul\0byte"])
def test_manifest_paths_must_be_clean_and_relative(bad: str) -> None:
    with pytest.raises(ManifestError):
        SkillManifest.of([ManifestEntry(bad, F, sha256=SHA_A)])


def test_manifest_json_round_trip_and_tamper_detection() -> None:
    run = ManifestEntry("bin/run", F, executable=True, sha256=SHA_B, size=7)
    m = tree(ManifestEntry("bin", D), run, link("r", "bin/run"))
    again = SkillManifest.from_json(m.to_json())
    assert again == m and again.fingerprint == m.fingerprint
    with pytest.raises(ManifestError):
        SkillManifest.from_json(m.to_json().replace(SHA_B, SHA_A))
    with pytest.raises(ManifestError):
        SkillManifest.from_json("{not json")


def test_undecodable_names_survive_the_json_round_trip() -> None:
    name = b"caf\xe9.txt".decode("utf-8", "surrogateescape")
    m = tree(ManifestEntry(name, F, sha256=SHA_B))
    assert SkillManifest.from_json(m.to_json()).fingerprint == m.fingerprint


@pytest.mark.parametrize(
    ("entries", "link_path"),
    [
        ([link("l", "/etc/passwd")], "l"),
        ([link("l", "..")], "l"),
        ([link("l", "../other-skill/SKILL.md")], "l"),
        ([ManifestEntry("a", D), link("a/l", "../../x")], "a/l"),
        ([link("l", "missing/../../x")], "l"),  # dangling components are judged lexically
        # a `..` after another symlink counts from where that symlink leads
        ([ManifestEntry("x", D), ManifestEntry("x/y", D), ManifestEntry("x/y/z", D),
          link("x/y/link2", "../.."), link("x/y/z/link1", "../link2/..")], "x/y/z/link1"),
        ([link("up", "/"), link("l", "up/etc")], "l"),  # through an absolute symlink
    ],
)
def test_symlinks_that_can_leave_the_skill_are_problems(entries: list[ManifestEntry], link_path: str) -> None:
    m = tree(*entries)
    assert symlink_problem(m.by_path, link_path) is not None
    assert manifest_problems(m)


@pytest.mark.parametrize(
    ("entries", "link_path"),
    [
        ([link("l", "SKILL.md")], "l"),
        ([link("l", ".")], "l"),
        ([ManifestEntry("a", D), ManifestEntry("a/b", D), link("a/b/l", "../../SKILL.md")], "a/b/l"),
        # kernel-style: link2 leads deeper, so `..` after it stays inside
        ([ManifestEntry("a", D), ManifestEntry("a/b", D), ManifestEntry("a/b/c", D),
          link("deep", "a/b/c"), link("l", "deep/../..")], "l"),
        ([link("l", "not-there-yet")], "l"),
    ],
)
def test_symlinks_inside_the_skill_are_fine(entries: list[ManifestEntry], link_path: str) -> None:
    m = tree(*entries)
    assert symlink_problem(m.by_path, link_path) is None
    assert manifest_problems(m) == []


def test_symlink_loops_are_problems() -> None:
    m = tree(link("a", "b"), link("b", "a"))
    assert "loops" in (symlink_problem(m.by_path, "a") or "")


def test_a_skill_needs_a_regular_skill_md() -> None:
    assert manifest_problems(SkillManifest.of([ManifestEntry("README.md", F, sha256=SHA_A)]))
    assert manifest_problems(SkillManifest.of([ManifestEntry("SKILL.md", D)]))
    assert manifest_problems(SkillManifest.of([link("SKILL.md", "x"), ManifestEntry("x", F, sha256=SHA_A)]))
