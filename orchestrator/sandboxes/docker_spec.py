"""The docker backend's deciders: what a user's container looks like, and what the container
that exists is to the lifecycle decision table (its state, whether it is outdated). Pure: values in, values out; no engine needed to test them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from mounts.plan import Access, MountPlan
from orchestrator.clock import iso
from orchestrator.sandboxes.lifecycle_decision import Observed as SandboxState
from orchestrator.sandboxes.seccomp import seccomp_security_opt
from sandbox_agent.peer import ExpectedPeer

LABEL_PREFIX = "org.sandbox-orchestrator."
LABEL_MANAGED = LABEL_PREFIX + "managed"
LABEL_INSTANCE = LABEL_PREFIX + "instance"
LABEL_USER = LABEL_PREFIX + "user"
LABEL_PLAN = LABEL_PREFIX + "plan-hash"
LABEL_IMAGE = LABEL_PREFIX + "image"
LABEL_BUILD = LABEL_PREFIX + "agent-build"
MANAGED_VALUE = "sandbox"

# Writable scratch on an otherwise read-only root (lock and pid files); /tmp is the user's own
# bind mount (tmp/{uid}), and TMPDIR points there.
TMPFS = {"/run": "rw,nosuid,nodev,noexec,size=16m"}

# What the kernel publishes about the host to every container, masked (an empty read-only
# directory, or /dev/null for a file). A list of ours replaces the engine's, so it starts with
# what the engine masks by default...
ENGINE_MASKED_PATHS = (
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
)  # fmt: skip
# ... and the host's block devices: every loop image of every instance (its backing file names
# a data dir, a user id, a group digest; its size is a quota) and their I/O and ext4/jbd2
# counters, a live side channel on other users' writes.
BLOCK_DEVICE_PATHS = (
    "/sys/block", "/sys/class/block", "/sys/dev/block", "/sys/devices/virtual/block", "/sys/devices/virtual/bdi",
    "/sys/class/bdi", "/sys/fs/ext4", "/sys/fs/xfs", "/sys/fs/btrfs", "/proc/fs", "/proc/diskstats",
    "/proc/partitions", "/proc/swaps",
)  # fmt: skip
MASKED_PATHS = ENGINE_MASKED_PATHS + BLOCK_DEVICE_PATHS


def instance_id(data_root: Path) -> str:
    """Which orchestrator a container belongs to: one per data directory, so two orchestrators
    (or two test runs) on one engine never adopt or remove each other's containers."""
    return hashlib.sha256(str(data_root).encode()).hexdigest()[:12]


def container_name(instance: str, user_id: int) -> str:
    return f"orch-{instance}-user-{user_id}"


@dataclass(frozen=True)
class Limits:
    cpus: float
    memory_mb: int
    pids: int

    def for_user(self, cpus: float | None, memory_mb: int | None) -> Limits:
        """These limits with a user's own CPU and memory (the admin's override) where given."""
        return Limits(cpus or self.cpus, memory_mb or self.memory_mb, self.pids)


@dataclass(frozen=True)
class BindMount:
    source: str
    target: str
    read_only: bool


