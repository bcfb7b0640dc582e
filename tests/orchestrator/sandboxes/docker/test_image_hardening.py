"""The sandbox image holds no setuid or setgid program: a sandbox that finds a bug in one
(su, passwd, mount, ...) must not gain another uid or group by running it."""

from __future__ import annotations

import docker
import pytest

pytestmark = pytest.mark.docker


def test_item_image_has_no_setuid_or_setgid_files(sandbox_image: str) -> None:
    client = docker.from_env()
    try:
        found = client.containers.run(
            sandbox_image,
            entrypoint=["/usr/bin/find", "/", "-xdev", "-type", "f", "-perm", "/6000"],
            user="0:0",  # root sees every directory; only this check runs as root
            network_mode="none",
            remove=True,
            stderr=True,
        )
    finally:
        client.close()
    assert found.decode().split() == []
