"""sync_to_session against real directories."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from mounts.skillstore.sources import SkillKind
from tests.mounts.skillstore.conftest import SkillWorld


def read_via_link(world: SkillWorld, uid: int, sid: str, name: str, rel: str = "SKILL.md") -> str:
    return (world.layout.session_skill_link(uid, sid, name) / rel).read_text()


def test_links_point_at_the_view_or_the_personal_source(world: SkillWorld) -> None:
    world.system_skill("pdf", {"scripts/fill.py": "print('fill')\n"})
    world.personal_skill(5, "notes", {"SKILL.md": "my notes\n"})
    result = world.sync.sync_to_session("default", 5, "s1")
    assert result.failed == ()
    assert result.available == ("notes", "pdf")
    kinds = {s.name: s.kind for s in result.linked}
    assert kinds == {"notes": SkillKind.PERSONAL, "pdf": SkillKind.SYSTEM}
    for skill in result.linked:
        assert skill.path == str(world.layout.session_skill_link(5, "s1", skill.name))
    assert os.readlink(world.layout.session_skill_link(5, "s1", "pdf")) == str(world.layout.user_view(5, "pdf"))
    assert os.readlink(world.layout.session_skill_link(5, "s1", "notes")) == str(world.layout.userskill_source(5, "notes"))
    assert read_via_link(world, 5, "s1", "pdf", "scripts/fill.py") == "print('fill')\n"
    assert read_via_link(world, 5, "s1", "notes") == "my notes\n"


def test_view_files_are_hard_links_into_the_store(world: SkillWorld) -> None:
    world.system_skill("pdf", {"a.txt": "a"})
    world.sync.sync_to_session("default", 5, "s1")
    world.sync.sync_to_session("default", 6, "s1")
    fp = world.views.current(5, "pdf")
    assert fp is not None and world.views.current(6, "pdf") == fp
    store_file = world.layout.content_entry(fp, "pdf") / "a.txt"
    for uid in (5, 6):
        assert os.path.samestat(os.stat(world.layout.user_view(uid, "pdf") / "a.txt"), os.stat(store_file))
    assert os.stat(store_file).st_nlink == 3


def test_switching_speakers_in_one_session_keeps_each_ones_links(world: SkillWorld) -> None:
    world.system_skill("shared")
    world.personal_skill(5, "five-only")
    world.personal_skill(6, "six-only")
    a = world.sync.sync_to_session("default", 5, "group-1")
    b = world.sync.sync_to_session("default", 6, "group-1")
    a_again = world.sync.sync_to_session("default", 5, "group-1")
    assert a.available == a_again.available == ("five-only", "shared")
    assert b.available == ("shared", "six-only")
    assert world.link_names(5, "group-1") == ["five-only", "shared"]
    assert world.link_names(6, "group-1") == ["shared", "six-only"]
    assert set(world.sync.state_keys()) == {("default", 5, "group-1"), ("default", 6, "group-1")}
    # one speaker's skill going away never clears the other speaker's links
    (world.layout.userskill_source(6, "six-only") / "SKILL.md").unlink()
    world.changed(world.layout.userskill_source(6, "six-only") / "SKILL.md")
    assert world.sync.sync_to_session("default", 6, "group-1").available == ("shared",)
    assert world.link_names(5, "group-1") == ["five-only", "shared"]
    assert world.sync.sync_to_session("default", 5, "group-1").available == ("five-only", "shared")


def test_state_is_per_agent_too(world: SkillWorld) -> None:
    world.system_skill("shared")
    world.sync.sync_to_session("alpha", 5, "s")
    world.sync.sync_to_session("beta", 5, "s")
    assert set(world.sync.state_keys()) == {("alpha", 5, "s"), ("beta", 5, "s")}
    assert world.link_names(5, "s") == ["shared"]


def test_a_broken_skill_is_failed_and_unlinked_and_the_others_are_linked(world: SkillWorld) -> None:
    world.system_skill("good-a")
    world.system_skill("good-b")
    broken = world.system_skill("broken")
    assert world.sync.sync_to_session("default", 5, "s").available == ("broken", "good-a", "good-b")
    os.symlink("../../../../../etc/shadow", broken / "escape")
    world.changed(broken / "escape")
    result = world.sync.sync_to_session("default", 5, "s")
    assert result.failed == ("broken",)
    assert result.available == ("good-a", "good-b")
    assert world.link_names(5, "s") == ["good-a", "good-b"]  # no link for a failed skill


def test_a_personal_skill_with_an_escaping_symlink_fails_too(world: SkillWorld) -> None:
    bad = world.personal_skill(5, "mine")
    os.symlink("/etc", bad / "etc")
    result = world.sync.sync_to_session("default", 5, "s")
    assert result.failed == ("mine",) and result.available == ()


def test_a_view_that_cannot_be_materialized_fails_alone(world: SkillWorld) -> None:
    world.system_skill("ok")
    doomed = world.system_skill("doomed", {"x": "unique content"})
    fp = world.sources.system().skills["doomed"].fingerprint
    assert fp is not None
    # The store cannot take this fingerprint (a file where its directory would go).
    world.layout.content_fp_dir(fp).write_text("in the way")
    result = world.sync.sync_to_session("default", 5, "s")
    assert result.failed == ("doomed",)
    assert result.available == ("ok",)
    assert world.link_names(5, "s") == ["ok"]
    assert doomed.exists()
    # such a failure may pass: the next run tries again instead of serving it warm
    world.layout.content_fp_dir(fp).unlink()
    assert world.sync.sync_to_session("default", 5, "s").available == ("doomed", "ok")


def test_skills_removed_from_the_source_are_unlinked(world: SkillWorld) -> None:
    world.system_skill("stays")
    leaving = world.system_skill("leaves")
    world.personal_skill(5, "mine")
    assert world.sync.sync_to_session("default", 5, "s").available == ("leaves", "mine", "stays")
    os.rename(leaving, world.layout.skills_root / ".leaves-disabled")
    world.changed(leaving, world.layout.skills_root / ".leaves-disabled")
    result = world.sync.sync_to_session("default", 5, "s")
    assert result.available == ("mine", "stays") and result.failed == ()
    assert world.link_names(5, "s") == ["mine", "stays"]
    assert world.views.view_names(5) == ["stays"]  # its view went too


def test_editing_a_skill_gives_a_new_fingerprint_and_view(world: SkillWorld) -> None:
    src = world.system_skill("pdf", {"SKILL.md": "v1\n"})
    world.sync.sync_to_session("default", 5, "s")
    fp1 = world.views.current(5, "pdf")
    (src / "SKILL.md").write_text("v2\n")
    world.changed(src / "SKILL.md")
    world.sync.sync_to_session("default", 5, "s")
    fp2 = world.views.current(5, "pdf")
    assert fp1 and fp2 and fp1 != fp2
    assert read_via_link(world, 5, "s", "pdf") == "v2\n"
    assert (world.layout.content_entry(fp1, "pdf") / "SKILL.md").read_text() == "v1\n"  # the store never changes
    assert (world.layout.content_entry(fp2, "pdf") / "SKILL.md").read_text() == "v2\n"
    # another session of the same user sees the new version through the same view path
    world.sync.sync_to_session("default", 5, "other")
    assert read_via_link(world, 5, "other", "pdf") == "v2\n"


def test_a_source_edited_without_notice_is_caught_by_the_copy(world: SkillWorld) -> None:
    # The watcher has not reported the edit yet: the fingerprint is stale. The copy into the
    # store hashes what it writes, sees the difference and re-hashes instead of filing wrong content.
    src = world.system_skill("pdf", {"SKILL.md": "v1\n"})
    world.sources.system()
    (src / "SKILL.md").write_text("v2 changed behind our back\n")
    result = world.sync.sync_to_session("default", 5, "s")
    assert result.available == ("pdf",)
    fp = world.views.current(5, "pdf")
    assert fp is not None
    assert (world.layout.content_entry(fp, "pdf") / "SKILL.md").read_text() == "v2 changed behind our back\n"
    assert world.store.verify_entry(fp, "pdf") is None


def test_personal_skill_shadows_a_system_skill_of_the_same_name(world: SkillWorld) -> None:
    world.system_skill("pdf")
    world.personal_skill(5, "pdf", {"SKILL.md": "my pdf\n"})
    result = world.sync.sync_to_session("default", 5, "s")
    assert [(s.name, s.kind) for s in result.linked] == [("pdf", SkillKind.PERSONAL)]
    assert read_via_link(world, 5, "s", "pdf") == "my pdf\n"
    assert world.sync.sync_to_session("default", 6, "s").linked[0].kind is SkillKind.SYSTEM


def test_warm_sync_hashes_nothing_and_repairs_removed_links(world: SkillWorld) -> None:
    for i in range(5):
        world.system_skill(f"s{i}", {"f.txt": str(i)})
    first = world.sync.sync_to_session("default", 5, "s")
    scans = world.sources.scans
    for _ in range(20):
        assert world.sync.sync_to_session("default", 5, "s") == first
    assert world.sources.scans == scans
    # the sandbox user deleted a link in its own runtime dir: the next sync puts it back
    world.layout.session_skill_link(5, "s", "s3").unlink()
    assert world.sync.sync_to_session("default", 5, "s") == first
    assert world.link_names(5, "s") == [f"s{i}" for i in range(5)]
    assert world.sources.scans == scans


def test_unmanaged_entries_in_the_skills_dir_stay(world: SkillWorld) -> None:
    world.system_skill("pdf")
    world.system_skill("blocked")
    skills_dir = world.layout.session_skills_dir(5, "s")
    skills_dir.mkdir(parents=True)
    os.symlink("/tmp", skills_dir / "my-own-link")
    (skills_dir / "blocked").mkdir()  # the sandbox made a directory where a link goes
    result = world.sync.sync_to_session("default", 5, "s")
    assert result.available == ("pdf",) and result.failed == ("blocked",)
    assert os.readlink(skills_dir / "my-own-link") == "/tmp"
    assert (skills_dir / "blocked").is_dir()


def test_a_planted_symlink_for_the_skills_dir_is_never_followed(world: SkillWorld, tmp_path: Path) -> None:
    world.system_skill("pdf")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    os.symlink(world.layout.user_view(5, "x"), victim / "pdf")  # looks like a managed link
    runtime = world.layout.runtime_dir(5, "s")
    runtime.mkdir(parents=True)
    os.symlink(victim, runtime / "skills")  # the sandbox swapped its skills dir for a symlink
    result = world.sync.sync_to_session("default", 5, "s")
    assert result.available == () and result.failed == ("pdf",)
    assert sorted(os.listdir(victim)) == ["pdf", "precious"]
    assert os.readlink(victim / "pdf") == str(world.layout.user_view(5, "x"))


def test_bad_ids_are_refused_before_any_path_is_built(world: SkillWorld) -> None:
    from mounts.ids import InvalidIdentifier

    for agent, uid, sid in (("../x", 5, "s"), ("default", 0, "s"), ("default", 5, "../../etc"), ("default", True, "s")):
        with pytest.raises(InvalidIdentifier):
            world.sync.sync_to_session(agent, uid, sid)
    assert not world.layout.runtime_root.exists()


def test_concurrent_syncs_of_many_sessions_agree(world: SkillWorld) -> None:
    for i in range(6):
        world.system_skill(f"s{i}", {"data.txt": "x" * 1000 * i})
    errors: list[BaseException] = []
    results = {}

    def worker(uid: int, sid: str) -> None:
        try:
            results[(uid, sid)] = world.sync.sync_to_session("default", uid, sid)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(5 + i % 3, f"s{i}")) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert {r.available for r in results.values()} == {tuple(f"s{i}" for i in range(6))}
    for uid in (5, 6, 7):
        assert world.views.view_names(uid) == [f"s{i}" for i in range(6)]
