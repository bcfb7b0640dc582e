"""Which kernel each backend's sandboxes run on, as /healthz reports it (pure)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.sandboxes.kernel_boundary import kernel_boundaries
from orchestrator.settings import SandboxSettings
from tests.conftest import make_settings

DATA = Path("/srv/orch/data")


def test_runc_and_the_process_backend_share_the_hosts_kernel() -> None:
    assert kernel_boundaries(SandboxSettings.of(make_settings(DATA)), ["process", "docker"]) == {
        "docker": {"kernel": "host", "runtime": "runc"},
        "process": {"kernel": "host", "sandbox": "none"},
    }


def test_runsc_puts_gvisor_between_docker_sandboxes_and_the_host() -> None:
    settings = SandboxSettings.of(make_settings(DATA, sandbox_runtime="runsc", k8s_runtime_class="gvisor", process_sandbox="bwrap"))
    assert kernel_boundaries(settings, ["docker", "kubernetes", "process"]) == {
        "docker": {"kernel": "gvisor", "runtime": "runsc"},
        "kubernetes": {"kernel": "runtime_class", "runtime_class": "gvisor"},
        "process": {"kernel": "host", "sandbox": "bwrap"},
    }
    assert kernel_boundaries(SandboxSettings.of(make_settings(DATA)), ["kubernetes"]) == {
        "kubernetes": {"kernel": "node", "runtime_class": None}
    }
