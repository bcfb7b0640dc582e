"""The real cluster: from B's pod, A's runtime, uploads and home are not there; skill views
are read-only and the content store cannot be changed by anything B runs; only `lo`; B runs
as its own non-root uid with no capability, no service-account token and a read-only root.
Everything runs through the API, as a model's tool calls would (the docker backend's
counterpart: tests/orchestrator/sandboxes/docker/test_isolation.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from kubernetes import client

from orchestrator.service import OrchestratorService
from tests.agent_env import serving
from tests.api_calls import group_session, start_run, tool
from tests.orchestrator.sandboxes.kubernetes.conftest import k8s_settings
from tests.orchestrator.sandboxes.kubernetes.life_env import data_dir
from tests.orchestrator.sandboxes.skill_attack import attack_skill_views, write_skills

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

A, B = 17, 67


@pytest.fixture(scope="module")
def served(k8s_namespace: str, k8s_image: str, kube: client.CoreV1Api) -> Iterator[tuple[TestClient, OrchestratorService]]:
    with data_dir() as data:
        settings = k8s_settings(data, k8s_namespace, k8s_image)
        write_skills(settings.layout)  # there before the service starts (it scans them then)
        try:
            with serving(settings) as both:
                yield both
        finally:
            kube.delete_collection_namespaced_pod(k8s_namespace, grace_period_seconds=0)


def shell(api: TestClient, run_id: str, command: str) -> dict:
    answer = tool(api, run_id, "shell", command=command)
    assert answer["ok"] is True, answer
    return answer["result"]


def test_b_cannot_see_as_files_and_runs_unprivileged_offline_without_a_token(
    served: tuple[TestClient, OrchestratorService],
) -> None:
    api, service = served
    layout = service.layout
    sid = group_session(api)
    a_run = start_run(api, sid, trigger="web")
    assert tool(api, a_run["run_id"], "write_file", path="secret.txt", content="A's")["ok"]
    assert tool(api, a_run["run_id"], "write_file", path=f"{a_run['upload_dir']}/a.png", content="png")["ok"]
    assert tool(api, a_run["run_id"], "write_file", path=f"{layout.home_dir(A)}/.netrc", content="x")["ok"]

    b_run = start_run(api, sid, trigger="group_message", speaker_user_id=B)
    assert b_run["runtime_user_id"] == B
    a_places = [layout.runtime_user_dir(A), a_run["workdir"], layout.uploads_dir(A), layout.home_dir(A),
                layout.deps_dir(A), layout.tmp_dir(A), layout.socket_dir(A), layout.state_dir,
                layout.sessions_root, layout.content_store]  # fmt: skip
    listing = " ; ".join(f"ls -a {p} >/dev/null; echo ls $?; cat {p}/secret.txt {p}/a.png; echo cat $?" for p in a_places)
    # `shell` goes around the PathSandbox: only the pod's mounts keep A's files away.
    result = shell(api, b_run["run_id"], listing)
    assert result["stdout"].splitlines() == ["ls 2", "cat 1"] * len(a_places), result  # nothing of A's printed
    assert result["stderr"].count("No such file or directory") == 3 * len(a_places), result["stderr"]
    # B's own places are there and B's own; B is not root.
    uid = service.settings.sandbox_uid_base + B
    mine = shell(api, b_run["run_id"], f"id -u; stat -c %u {layout.home_dir(B)} {b_run['upload_dir']} /tmp")
    assert mine["stdout"].split() == [str(uid)] * 4 and uid != 0

    # No capability (effective, permitted, bounding, ambient), no privilege to gain, the
    # runtime's seccomp filter; no service-account token; a read-only root filesystem.
    status = shell(api, b_run["run_id"], "grep -E '^(Cap[A-Za-z]+|NoNewPrivs|Seccomp):' /proc/self/status")["stdout"]
    fields = dict(line.split(":\t") for line in status.splitlines())
    assert {k: v for k, v in fields.items() if k.startswith("Cap")} == {
        "CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
        "CapBnd": "0000000000000000", "CapAmb": "0000000000000000",
    }  # fmt: skip
    assert fields["NoNewPrivs"] == "1" and fields["Seccomp"] == "2"  # 2: a filter
    secrets = shell(api, b_run["run_id"], "ls /var/run/secrets/kubernetes.io /run/secrets 2>&1; env")["stdout"]
    assert secrets.count("No such file or directory") == 2, secrets
    token = layout.token_path(B).read_text().strip()
    assert token not in secrets and "SERVICE_ACCOUNT" not in secrets
    root = shell(api, b_run["run_id"], "touch /x /usr/x /etc/x 2>&1; mount | grep ' / '")["stdout"]
    assert root.count("Read-only file system") == 3, root
    assert " ro," in root or "(ro," in root, root

    # Only the loopback interface, and nothing of the node's loopback answers there.
    probe = (
        "import socket; print([n for _, n in socket.if_nameindex()]);"
        "s = socket.socket(); s.settimeout(2)\n"
        "try:\n s.connect(('127.0.0.1', 8700)); print('connected')\n"
        "except OSError as e: print('refused', e.errno)"
    )
    result = shell(api, b_run["run_id"], f"python3 -c \"{probe}\"")
    assert result["stdout"].splitlines() == ["['lo']", "refused 111"]


def test_skill_views_are_read_only_and_the_store_survives_an_attack_from_inside(
    served: tuple[TestClient, OrchestratorService],
) -> None:
    api, service = served
    attack_skill_views(api, service.layout, B)
