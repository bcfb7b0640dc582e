"""What `/healthz` and the console's overview say about the host: the one narrow view the
routes read instead of reaching through the whole service (built by `service.py`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator import __version__
from orchestrator.descriptors.budget import DescriptorBudget
from orchestrator.descriptors.process_limit import open_descriptors
from orchestrator.egress.service import EgressService
from orchestrator.quotas.service import DiskQuotas, HealthView
from orchestrator.runs.identity_switch import IdentityModeState, RuntimeIdentitySwitch
from orchestrator.sandboxes.base import SandboxBackend
from orchestrator.sandboxes.process import ProcessBackend
from orchestrator.sandboxes.uid_blocks import UidBlock


class SystemStatus:
    def __init__(
        self,
        *,
        sandbox_network: str,
        uid_block: UidBlock,
        kernel_boundary: dict[str, dict[str, object]],
        switch: RuntimeIdentitySwitch,
        backends: Mapping[str, SandboxBackend],
        default_backend: str,
        backend_reason: str,
        disk_quotas: DiskQuotas,
        egress: EgressService | None,
        descriptors: DescriptorBudget,
    ) -> None:
        self._sandbox_network = sandbox_network
        self._uid_block_claimed = uid_block
        self._kernel_boundary = kernel_boundary
        self._switch = switch
        self._backends = backends
        self.default_backend = default_backend
        self.backend_reason = backend_reason
        self._disk_quotas = disk_quotas
        self._egress = egress
        self._descriptors = descriptors

    @property
    def backends(self) -> list[str]:
        return sorted(self._backends)

    def identity(self) -> IdentityModeState:
        return self._switch.state()

    def public(self) -> dict[str, Any]:
        """Up, and the runtime identity mode: what anyone may see."""
        state = self._switch.state()
        return {
            "status": "ok", "version": __version__,
            "runtime_identity": state.mode.value, "runtime_identity_source": state.source,
        }  # fmt: skip

    def host(self) -> dict[str, Any]:
        """Everything the admin sees: isolation, uid block, disk, egress, descriptors."""
        state = self._switch.state()
        return {
            "status": "ok",
            "version": __version__,
            "backend": self.default_backend,
            "backends_available": self.backends,
            "backend_reason": self.backend_reason,
            "runtime_identity": state.mode.value,
            "runtime_identity_source": state.source,
            "runtime_identity_changed_at": state.changed_at,
            "runtime_identity_invalid_value": state.invalid_value,
            # Whether process-backend sandboxes are kept apart (own uids, own network namespace).
            # uid_block: the sandbox uids this instance claims on the host (orchestrator/sandboxes/uid_blocks.py).
            "isolation": {**self.process_isolation(), "uid_block": self._uid_block()},
            # Which disk-quota mechanism is in force (docs/disk-quotas.md) and the host watermark.
            "disk_quota": self.disk().__dict__,
            "egress": self.egress(),
            # Per backend: the host's kernel, or gVisor's between the sandbox and it (docs/security.md).
            "kernel_boundary": self.kernel_boundaries(),
            # The kubernetes backend's API server and namespace; null when it is not registered.
            "kubernetes": self._kubernetes(),
            "descriptors": self._descriptor_status(),
        }

    def disk(self) -> HealthView:
        return self._disk_quotas.health()

    def kernel_boundaries(self) -> dict[str, dict[str, object]]:
        """Per backend: which kernel stands between its sandboxes and the host (fixed at start)."""
        return self._kernel_boundary

    def process_isolation(self) -> dict[str, object]:
        process = self._backends.get("process")
        return process.isolation.as_json() if isinstance(process, ProcessBackend) else {}

    def egress(self) -> dict[str, object]:
        """Whether each backend makes the egress proxy the only way out (docs/egress.md)."""
        if self._egress is None:
            return {"mode": "off"}
        process = self._backends.get("process")
        enforced: dict[str, bool] = {}
        if isinstance(process, ProcessBackend):
            enforced["process"] = process.isolation.process_network == "namespace"
        if "docker" in self._backends:
            enforced["docker"] = self._sandbox_network == "none"
        status: dict[str, object] = {**self._egress.status(), "enforced": enforced}
        if not all(enforced.values()):
            status["warning"] = (
                "egress is not enforced for " + ", ".join(sorted(k for k, v in enforced.items() if not v))
                + ": those sandboxes get the proxy settings but share a network with a way around it"
            )
        return status

    def _uid_block(self) -> list[int]:
        return [self._uid_block_claimed.first, self._uid_block_claimed.last]

    def _descriptor_status(self) -> dict[str, object]:
        """The process's descriptor limit, the reserve, each pool's size, share and use, its
        largest users and refusals (docs/operations.md)."""
        plan = self._descriptors.plan
        usage = self._descriptors.usage()
        pools = {
            feature.value: {"size": size, "user_share": plan.user_shares[feature], **usage[feature.value]}  # type: ignore[dict-item]
            for feature, size in plan.pools.items()
        }
        return {"limit": plan.limit, "reserve": plan.reserve, "open": open_descriptors(), "pools": pools, "refused": usage["refused"]}

    def _kubernetes(self) -> dict | None:
        backend: Any = self._backends.get("kubernetes")
        if backend is None:
            return None
        return {"cluster": backend.cluster, "namespace": backend.namespace, "data_volume": backend.data.describe()}
