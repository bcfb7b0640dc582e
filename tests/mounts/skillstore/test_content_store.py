"""The content store: written once through staging, read-only, manifest kept, races settled."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from mounts.skillstore.fingerprint import SkillManifest
from mounts.skillstore.scan import SourceChanged, scan_skill
from tests.mounts.skillstore.conftest import SkillWorld


def test_an_entry_is_a_read_only_copy_with_its_manifest(world: SkillWorld) -> None:
    src = world.system_skill("pdf", {"bin/run": "#!/bin/sh\n", "doc.txt": "d"}, executable=("bin/run",))
    manifest = scan_skill(src)
    entry = world.store.ensure_entry(manifest.fingerprint, "pdf", src)
    assert entry == world.layout.content_entry(manifest.fingerprint, "pdf")
    assert scan_skill(entry).fingerprint == manifest.fingerprint
    assert stat.S_IMODE(os.stat(entry).st_mode) == 0o555
    assert stat.S_IMODE(os.stat(entry / "bin").st_mode) == 0o555
    assert stat.S_IMODE(os.stat(entry / "doc.txt").st_mode) == 0o444
    assert stat.S_IMODE(os.stat(entry / "bin/run").st_mode) == 0o555
    stored = world.layout.content_manifest(manifest.fingerprint).read_text()
    assert SkillManifest.from_json(stored) == manifest
    # no staging left behind; the store itself is host only
    assert [n for n in os.listdir(world.layout.content_fp_dir(manifest.fingerprint)) if n.startswith(".staging")] == []
    assert stat.S_IMODE(os.stat(world.layout.content_store).st_mode) == 0o700


def test_a_fresh_store_reads_the_manifest_back_from_disk(world: SkillWorld) -> None:
    src = world.system_skill("pdf", {"a": "a"})
    fp = scan_skill(src).fingerprint
    world.store.ensure_entry(fp, "pdf", src)
    from mounts.skillstore.content_store import ContentStore

    assert ContentStore(world.layout).manifest(fp).fingerprint == fp


def test_the_same_content_under_two_names_shares_one_manifest(world: SkillWorld) -> None:
    a = world.system_skill("one", {"SKILL.md": "same\n"})
    b = world.system_skill("two", {"SKILL.md": "same\n"})
    fp = scan_skill(a).fingerprint
    assert scan_skill(b).fingerprint == fp
    world.store.ensure_entry(fp, "one", a)
    world.store.ensure_entry(fp, "two", b)
    assert sorted(os.listdir(world.layout.content_fp_dir(fp))) == [".manifest.json", "one", "two"]


def test_content_that_does_not_match_the_fingerprint_is_never_filed(world: SkillWorld) -> None:
    src = world.system_skill("pdf", {"a": "before"})
    fp = scan_skill(src).fingerprint
    (src / "a").write_text("after")
    with pytest.raises(SourceChanged):
        world.store.ensure_entry(fp, "pdf", src)
    assert not world.store.has_entry(fp, "pdf")
    assert [n for n in os.listdir(world.layout.content_fp_dir(fp)) if n.startswith(".")] == []


def test_concurrent_writers_of_one_entry_leave_exactly_one_intact_entry(world: SkillWorld) -> None:
    src = world.system_skill("big", {f"f{i:03}.txt": f"{i}" * 2000 for i in range(150)})
    fp = scan_skill(src).fingerprint
    barrier = threading.Barrier(4)
    errors = []

    def write() -> None:
        barrier.wait()
        try:
            world.store.ensure_entry(fp, "big", src)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(os.listdir(world.layout.content_fp_dir(fp))) == [".manifest.json", "big"]
    assert world.store.verify_entry(fp, "big") is None
