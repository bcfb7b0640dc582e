"""The process driver of the lifecycle engine (`lifecycle_engine.py`): one sandbox agent
subprocess per runtime user, on `sockets/{uid}/agent.sock`, enforcing that user's mount plan
with the PathSandbox. When to start, replace, pause or stop an agent is the engine's.

- Nothing is adopted: a server ends whatever an earlier one of its instance left, and all
  agents are stopped at `close()`.
- An agent a call could not reach is replaced, not reconnected (its socket is in a directory
  the user can write), unless other calls still run on it through open connections: that call
  is refused instead. An outdated agent is started again, never restarted in place.
- As root, each sandbox lives in a cgroup of its own (orchestrator/sandboxes/cgroups.py),
  joined by its launcher before the agent runs: stop is `cgroup.kill` (nothing it forked
  survives), pause is `cgroup.freeze`, and ORCH_SANDBOX_CPUS / _MEMORY_MB / _PIDS are its
  limits. Without cgroups (not root) pause is a SIGSTOP of the agent's process tree and stop a
  kill of that tree, which a process forking faster than the scan can outlive; /healthz says
  so (`process_lifetime`).
- As root, an agent runs as the user's own uid (base + user id) with the shared sandbox
  group and the gids of the user's group workspaces (exactly those of the plan), umask 002,
  and an interpreter that uid can execute, in a network namespace of its own with only `lo`
  (orchestrator/sandboxes/netns.py; bwrap makes its own).
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import psutil

from mounts.fs.tree_removal import remove_tree
from orchestrator.clock import iso
from orchestrator.errors import ToolError
from orchestrator.log import kv
from orchestrator.sandboxes.agent_calls import sandbox_unavailable
from orchestrator.sandboxes.agent_deploy import AgentDeployment, AgentRelease
from orchestrator.sandboxes.agent_launch import AgentLaunch
from orchestrator.sandboxes.base import SandboxStatus, SandboxUser, runs_processes
from orchestrator.sandboxes.bwrap import BwrapProbe, HostSystem, bwrap_command, interpreter_mounts
from orchestrator.sandboxes.cgroups import CgroupError, CgroupPlan, SandboxCgroups, SandboxLimits
from orchestrator.sandboxes.docker_spec import Limits
from orchestrator.sandboxes.lifecycle_decision import Observed as SandboxState
from orchestrator.sandboxes.lifecycle_engine import LifecycleEngine
from orchestrator.sandboxes.netns import Isolation, decide_isolation, netns_command, netns_usable
from orchestrator.sandboxes.sandbox_driver import Found, Inspection, Progress, SandboxDriver, Wanted
from orchestrator.sandboxes.slots import AgentSlot
from orchestrator.sandboxes.spawn_thread import SpawnThread
from orchestrator.sandboxes.warden import Warden
from orchestrator.settings import SandboxSettings
from orchestrator.users.dirs import UnsafeDirectory, UserDirectories
from sandbox_agent.peer import ExpectedPeer

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
STOP_GRACE_S = 3.0
STDERR_LINE_MAX = 4096  # bytes of one forwarded agent stderr line
_AGENT_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclass
class _Agent:
    """One running agent process: the process backend's only record of a sandbox (its call
    count and clients are the engine's slot)."""

    user_id: int
    proc: subprocess.Popen[bytes]
    plan_hash: str
    build: str
    run_as_uid: int | None
    started_at: float = field(default_factory=time.time)
    group_gids: tuple[int, ...] = ()  # of the plan it was started with
    cgroup: CgroupPlan | None = None  # as root: the sandbox's cgroup, which the agent joined before it ran
    stderr_tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=20))

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class ProcessDriver(SandboxDriver):
    """The verbs of the lifecycle engine on host processes: an agent is started, frozen, thawed
    and ended, never adopted (a restart ends them all) nor restarted in place."""

    name = "process"
    pauses = True  # `cgroup.freeze`, or SIGSTOP of the agent's tree
    api_name = "the process backend"
    reconnects = False  # an agent a call could not reach is replaced: its socket is in the user's dir
    spares_calls_in_flight = True
    ready_poll_s = (0.005, 0.1)
    progress_every_s = 0.0  # `poll()` of our own child: free

    def __init__(
        self,
        settings: SandboxSettings,
        directories: UserDirectories,
        deployment: AgentDeployment,
        *,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        super().__init__(settings, directories, deployment)
        self.ready_timeout_s = start_timeout_s
        self._agents: dict[int, _Agent] = {}  # the running agents: this platform's only record
        self._lock = threading.Lock()  # guards `_agents`
        self._bwrap = BwrapProbe() if settings.process_sandbox == "bwrap" else None
        netns = netns_usable() if directories.chown and self._bwrap is None else (False, "not needed")
        self._netns = netns[0]
        self._cgroups: SandboxCgroups | None = None
        cgroups: tuple[bool, str | None, str] = (False, "not root: sandbox cgroups cannot be made", "none")
        if directories.chown:
            found = SandboxCgroups(directories.uid_base, _cgroup_limits(self.limits))
            cgroups = (found.usable, found.reason, found.limited_by)
            if found.usable:
                self._cgroups = found
                # No adoption: whatever an earlier server of this instance left is ended.
                found.kill_leftovers()
            else:
                log.error("process-backend sandboxes get no cgroup; their lifetime is not kernel-bounded %s", kv(reason=found.reason))
        self.isolation: Isolation = decide_isolation(
            as_root=directories.chown, bwrap=self._bwrap is not None, netns=netns, uid_base=directories.uid_base,
            cgroups=cgroups,
        )  # fmt: skip
        if not self.isolation.complete:
            log.error(
                "process-backend sandboxes are NOT isolated from each other or the host network %s",
                kv(reason=self.isolation.reason, network=self.isolation.process_network),
            )
        self._spawner = SpawnThread()
        self._warden = Warden(None)  # thaws our SIGSTOPped agents, kills our cgroups, should we vanish

    def launch_options(self) -> dict[str, Any]:
        namespaced = self._bwrap is not None
        return {
            "in_sandbox": namespaced,
            # In its own PID namespace the agent cannot see our pid: bwrap --die-with-parent
            # ends the sandbox with us instead.
            "parent_pid": None if namespaced else os.getpid(),
            "private_network": self.isolation.process_network == "namespace",
        }

    # --- facts ------------------------------------------------------------------------------
    def wanted(self, user: SandboxUser) -> Wanted:
        if user.template is not None:
            raise template_unsupported(user)
        return Wanted(user.plan.plan_hash, None, self.deployment.build)

    def wanted_now(self, user: SandboxUser) -> tuple[str, str | None] | None:
        return None if user.template is not None else (user.plan.plan_hash, None)  # a template: `ensure` refuses it

    def _agent(self, user_id: int) -> _Agent | None:
        with self._lock:
            return self._agents.get(user_id)

    def usable(self, slot: AgentSlot) -> bool:
        agent = self._agent(slot.user_id)
        return agent is not None and agent.alive

    def inspect(self, slot: AgentSlot, wanted: Wanted | None) -> Inspection:
        agent = self._agent(slot.user_id)
        if agent is None:
            return Inspection(SandboxState.ABSENT)
        if not agent.alive:
            log.warning(
                "agent died; starting a new one %s",
                kv(user=agent.user_id, exit_code=agent.proc.returncode, stderr=" | ".join(agent.stderr_tail)[-300:]),
            )
        return Inspection(
            SandboxState.RUNNING if agent.alive else SandboxState.ENDED,
            wanted is not None and agent.plan_hash != wanted.plan_hash,
            agent.plan_hash, None, str(agent.proc.pid), frozenset(agent.group_gids), agent,
        )  # fmt: skip

    def listed(self) -> list[Found]:
        with self._lock:
            agents = sorted(self._agents.values(), key=lambda a: a.user_id)
        return [Found(a.user_id, f"pid {a.proc.pid}", a.alive, a) for a in agents]

    def status(self, found: Found, slot: AgentSlot) -> SandboxStatus:
        agent: _Agent = found.handle
        return SandboxStatus(
            user_id=agent.user_id,
            backend=self.name,
            state=("paused" if slot.count.paused else "running") if agent.alive else "failed",
            plan_hash=agent.plan_hash,
            agent_build=agent.build,
            busy=slot.count.in_flight,
            detail={
                "pid": agent.proc.pid,
                "uid": agent.run_as_uid if agent.run_as_uid is not None else os.geteuid(),
                "socket": str(self.layout.socket_path(agent.user_id)),
                "namespace": "bwrap" if self._bwrap is not None else "none",
                "cgroup": str(agent.cgroup.v2_dir) if agent.cgroup is not None else None,
                "network": self.isolation.process_network,
                "started_at": agent.started_at,
                "idle_s": round(time.monotonic() - slot.count.last_used, 3),
            },
            since=iso(datetime.fromtimestamp(agent.started_at, timezone.utc)),
        )

    def sandbox_name(self, user_id: int) -> str:
        agent = self._agent(user_id)
        return f"agent {user_id}" + (f" (pid {agent.proc.pid})" if agent is not None else "")

    def cgroup_of(self, user_id: int) -> CgroupPlan | None:
        agent = self._agent(user_id)
        return agent.cgroup if agent is not None else None

    # --- verbs ------------------------------------------------------------------------------
    def adopt(self, slot: AgentSlot, found: Found) -> None:
        pass  # nothing outlives a restart: `kill_leftovers` ended it

    def discard(self, found: Found) -> None:
        self._terminate(found.handle)

    def expected_peer(self, slot: AgentSlot) -> ExpectedPeer | None:
        """As root, the user's own uid (SO_PEERCRED): the socket dir is the user's."""
        return ExpectedPeer(uid=self.directories.sandbox_uid(slot.user_id)) if self.directories.chown else None

    def remove(self, slot: AgentSlot, seen: Inspection | None, *, kill: bool) -> None:
        agent = self._agent(slot.user_id)
        if agent is not None:
            self._terminate(agent, paused=slot.count.paused, kill=kill)

    def stop(self, slot: AgentSlot, reason: str) -> None:
        if self._agent(slot.user_id) is not None:
            self.remove(slot, None, kill=slot.stalled)  # a stalled agent is killed without asking
            log.info("agent stopped %s", kv(user=slot.user_id, reason=reason))

    def progress(self, slot: AgentSlot) -> Progress:
        agent = self._agent(slot.user_id)
        if agent is None:
            return Progress(failed="the agent is gone")
        if not agent.alive:
            time.sleep(0.05)  # let the stderr forwarder catch the last lines
            return Progress(failed=f"the agent exited with code {agent.proc.returncode}: {' | '.join(agent.stderr_tail)[-500:]}")
        return Progress()

    def start_failed(self, slot: AgentSlot) -> dict[str, str]:
        agent = self._agent(slot.user_id)
        if agent is None:
            return {}
        self._terminate(agent)
        return {"logs": " | ".join(agent.stderr_tail)}

    def _tree(self, agent: _Agent) -> list[psutil.Process]:
        # The agent and everything it started: with bwrap the agent is the launcher's child,
        # and shells run in sessions of their own, so its process group alone is not enough.
        try:
            root = psutil.Process(agent.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def pause(self, slot: AgentSlot) -> bool:
        """Freeze the agent's cgroup (or SIGSTOP its tree); False when it is not running or the
        freeze did not take."""
        agent = self._agent(slot.user_id)
        if agent is None or not agent.alive:
            return False
        if agent.cgroup is not None and self._cgroups is not None:
            try:
                if self._cgroups.freeze(agent.cgroup):
                    return True
                log.warning("a sandbox cgroup did not freeze in time %s", kv(user=agent.user_id))
            except OSError as exc:
                log.warning("freezing a sandbox cgroup failed %s", kv(user=agent.user_id, error=exc))
            self._cgroups.thaw(agent.cgroup)
            return False
        try:
            self._warden.frozen(agent.proc.pid, psutil.Process(agent.proc.pid).create_time())
        except psutil.Error:  # it just exited: nothing to freeze
            return False
        for proc in self._tree(agent):
            try:
                proc.suspend()
            except psutil.Error:
                pass
        return True

    def resume(self, slot: AgentSlot) -> None:
        agent = self._agent(slot.user_id)
        if agent is not None:
            self._thaw(agent)

    def _thaw(self, agent: _Agent) -> None:
        if agent.cgroup is not None and self._cgroups is not None:
            self._cgroups.thaw(agent.cgroup)
            return
        for proc in reversed(self._tree(agent)):
            try:
                proc.resume()
            except psutil.Error:
                pass
        self._warden.thawed(agent.proc.pid)

    def create(self, slot: AgentSlot, user: SandboxUser, launch: AgentLaunch, release: AgentRelease) -> None:
        """Start the user's agent (the readiness wait is the engine's)."""
        user_id = user.user_id
        run_as = self.directories.sandbox_uid(user_id) if self.directories.chown else None
        try:
            python = self.deployment.interpreter_for(run_as)
        except (OSError, RuntimeError, UnsafeDirectory) as exc:  # incl. GroupWithoutGid
            log.error("cannot prepare the agent %s", kv(user=user_id, error=exc))
            raise sandbox_unavailable(user_id, f"preparing it failed: {exc}") from exc
        command = release.command(python, launch.config_path)
        if self._bwrap is not None:
            usable, binary = self._bwrap.check(run_as)
            if not usable:
                # The operator asked for a namespace: no silent fallback to less isolation.
                log.error("bwrap is not usable %s", kv(user=user_id, reason=binary))
                raise sandbox_unavailable(user_id, f"ORCH_PROCESS_SANDBOX=bwrap but {binary}")
            command = bwrap_command(
                user.plan,
                command,
                chdir=self.layout.home_dir(user_id),
                system=HostSystem.inspect(),
                shm_mb=self.settings.shm_mb,
                extra_read_only=(*interpreter_mounts(python), *self._ca_mounts()),
                bwrap=binary,
            )
        try:
            # So that readiness can only be the new agent. The socket dir is the user's: whatever
            # sits at the socket's name (even a directory) goes. Safe as root: `sockets/` is
            # root's, so `sockets/{uid}` cannot be swapped for a link, and the removal never
            # follows a link.
            remove_tree(launch.socket_path)
        except OSError as exc:  # the user's shell keeps changing its socket dir under us
            raise sandbox_unavailable(user_id, f"clearing its socket path failed: {exc}") from exc
        identity: dict[str, Any] = {}
        cgroup: CgroupPlan | None = None
        if run_as is not None:
            # The shared gid opens share/; each group gid one workspace of the plan, no other.
            extra_groups = [self.directories.shared_gid, *user.plan.group_gids]
            identity = {"user": run_as, "group": run_as, "extra_groups": extra_groups}
            if self._cgroups is not None:
                try:
                    cgroup = self._cgroups.prepare(run_as, _cgroup_limits(self.limits.for_user(user.cpus, user.memory_mb)))
                except CgroupError as exc:
                    raise sandbox_unavailable(user_id, f"its cgroup: {exc}") from exc
                self._warden.watch_cgroup(cgroup.v2_dir)
            if self._netns or cgroup is not None:
                # Both need root: the launcher joins the cgroup and makes the namespace (bwrap
                # makes its own), then switches to the uid and executes the agent.
                command = netns_command(
                    command, uid=run_as, gid=run_as, groups=extra_groups,
                    cgroup_procs=cgroup.procs if cgroup is not None else (), new_network=self._netns,
                )  # fmt: skip
                identity = {}
        try:
            proc = self._spawner.run(lambda: subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                cwd=str(self.layout.home_dir(user_id)),
                env=dict(_AGENT_ENV),
                start_new_session=True,  # its own process group: signals to us do not hit it
                umask=0o002,  # group-writable files in shared dirs; private dirs are 0700 anyway
                **identity,
            ))  # fmt: skip
        except OSError as exc:
            self._end_cgroup(cgroup)
            raise sandbox_unavailable(user_id, f"starting it failed: {exc}") from exc
        agent = _Agent(
            user_id, proc, user.plan.plan_hash, release.build, run_as,
            group_gids=user.plan.group_gids, cgroup=cgroup,
        )  # fmt: skip
        threading.Thread(target=self._forward_stderr, args=(agent,), daemon=True, name=f"agent-{user_id}-stderr").start()
        with self._lock:
            self._agents[user_id] = agent
        slot.sandbox_id = str(proc.pid)
        log.info("agent started %s", kv(user=user_id, pid=proc.pid, uid=run_as if run_as is not None else os.geteuid(), build=release.build))

    def _ca_mounts(self) -> tuple[str, ...]:
        """The sandbox CA bundle when it lives outside /etc (the deployment CA's, under the
        data dir): bwrap shows it read-only at its own path."""
        bundle = self.ca_bundle()
        return (str(bundle),) if bundle is not None and not str(bundle).startswith("/etc/") else ()

    def _forward_stderr(self, agent: _Agent) -> None:
        stream = agent.proc.stderr
        if stream is None:
            return
        # Bounded: the agent runs as the user's uid, which can make it write anything; a line
        # without an end must not grow in the orchestrator's memory (longer ones are split).
        for raw in iter(lambda: stream.readline(STDERR_LINE_MAX), b""):
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                agent.stderr_tail.append(line)
                log.info("agent says %s", kv(user=agent.user_id, line=line))
        stream.close()

    def _end_cgroup(self, cgroup: CgroupPlan | None) -> None:
        """Everything in the sandbox's cgroup is killed (the kernel's `cgroup.kill`, which no
        fork outruns) and the cgroup removed once empty."""
        if cgroup is None or self._cgroups is None:
            return
        self._cgroups.kill(cgroup)
        self._warden.forget_cgroup(cgroup.v2_dir)

    def _terminate(self, agent: _Agent, *, paused: bool = False, kill: bool = False) -> None:
        """Stop the agent and everything it started (shells run in their own sessions); `kill`:
        it missed a call's deadline, so it is killed, not asked to stop."""
        with self._lock:
            if self._agents.get(agent.user_id) is agent:
                del self._agents[agent.user_id]
        if paused and agent.alive:
            self._thaw(agent)  # a stopped process does not act on SIGTERM
        tree: list[psutil.Process] = []
        if agent.cgroup is None:  # with a cgroup, its kill below takes everything
            try:
                tree = psutil.Process(agent.proc.pid).children(recursive=True)
            except psutil.Error:
                pass
        if agent.alive and kill:
            agent.proc.kill()  # a stopped agent would not see SIGTERM; SIGKILL needs no cooperation
        elif agent.alive:
            try:
                if self._bwrap is not None:
                    # bwrap does not forward signals: the agent (the child of bwrap's init in
                    # its PID namespace) shuts down gracefully and bwrap exits with it.
                    for init in psutil.Process(agent.proc.pid).children():
                        for child in init.children():
                            child.terminate()
                else:
                    agent.proc.send_signal(signal.SIGTERM)
                agent.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                agent.proc.kill()
            except (OSError, psutil.Error):
                pass
        self._end_cgroup(agent.cgroup)  # what the agent left, and what outran its sweep
        agent.proc.wait()
        for proc in tree:
            try:
                proc.kill()
            except psutil.Error:
                pass

    def close(self) -> None:
        with self._lock:
            agents = list(self._agents.values())
        for agent in agents:
            self._terminate(agent)
        self._spawner.close()
        self._warden.close()
        if self._cgroups is not None:
            self._cgroups.close()


def _cgroup_limits(limits: Limits) -> SandboxLimits:
    """A sandbox's limits as its cgroup takes them."""
    return SandboxLimits(cpus=limits.cpus, memory_bytes=limits.memory_mb * 1024 * 1024, pids=limits.pids)


class ProcessBackend(LifecycleEngine):
    """The process backend: the lifecycle engine on `ProcessDriver`."""

    def __init__(
        self, settings: SandboxSettings, directories: UserDirectories, deployment: AgentDeployment, *,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:  # fmt: skip
        self.driver: ProcessDriver = ProcessDriver(settings, directories, deployment, start_timeout_s=start_timeout_s)
        super().__init__(
            self.driver, settings, directories, deployment, known_user=lambda _: True,
            processes_run=lambda live, count: runs_processes(live, count),  # looked up at each call
        )  # fmt: skip
        self.isolation = self.driver.isolation
        self.cgroup_of = self.driver.cgroup_of


def template_unsupported(user: SandboxUser) -> ToolError:
    """The process backend runs the host's own tools: a template cannot change them, and running
    without the template would silently lack what it adds."""
    assert user.template is not None
    return ToolError(
        "template_unsupported",
        f"User {user.user_id}'s sandbox needs template {user.template.name!r}, but this server runs sandboxes as "
        "host processes (the process backend), which use the host's own tools and cannot run a template image. "
        "The tool did not run; an admin can assign the default template or use the docker or kubernetes backend.",
        template=user.template.name,
    )
