"""The scheduling part of the sandbox pod (kubernetes_spec.pod_manifest), pure: pods of one
orchestrator spread softly over nodes, and carry the tolerations ORCH_K8S_TOLERATIONS names."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from mounts.layout import DataLayout
from mounts.plan import plan_mounts
from orchestrator.sandboxes.docker_spec import Limits
from orchestrator.sandboxes.kubernetes_spec import DataVolume, Requests, pod_manifest
from orchestrator.settings import K8sToleration, Settings

ROOT = Path("/srv/orch/data")


def manifest(**overrides: object) -> dict:
    layout = DataLayout(ROOT)
    values: dict[str, object] = dict(
        instance="abc123", plan=plan_mounts(layout, 7), image="img:1", pull_policy="Never", agent_build="b1",
        data=DataVolume(ROOT, None), sandbox_uid=1007, sandbox_gid=1007, extra_gids=(), limits=Limits(0.1, 256, 64),
        requests=Requests(0.1, 256), agent_dir=layout.agent_current, home_dir=layout.home_dir(7),
        config_path=layout.agent_config_path(7),
    )  # fmt: skip
    values.update(overrides)
    return pod_manifest(**values)  # type: ignore[arg-type]


def test_pods_of_one_instance_spread_softly_over_nodes() -> None:
    pod = manifest()
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["maxSkew"] == 1
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"  # one node, or a full one, still schedules
    # It selects exactly this instance's sandbox pods, whose labels the pod itself carries.
    assert spread["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert "abc123" in spread["labelSelector"]["matchLabels"].values()
    assert "tolerations" not in pod["spec"]


def test_tolerations_from_the_settings_reach_the_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    value = '[{"key": "sandboxes", "value": "true", "effect": "NoSchedule"}, {"key": "x/y", "operator": "Exists"}]'
    monkeypatch.setenv("ORCH_K8S_TOLERATIONS", value)  # JSON, as an operator sets it
    settings = Settings()
    tolerations = [t.manifest() for t in settings.k8s_tolerations]
    assert manifest(tolerations=tolerations)["spec"]["tolerations"] == [
        {"key": "sandboxes", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
        {"key": "x/y", "operator": "Exists"},
    ]


@pytest.mark.parametrize(
    "bad", [{"key": "a b"}, {"key": "k", "effect": "Sometimes"}, {"key": "k", "operator": "In"}, {"key": "k", "other": 1}]
)
def test_a_bad_toleration_is_refused(bad: dict) -> None:
    with pytest.raises(ValidationError):
        K8sToleration.model_validate(bad)


def test_the_runtime_class_from_the_settings_reaches_the_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "runtimeClassName" not in manifest()["spec"]  # unset: the cluster's default runtime
    monkeypatch.setenv("ORCH_K8S_RUNTIME_CLASS", "gvisor")
    settings = Settings()
    assert manifest(runtime_class=settings.k8s_runtime_class)["spec"]["runtimeClassName"] == "gvisor"


@pytest.mark.parametrize("bad", ["gVisor", "run sc", "-gvisor", ""])
def test_a_bad_runtime_class_is_refused(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv("ORCH_K8S_RUNTIME_CLASS", bad)
    with pytest.raises(ValidationError):
        Settings()