@dataclass(frozen=True)
class ContainerSpec:
    """Everything `docker create` gets for one user's sandbox. No secret is in here: the
    per-sandbox token is a 0600 file in the socket directory."""

    name: str
    image: str
    command: tuple[str, ...]
    user: str
    environment: Mapping[str, str]
    labels: Mapping[str, str]
    mounts: tuple[BindMount, ...]
    network: str
    limits: Limits
    hostname: str
    runtime: str = "runc"  # the OCI runtime dockerd runs it with (`runsc`: gVisor)
    group_add: tuple[int, ...] = ()
    tmpfs: Mapping[str, str] = field(default_factory=lambda: dict(TMPFS))
    masked_paths: tuple[str, ...] = MASKED_PATHS

    def host_config_kwargs(self) -> dict[str, object]:
        """Keyword arguments for `docker.APIClient.create_host_config`."""
        from docker.types import LogConfig, Mount

        return {
            "group_add": [str(gid) for gid in self.group_add],
            "mounts": [Mount(m.target, m.source, type="bind", read_only=m.read_only) for m in self.mounts],
            "network_mode": self.network,
            "nano_cpus": int(self.limits.cpus * 1e9),
            "mem_limit": f"{self.limits.memory_mb}m",
            "memswap_limit": f"{self.limits.memory_mb}m",  # no swap beyond the memory limit
            "pids_limit": self.limits.pids,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges", seccomp_security_opt()],  # an allow list (seccomp.py)
            "read_only": True,
            "tmpfs": dict(self.tmpfs),
            # No engine init: the image's entrypoint becomes the sandbox supervisor, PID 1, which
            # reaps zombies and ends the container when the orchestrator's lease has expired.
            "init": False,
            "runtime": self.runtime,
            # Only the supervisor writes the container's stdout, within its own budget: a
            # sandbox's output costs the engine no more than that (docs/docker.md).
            "log_config": LogConfig(type="json-file", config={"max-size": "1m", "max-file": "2"}),
        }

    def create_container_kwargs(self) -> dict[str, object]:
        """Keyword arguments for `docker.APIClient.create_container`, but `host_config`."""
        return {
            "image": self.image,
            "command": list(self.command),
            "name": self.name,
            "hostname": self.hostname,
            "user": self.user,
            "environment": dict(self.environment),
            "labels": dict(self.labels),
            "detach": True,
        }

    def host_config(self, api: object) -> dict[str, object]:
        """The HostConfig for `api` (a `docker.APIClient`), with the masked paths, which
        docker-py has no argument for (the engine's API has, since 1.30)."""
        config = api.create_host_config(**self.host_config_kwargs())  # type: ignore[attr-defined]
        config["MaskedPaths"] = list(self.masked_paths)
        return dict(config)


def container_spec(
    *,
    instance: str,
    plan: MountPlan,
    image: str,
    image_id: str,
    agent_build: str,
    sandbox_uid: int,
    sandbox_gid: int,
    extra_gids: tuple[int, ...],
    network: str,
    limits: Limits,
    agent_dir: Path,
    home_dir: Path,
    config_path: Path,
    lease_path: Path,
    ca_bundle: Path | None = None,
    runtime: str = "runc",
) -> ContainerSpec:
    """The container of `plan.user_id`: the plan's mounts at the same paths (tmp at /tmp),
    running as the user's own uid (plus the shared group of `share/` and the gid of each of
    the user's group workspaces),
    the agent started from the read-only agent mount under the sandbox supervisor."""
    mounts = tuple(
        BindMount(str(m.host_path), str(m.sandbox_path), m.access is Access.READ_ONLY) for m in plan.mounts
    )
    if ca_bundle is not None:
        # The host's trust store, read-only at the same path: mounted, not baked in, so the
        # image stays machine-independent and a rotated local CA needs no rebuild.
        mounts += (BindMount(str(ca_bundle), str(ca_bundle), True),)
    labels = {
        LABEL_MANAGED: MANAGED_VALUE,
        LABEL_INSTANCE: instance,
        LABEL_USER: str(plan.user_id),
        LABEL_PLAN: plan.plan_hash,
        LABEL_IMAGE: image_id,
        LABEL_BUILD: agent_build,
    }
    environment = {
        "HOME": str(home_dir),
        "TMPDIR": "/tmp",
        "SANDBOX_AGENT_DIR": str(agent_dir),
    }
    return ContainerSpec(
        name=container_name(instance, plan.user_id),
        image=image,
        # The supervisor reads the lease; the agent gets the rest (images/sandbox-entrypoint).
        command=("--lease", str(lease_path), "--config", str(config_path)),
        user=f"{sandbox_uid}:{sandbox_gid}",
        group_add=extra_gids,
        environment=environment,
        labels=labels,
        mounts=mounts,
        network=network,
        limits=limits,
        hostname=f"sandbox-{plan.user_id}",
        runtime=runtime,
    )


# --- the container that exists, as the lifecycle decision table sees it ------------------


