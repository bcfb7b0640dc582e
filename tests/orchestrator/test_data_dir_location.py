"""The service refuses a data dir inside a directory a sandbox (or anyone but root and the
orchestrator) can write: from there a sandbox uid could rename the data dir's path and plant
its own tree where the host resolves paths as root."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.service import OrchestratorService
from orchestrator.startup_checks import PathOwner, StartupRefused, unsafe_ancestor_problem
from orchestrator.settings import Settings
from tests.conftest import make_settings

AS_ROOT = os.geteuid() == 0
SANDBOX_IDS = Settings().sandbox_id_ranges


@pytest.fixture
def in_tmp() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="orch-unsafe-"))
    try:
        yield base / "data"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_data_dir_under_tmp_is_refused(in_tmp: Path) -> None:
    with pytest.raises(StartupRefused, match="/tmp is writable by every user"):
        OrchestratorService(make_settings(in_tmp))
    assert not in_tmp.exists()  # refused before anything was created


@pytest.mark.skipif(not AS_ROOT, reason="needs root to hand a directory to a sandbox uid")
def test_a_data_dir_below_a_sandbox_owned_dir_is_refused(tmp_path: Path) -> None:
    # E.g. an operator's ORCH_DATA_DIR inside some user's home: that sandbox uid could swap it.
    home = tmp_path / "users" / "17"
    home.mkdir(parents=True)
    settings = make_settings(home / "data")
    uid = settings.sandbox_uid_base + 17  # the block in force: a test run may give its own
    os.chown(home, uid, uid)
    with pytest.raises(StartupRefused, match=f"owned by sandbox uid {uid}"):
        OrchestratorService(settings)


def test_the_decider_names_the_first_unsafe_directory() -> None:
    def chain(*entries: tuple[str, int, int, int]) -> list[PathOwner]:
        return [PathOwner(path, uid, gid, mode, False) for path, uid, gid, mode in entries]

    safe = chain(("/", 0, 0, 0o755), ("/srv", 0, 0, 0o755), ("/srv/orch", 0, 0, 0o711))
    assert unsafe_ancestor_problem(safe, own_gid=0, as_root=True, sandbox_ids=SANDBOX_IDS) is None
    sticky_tmp = chain(("/", 0, 0, 0o755), ("/tmp", 0, 0, 0o1777))
    assert "/tmp is writable by every user" in str(unsafe_ancestor_problem(sticky_tmp, own_gid=0, as_root=True, sandbox_ids=SANDBOX_IDS))
    shared_gid = SANDBOX_IDS[0].first  # every sandbox's shared group: the uid base in force
    shared_group = chain(("/", 0, 0, 0o755), ("/srv", 0, shared_gid, 0o2770))
    assert f"writable by group {shared_gid}" in str(unsafe_ancestor_problem(shared_group, own_gid=0, as_root=True, sandbox_ids=SANDBOX_IDS))
    other_user = chain(("/", 0, 0, 0o755), ("/home/alice", 1000, 1000, 0o755))
    assert "not root" in str(unsafe_ancestor_problem(other_user, own_gid=0, as_root=True, sandbox_ids=SANDBOX_IDS))
    # Not root: the orchestrator's own home is fine.
    assert unsafe_ancestor_problem(other_user, own_gid=1000, as_root=False, sandbox_ids=SANDBOX_IDS) is None
