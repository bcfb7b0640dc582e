"""The pure deciders of disk quotas: no disk, no mount."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mounts.layout import DataLayout, GroupRef
from orchestrator.quotas.model import (
    DiskUsage,
    OwnerUsage,
    QuotaMechanism,
    anyone_may_be_over,
    choose_mechanism,
    group_volume,
    grow_problem,
    member_share,
    members_of,
    needs_stop,
    no_space_message,
    over_share_message,
    shared_no_space_message,
    user_volume,
    watermark_problem,
)
from orchestrator.quotas.mountinfo import parse_mountinfo, top_mount_at


def test_auto_is_loop_for_root_with_loop_devices_else_the_scan() -> None:
    assert choose_mechanism("auto", is_root=True, loop_problem=None).mechanism is QuotaMechanism.LOOP
    fallback = choose_mechanism("auto", is_root=False, loop_problem=None)
    assert fallback.mechanism is QuotaMechanism.SCAN and "not root" in fallback.reason
    no_loop = choose_mechanism("auto", is_root=True, loop_problem="/dev/loop-control is missing")
    assert no_loop.mechanism is QuotaMechanism.SCAN and "loop-control" in no_loop.reason
    assert choose_mechanism("off", is_root=True, loop_problem=None).mechanism is QuotaMechanism.OFF


def test_loop_asked_for_where_it_cannot_work_is_an_error_not_a_downgrade() -> None:
    with pytest.raises(ValueError, match="not root"):
        choose_mechanism("loop", is_root=False, loop_problem=None)


def test_a_user_volume_holds_exactly_the_users_read_write_places() -> None:
    layout = DataLayout(Path("/srv/data"))
    volume = user_volume(layout, 7)
    assert volume.key == "user-7"
    assert [p.layout_path for p in volume.places] == [
        layout.runtime_user_dir(7), layout.uploads_dir(7), layout.home_dir(7), layout.deps_dir(7), layout.tmp_dir(7)
    ]
    group = group_volume(layout, GroupRef("feishu", "oc_team"))
    assert group.key.startswith("group-") and group.places[0].layout_path == layout.group_dir(GroupRef("feishu", "oc_team"))


def test_shrinking_is_refused_with_the_reason_and_growing_is_allowed() -> None:
    assert grow_problem(16, 32) is None
    assert "can only grow online" in (grow_problem(32, 16) or "")
    assert "at least" in (grow_problem(16, 4) or "")


def test_the_watermark_refuses_below_its_threshold_only() -> None:
    assert watermark_problem(4.9, 5) is not None and "ORCH_MIN_FREE_DISK_PCT=5%" in watermark_problem(4.9, 5)  # type: ignore[operator]
    assert watermark_problem(5.0, 5) is None
    assert watermark_problem(0.0, 0) is None  # 0 turns it off


def test_a_no_space_message_names_the_quota_and_how_full_it_is() -> None:
    usage = DiskUsage("user-7", QuotaMechanism.LOOP, 15 * 2**20, 16 * 2**20, 40, 256)
    text = no_space_message("No space left on the device while writing: a.txt", usage)
    assert "disk quota" in text and "15.0 of 16.0 MiB" in text and "40 of 256 files" in text


def test_a_full_shared_place_names_its_holders_and_who_can_free_them_never_the_caller_deleting() -> None:
    usage = DiskUsage("share", QuotaMechanism.LOOP, 16 * 2**20, 16 * 2**20, 30, 256)
    share = member_share(usage, 25)
    assert (share.bytes_limit, share.inodes_limit) == (4 * 2**20, 64)
    owners = {1061: OwnerUsage(15 * 2**20, 3), 1062: OwnerUsage(2**20, 20), 0: OwnerUsage(4096, 1)}
    members = members_of(owners, share, lambda uid: uid - 1000 if uid > 1000 else None)
    assert [m.user_id for m in members] == [61, 62, None]  # the largest holder first
    assert members[0].over_share and not members[1].over_share
    text = shared_no_space_message("No space left", usage, members, caller=62)
    assert "user 61 holds 15.0 MiB in 3 files (over its share)" in text
    assert "Your own files there take 1.0 MiB in 20 files" in text and "user 62 holds" not in text
    assert "uid 0 (not a user's sandbox)" in text
    assert "cannot delete other members' files" in text and "delete files to free space" not in text
    assert "DELETE /v1/admin/disk/volumes/share/members/{user_id}" in text
    refusal = over_share_message("share", members[0])
    assert "your files there hold 15.0 MiB" in refusal and "4.0 MiB / 64 files" in refusal


def test_a_member_over_its_share_is_stopped_again_only_when_it_wrote_more() -> None:
    usage = DiskUsage("share", QuotaMechanism.LOOP, 16 * 2**20, 16 * 2**20, 30, 256)
    share = member_share(usage, 25)
    at = {n: members_of({1061: OwnerUsage(n * 2**20, 3)}, share, lambda uid: uid - 1000)[0] for n in (2, 9, 12)}
    assert not needs_stop(at[2], None)  # under its share
    assert needs_stop(at[9], None)  # over, never stopped
    assert not needs_stop(at[9], at[9]) and not needs_stop(at[9], at[12])  # stayed put, or deleted some
    assert needs_stop(at[12], at[9])  # wrote more since (a shell)
    stranger = members_of({0: OwnerUsage(12 * 2**20, 3)}, share, lambda uid: None)[0]
    assert not needs_stop(stranger, None)  # root's files: no sandbox to stop


def test_a_place_holding_less_than_one_share_needs_no_walk() -> None:
    usage = DiskUsage("share", QuotaMechanism.LOOP, 3 * 2**20, 16 * 2**20, 10, 256)
    assert not anyone_may_be_over(usage, member_share(usage, 25))
    assert anyone_may_be_over(usage, member_share(usage, 10))  # 1.6 MiB share: one may hold 3
    many_files = DiskUsage("share", QuotaMechanism.LOOP, 2**20, 16 * 2**20, 100, 256)
    assert anyone_may_be_over(many_files, member_share(many_files, 25))


def test_mountinfo_parsing_unescapes_and_the_top_mount_wins() -> None:
    text = (
        "40 27 7:0 / /srv/data/state/disks/mnt/user-7 rw,nosuid - ext4 /dev/loop0 rw\n"
        "41 27 7:0 /home /srv/my\\040data/users/7 rw - ext4 /dev/loop0 rw\n"
        "42 41 7:1 / /srv/my\\040data/users/7 rw - ext4 /dev/loop1 rw\n"
        "garbage line\n"
    )
    entries = parse_mountinfo(text)
    assert len(entries) == 3 and entries[1].root == "/home"
    top = top_mount_at(entries, Path("/srv/my data/users/7"))
    assert top is not None and top.source == "/dev/loop1"
    assert os.path.basename(entries[0].source) == "loop0"


def test_an_inode_quota_the_image_cannot_hold_is_a_settings_error_naming_both() -> None:
    from pydantic import ValidationError

    from orchestrator.settings import Settings

    with pytest.raises(ValidationError, match="ORCH_SHARED_DISK_QUOTA_MB / ORCH_SHARED_INODE_QUOTA"):
        Settings(shared_disk_quota_mb=16, shared_inode_quota=200_000)
    Settings(user_disk_quota_mb=16, user_inode_quota=256)


def test_loop_asked_for_without_loop_devices_refuses_the_start_in_one_line(tmp_path: Path) -> None:
    from orchestrator.quotas.service import DiskQuotas
    from orchestrator.settings import DiskQuotaSettings, Settings
    from orchestrator.startup_checks import StartupRefused

    settings = Settings(data_dir=tmp_path, disk_quota="loop")
    with pytest.raises(StartupRefused, match="ORCH_DISK_QUOTA=loop, but"):
        DiskQuotas(DiskQuotaSettings.of(settings), sandbox_uid=lambda uid: uid, loop_problem=lambda: "/dev/loop-control is missing")


def test_the_start_up_log_says_which_mechanism_is_in_force(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from orchestrator.quotas.service import DiskQuotas
    from orchestrator.settings import DiskQuotaSettings, Settings

    quotas = DiskQuotas(DiskQuotaSettings.of(Settings(data_dir=tmp_path, disk_quota="scan")), sandbox_uid=lambda uid: uid)
    with caplog.at_level(logging.INFO, logger="orchestrator.quotas.service"):
        quotas.start()
    assert any("disk quotas" in r.getMessage() and "mechanism=scan" in r.getMessage() for r in caplog.records)
    assert quotas.health().mechanism == "scan"
