"""Which kernel stands between each backend's sandboxes and the host (for /healthz and the
operator): the host's own kernel, shared by every tenant (one kernel bug reaches every user's
data), or gVisor's user-space kernel (runsc), which serves the sandbox's system calls itself
and asks the host's for a much narrower set. Pure."""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.settings import SandboxSettings


def kernel_boundaries(settings: SandboxSettings, backends: Iterable[str]) -> dict[str, dict[str, object]]:
    """Per registered backend: `kernel` is `host` (the machine's kernel, namespaces around it),
    `gvisor` (runsc's user-space kernel) or `runtime_class` (a kubernetes RuntimeClass decides:
    the node's kernel unless that class names a sandboxing runtime)."""
    out: dict[str, dict[str, object]] = {}
    for name in sorted(backends):
        if name == "docker":
            runtime = settings.runtime
            out[name] = {"kernel": "gvisor" if runtime == "runsc" else "host", "runtime": runtime}
        elif name == "kubernetes":
            runtime_class = settings.kubernetes.runtime_class
            out[name] = {"kernel": "runtime_class" if runtime_class else "node", "runtime_class": runtime_class}
        elif name == "process":
            out[name] = {"kernel": "host", "sandbox": settings.process_sandbox}
    return out