# The agent's exit after SIGTERM: 0, or 128 + 15 when it re-raises the signal after shutdown.
CLEAN_EXIT_CODES = (0, 143)


@dataclass(frozen=True)
class Observed:
    """A container as the engine reports it."""

    container_id: str
    running: bool
    exit_code: int
    plan_hash: str | None
    image_id: str | None
    runtime: str = "runc"
    limits: tuple[float, int] | None = None  # (cpus, memory_mb) of its HostConfig; None: unknown


@dataclass(frozen=True)
class Desired:
    plan_hash: str
    image_id: str
    agent_build: str
    runtime: str = "runc"  # ORCH_SANDBOX_RUNTIME: a container of another runtime is outdated
    limits: tuple[float, int] | None = None  # the user's (cpus, memory_mb): an admin's change makes it outdated


def container_state(observed: Observed) -> SandboxState:
    """Pure: a container as the lifecycle table sees it. A stop by SIGTERM is our own idle stop
    (`docker stop`): it starts again; any other exit is a kill (137), an OOM kill or a crash,
    and a fresh container is the safe answer."""
    if observed.running:
        return SandboxState.RUNNING
    return SandboxState.STOPPED if observed.exit_code in CLEAN_EXIT_CODES else SandboxState.ENDED


def container_outdated(observed: Observed, desired: Desired) -> bool:
    """Pure: another plan, image, runtime or limits than wanted: only a new container fits."""
    return (
        observed.plan_hash != desired.plan_hash
        or observed.image_id != desired.image_id
        or observed.runtime != desired.runtime
        or (None not in (observed.limits, desired.limits) and observed.limits != desired.limits)
    )


def observed_from_attrs(attrs: Mapping[str, object]) -> Observed:
    """An `Observed` from `docker inspect` output (container.attrs)."""
    state = attrs.get("State") or {}
    config = attrs.get("Config") or {}
    host_config = attrs.get("HostConfig") or {}
    labels = (config.get("Labels") if isinstance(config, Mapping) else None) or {}
    assert isinstance(state, Mapping) and isinstance(labels, Mapping)
    return Observed(
        container_id=str(attrs.get("Id")),
        running=bool(state.get("Running")) and not bool(state.get("Restarting")),
        exit_code=int(state.get("ExitCode") or 0),  # type: ignore[call-overload]
        plan_hash=labels.get(LABEL_PLAN),
        image_id=labels.get(LABEL_IMAGE),
        runtime=str(host_config.get("Runtime") or "runc") if isinstance(host_config, Mapping) else "runc",
        limits=_limits_of(host_config),
    )


def _limits_of(host_config: object) -> tuple[float, int] | None:
    if not isinstance(host_config, Mapping) or not host_config.get("NanoCpus") or not host_config.get("Memory"):
        return None
    return round(int(host_config["NanoCpus"]) / 1e9, 6), int(host_config["Memory"]) // (1024 * 1024)


def user_of(labels: Mapping[str, str] | None) -> int | None:
    """The user id a managed container's labels name, or None when they name none."""
    raw = (labels or {}).get(LABEL_USER, "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def sandbox_peer(runtime: str, sandbox_uid: int, container_id: str) -> ExpectedPeer:
    """Pure: what shows that a socket's peer is the user's sandbox. Under runc its agent is a
    host process of the sandbox's uid. Under runsc every socket the sandbox has on the host is
    its gofer's, a root process in the container's cgroup: the container is the fact (uid 0
    would also be dockerd's, another sandbox's gofer's or any root daemon's)."""
    if runtime == "runsc":
        return ExpectedPeer(container_id=container_id)
    return ExpectedPeer(uid=sandbox_uid)


def docker_time(text: str | None) -> str | None:
    """Pure: Docker's `2026-12-01T13:49:58.955123456Z` in the stored form; None for its zero time."""
    if not text or text.startswith("0001-"):
        return None
    head, _, fraction = text.rstrip("Z").partition(".")
    moment = datetime.fromisoformat(head).replace(tzinfo=timezone.utc, microsecond=int((fraction + "000000")[:6]))
    return iso(moment)
