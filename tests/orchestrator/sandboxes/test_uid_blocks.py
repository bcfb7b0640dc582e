"""Issue 12, defence in depth: each orchestrator on a host claims its own block of sandbox uids
(ORCH_SANDBOX_UID_BASE..+ORCH_MAX_USER_ID); a second one whose block overlaps refuses to start.
Real files, real flock, real subprocesses; the registry sits in a temp dir except for the
end-to-end `orchestrator serve` case, which uses the default /run path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from orchestrator.startup_checks import StartupRefused
from orchestrator.sandboxes.uid_blocks import Claim, UidBlock, conflict_message, overlapping_claim
from tests.conftest import API_TOKEN, admin_headers, make_settings
from tests.live_server import free_port, serve_process

AS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="the registry is kept by root orchestrators only")


def claim(instance: str, base: int, max_user_id: int, data_dir: str = "/srv/other") -> Claim:
    return Claim(instance, data_dir, UidBlock.of(base, max_user_id), pid=4242)


# --- the pure decider -------------------------------------------------------------------------


def test_the_decider_finds_an_overlapping_block_of_another_instance() -> None:
    ours = claim("aaaaaaaaaaaa", 100000, 1000, "/srv/ours")
    apart = claim("bbbbbbbbbbbb", 200000, 1000)
    touching = claim("cccccccccccc", 101000, 5)  # its first uid is our last
    assert overlapping_claim(ours, [apart]) is None
    assert overlapping_claim(ours, [apart, touching]) == touching
    assert overlapping_claim(ours, [claim("dddddddddddd", 101001, 5)]) is None  # just past ours
    assert overlapping_claim(ours, [claim("aaaaaaaaaaaa", 100000, 1000)]) is None  # our own data dir
    message = conflict_message(ours.block, touching)
    assert message == (
        "sandbox uids 100000..101000 of this instance overlap those of the orchestrator on /srv/other "
        "(uids 101000..101005); give one of them another ORCH_SANDBOX_UID_BASE / a smaller ORCH_MAX_USER_ID"
    )


# --- services and the registry on disk ----------------------------------------------------------


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    return tmp_path / "run" / "uid-blocks"


def _service(root: Path, registry: Path, **overrides: object) -> OrchestratorService:
    data = root / "data"
    data.mkdir(parents=True)
    return OrchestratorService(make_settings(data, uid_registry_dir=registry, **overrides))


@needs_root
def test_two_instances_with_the_same_uid_base_the_second_refuses(tmp_path: Path, registry: Path) -> None:
    first = _service(tmp_path / "a", registry)
    # The block in force (the defaults, or the one a test run is given) is the same for both.
    block = f"{first.settings.sandbox_uid_base}..{first.settings.sandbox_uid_base + first.settings.max_user_id}"
    try:
        with pytest.raises(StartupRefused) as refused:
            _service(tmp_path / "b", registry)
        assert str(refused.value) == (
            f"sandbox uids {block} of this instance overlap those of the orchestrator on "
            f"{first.layout.root} (uids {block}); give one of them another ORCH_SANDBOX_UID_BASE / "
            "a smaller ORCH_MAX_USER_ID"
        )
        assert sorted(p.name for p in registry.glob("*.json")) == [f"{first.uid_block._name}"]  # type: ignore[union-attr]
        assert registry.stat().st_mode & 0o777 == 0o755 and registry.parent.stat().st_mode & 0o777 == 0o755
    finally:
        first.close()
    # Closed: the block is free again, and the file is gone.
    assert list(registry.glob("*.json")) == []
    second = OrchestratorService(make_settings(tmp_path / "b" / "data", uid_registry_dir=registry))
    second.close()


@needs_root
def test_disjoint_blocks_both_start_and_healthz_reports_the_block(tmp_path: Path, registry: Path) -> None:
    first = _service(tmp_path / "a", registry, sandbox_uid_base=100000, max_user_id=1000)
    try:
        second = _service(tmp_path / "b", registry, sandbox_uid_base=200000, max_user_id=1000)
        try:
            claims = [json.loads(p.read_text()) for p in sorted(registry.glob("*.json"))]
            assert sorted((c["base"], c["max_user_id"], c["pid"]) for c in claims) == [
                (100000, 1000, os.getpid()), (200000, 1000, os.getpid())
            ]  # fmt: skip
            with TestClient(create_app(second)) as client:
                assert client.get("/healthz", headers=admin_headers()).json()["isolation"]["uid_block"] == [200000, 201000]
        finally:
            second.close()
    finally:
        first.close()


@needs_root
def test_a_second_service_on_the_same_data_dir_is_not_this_checks_business(tmp_path: Path, registry: Path) -> None:
    first = _service(tmp_path / "a", registry)
    try:
        again = OrchestratorService(make_settings(tmp_path / "a" / "data", uid_registry_dir=registry))
        again.close()
        assert len(list(registry.glob("*.json"))) == 1  # the first one's claim stays
    finally:
        first.close()


@needs_root
def test_a_stale_claim_of_a_process_that_is_gone_does_not_block(tmp_path: Path, registry: Path) -> None:
    gone = tmp_path / "gone" / "data"
    code = (
        "import sys; from pathlib import Path; from orchestrator.sandboxes import uid_registry\n"
        "r = uid_registry.register(Path(sys.argv[1]), instance_id='0123456789ab', data_dir=Path(sys.argv[2]),"
        " base=100000, max_user_id=1000)\n"
        "assert r is not None\n"  # exits holding it: the kernel drops the flock, the file stays
    )
    subprocess.run([sys.executable, "-c", code, str(registry), str(gone)], check=True, timeout=60)
    stale = registry / "0123456789ab.json"
    assert json.loads(stale.read_text())["data_dir"] == str(gone)
    service = _service(tmp_path / "a", registry)
    try:
        assert not stale.exists()
    finally:
        service.close()


@needs_root
def test_a_live_claim_of_another_process_blocks(tmp_path: Path, registry: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from orchestrator.sandboxes import uid_registry\n"
        "r = uid_registry.register(Path(sys.argv[1]), instance_id='0123456789ab', data_dir=Path('/srv/live'),"
        " base=100500, max_user_id=10)\n"
        "print('ready', flush=True); sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(registry)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        with pytest.raises(StartupRefused, match=r"orchestrator on /srv/live \(uids 100500..100510\)"):
            _service(tmp_path / "a", registry, sandbox_uid_base=100000, max_user_id=1000)
        # Nothing of the refused instance is left behind in the registry.
        assert [p.name for p in registry.glob("*.json")] == ["0123456789ab.json"]
    finally:
        holder.communicate("", timeout=30)


def test_a_user_id_beyond_max_user_id_is_a_422_that_changes_nothing(tmp_path: Path, registry: Path) -> None:
    service = _service(tmp_path / "a", registry, sandbox_uid_base=100000, max_user_id=1000)
    try:
        with TestClient(create_app(service), headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
            put = client.put("/v1/users/1001", json={"display_name": "x"})
            assert put.status_code == 422 and "ORCH_MAX_USER_ID" in put.text, put.text
            session = client.post("/v1/sessions", json={"owner_user_id": 1001, "channel": "feishu_private"})
            assert session.status_code == 422 and "ORCH_MAX_USER_ID" in session.text, session.text
            sid = client.post("/v1/sessions", json={"owner_user_id": 1000, "channel": "feishu_group",
                              "group": {"channel": "feishu", "chat_id": "oc_t"}}).json()["session_id"]  # fmt: skip
            run = client.post(f"/v1/sessions/{sid}/runs", json={"trigger": "group_message", "speaker_user_id": 1001})
            assert run.status_code == 422 and "ORCH_MAX_USER_ID" in run.text, run.text
            assert client.put("/v1/users/1000", json={"display_name": "ok"}).status_code == 200
        assert service.users.known_user_ids() == {1000}
        with service.store.read() as tx:
            assert tx.all("SELECT run_id FROM runs") == []
    finally:
        service.close()


# --- end to end: two `orchestrator serve` processes, the default registry ------------------------


@needs_root
def test_a_second_serve_with_an_overlapping_uid_block_exits_2_with_one_line(tmp_path: Path) -> None:
    # An unusual base, so that no other orchestrator of this host is in the way.
    env = {"ORCH_SANDBOX_UID_BASE": "700000000", "ORCH_MAX_USER_ID": "1000", "ORCH_BACKEND": "process"}
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    with serve_process(str(first), free_port(), env):
        other = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator", "serve", "--port", str(free_port())],
            env={**other, **env, "ORCH_DATA_DIR": str(second), "ORCH_SANDBOX_UID_BASE": "700000500"},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 2, result
        lines = [line for line in result.stderr.splitlines() if line.startswith("orchestrator serve:")]
        assert lines == [
            f"orchestrator serve: sandbox uids 700000500..700001500 of this instance overlap those of the orchestrator "
            f"on {first} (uids 700000000..700001000); give one of them another ORCH_SANDBOX_UID_BASE / "
            "a smaller ORCH_MAX_USER_ID"
        ], result.stderr


@needs_root
def test_a_live_claim_on_the_same_data_dir_from_another_process_does_not_refuse(tmp_path: Path, registry: Path) -> None:
    from orchestrator.sandboxes.docker_spec import instance_id

    data = tmp_path / "a" / "data"
    code = (
        "import sys; from pathlib import Path; from orchestrator.sandboxes import uid_registry\n"
        "r = uid_registry.register(Path(sys.argv[1]), instance_id=sys.argv[2], data_dir=Path(sys.argv[3]),"
        " base=100000, max_user_id=10**9)\n"
        "print('ready', flush=True); sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(registry), instance_id(data), str(data)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        service = _service(tmp_path / "a", registry)
        try:
            assert service.uid_block is None  # the claim stays its holder's
            assert json.loads((registry / f"{instance_id(data)}.json").read_text())["pid"] == holder.pid
        finally:
            service.close()
    finally:
        holder.communicate("", timeout=30)
