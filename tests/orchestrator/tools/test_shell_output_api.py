"""Huge shell output through the API with both backends (issue 14 item 5): 3 MB of random
bytes come back as "binary, 3000000 bytes" with a spool path, 2 MB of text keep the error at
the end; the model reads the spool with read_file / grep_search through its own sandbox."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_env import Served, serving
from tests.api_calls import MEMBER, group_session, start_run, tool
from tests.conftest import make_settings
from tests.orchestrator.sandboxes.docker.conftest import docker_data_dir, docker_settings, sandbox_image  # noqa: F401
from tests.orchestrator.sandboxes.test_concurrent_output import UID_BLOCK

ERROR_LINE = "error: test_payment failed"


@pytest.fixture(params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def served(request: pytest.FixtureRequest, traversable_tmp: Path) -> Iterator[Served]:
    if request.param == "docker":
        data = request.getfixturevalue("docker_data_dir")
        settings = docker_settings(data, request.getfixturevalue("sandbox_image"), **UID_BLOCK)
    else:
        data = traversable_tmp / "data"
        data.mkdir()
        settings = make_settings(data, **UID_BLOCK)
    with serving(settings) as pair:
        yield pair


def test_item5_huge_output_through_the_api(served: Served) -> None:
    client, service = served
    run = start_run(client, group_session(client), trigger="group_message", speaker_user_id=MEMBER)
    spool_dir = service.layout.shell_output_dir(MEMBER, run["session_id"])

    random = tool(client, run["run_id"], "shell", command="head -c 3000000 /dev/urandom")
    assert random["ok"], random
    result = random["result"]
    assert result["stdout_binary"] is True and result["stdout_bytes"] == 3_000_000
    assert "\ufffd" not in result["stdout"] and len(result["stdout"]) < 300
    assert Path(result["stdout_file"]).parent == spool_dir
    assert (spool_dir / Path(result["stdout_file"]).name).stat().st_size == 3_000_000
    if os.geteuid() == 0:  # written by the agent, as the sandbox uid
        assert (spool_dir / Path(result["stdout_file"]).name).stat().st_uid == service.directories.sandbox_uid(MEMBER)

    text = tool(client, run["run_id"], "shell", command=f"seq 1 300000; echo '{ERROR_LINE}'; exit 1")
    result = text["result"]
    assert result["exit_code"] == 1 and result["stdout"].endswith(f"300000\n{ERROR_LINE}\n")
    assert result["stdout"].startswith("1\n2\n3\n") and "bytes omitted; the full output is in" in result["stdout"]
    assert len(result["stdout"].encode()) <= service.settings.shell_output_cap_bytes + 200
    found = tool(client, run["run_id"], "grep_search", pattern="test_payment", path=result["stdout_file"])
    assert found["ok"] and [m["line"] for m in found["result"]["matches"]] == [300001], found
    read = tool(client, run["run_id"], "read_file", path=result["stdout_file"], offset=299999, limit=3)
    assert read["ok"] and "300000" in read["result"]["content"] and ERROR_LINE in read["result"]["content"], read


@pytest.mark.skipif(os.geteuid() != 0, reason="the host removes the spool as root only when it runs as root")
def test_deleting_the_session_removes_a_planted_spool_without_following_anything(traversable_tmp: Path) -> None:
    """The host never reads the spool; it removes it with the session's runtime dir, as root.
    The sandbox's shell plants links to a root-owned directory outside, a FIFO (an open would
    block) and a 0000 subdirectory in shell-output/, and replaces incoming/ by a link: the
    deletion removes the links, never what they point at."""
    import time

    outside = traversable_tmp / "outside"
    outside.mkdir()
    (outside / "passwd").write_text("root:x:0:0\n")
    data = traversable_tmp / "data"
    data.mkdir()
    with serving(make_settings(data, **UID_BLOCK)) as (client, service):
        run = start_run(client, group_session(client), trigger="group_message", speaker_user_id=MEMBER)
        spool = service.layout.shell_output_dir(MEMBER, run["session_id"])
        planted = tool(
            client,
            run["run_id"],
            "shell",
            command=(
                f"cd {spool} && ln -s {outside}/passwd link && ln -s {outside} dirlink && mkfifo fifo && "
                f"mkdir -p locked/deep && echo x > locked/deep/f && chmod 000 locked && "
                f"rmdir ../incoming && ln -s {outside} ../incoming"
            ),
        )
        assert planted["ok"] and planted["result"]["exit_code"] == 0, planted
        assert client.post(f"/v1/runs/{run['run_id']}/end", json={"status": "succeeded"}).status_code == 200
        deleted = client.delete(f"/v1/sessions/{run['session_id']}")
        assert deleted.status_code in (200, 202, 204), deleted.text
        runtime = service.layout.runtime_dir(MEMBER, run["session_id"])
        deadline = time.monotonic() + 20
        while os.path.lexists(runtime) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.lexists(runtime)
    assert sorted(p.name for p in outside.iterdir()) == ["passwd"]
    assert (outside / "passwd").read_text() == "root:x:0:0\n"
