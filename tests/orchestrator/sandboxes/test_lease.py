"""The orchestrator's side of the docker sandboxes' lease: written where the sandbox can read
but not write, renewed while the renewer runs, and no more once it is closed."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from mounts.layout import DataLayout
from orchestrator.sandboxes.lease import LeaseRenewer, renew_every_s, write_lease
from orchestrator.users.dirs import UserDirectories
from sandbox_agent.supervisor import read_lease

USER = 17


@pytest.fixture
def directories(traversable_tmp: Path) -> UserDirectories:
    return UserDirectories(DataLayout(traversable_tmp / "data"), 100000)


def test_renewal_is_a_quarter_of_the_limit_within_bounds() -> None:
    assert renew_every_s(2.0) == 0.5 and renew_every_s(960.0) == 30.0 and renew_every_s(0.1) == 0.1


def test_the_lease_is_the_hosts_file_and_says_when_it_expires(directories: UserDirectories) -> None:
    write_lease(directories, USER, limit_s=60.0, now=1000.0)
    path = directories.layout.lease_path(USER)
    lease = read_lease(str(path))
    assert lease is not None and lease.expires_at == 1060.0 and lease.check_s == 6.0
    st = path.stat()
    assert st.st_uid == os.geteuid() and not st.st_mode & 0o022  # nothing of the sandbox's may write it
    if directories.chown:  # root: the sandbox's group reads it
        assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o640, directories.sandbox_uid(USER))


def test_the_renewer_renews_until_closed(directories: UserDirectories) -> None:
    renewer = LeaseRenewer(directories, 0.4, lambda: [USER])
    renewer.start()
    try:
        time.sleep(0.05)
        first = read_lease(str(directories.layout.lease_path(USER)))
        time.sleep(0.35)
        later = read_lease(str(directories.layout.lease_path(USER)))
        assert first is not None and later is not None and later.expires_at > first.expires_at
    finally:
        renewer.close()
    last = read_lease(str(directories.layout.lease_path(USER)))
    time.sleep(0.3)
    assert read_lease(str(directories.layout.lease_path(USER))) == last  # the lease now runs out
