"""The `process` backend: one sandbox agent subprocess per runtime user, on
`sockets/{uid}/agent.sock`, enforcing that user's mount plan with the PathSandbox.

- Concurrent first calls for one user start exactly one agent (a lock per user).
- Readiness is the agent's own `/health` answering with the instance id we gave it.
- A dead agent, or one the router forgot (it failed a call), is replaced by the next `ensure`;
  one that missed a deadline (stopped, hung) is killed without asking. The calls themselves,
  their one retry and their errors are the router's (docs/backends.md).
- An agent whose plan (or agent BUILD) is outdated is restarted once it is idle.
- Idle agents are paused and later stopped by `reap_idle` (a periodic task of the composition
  root, deciding with `idle_action`); the next call resumes a paused one. All agents are
  stopped at `close()`.
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
import errno
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

from mounts.fs.tree_removal import remove_tree
from mounts.layout import DataLayout
from orchestrator.clock import iso
from orchestrator.sandboxes.agent_deploy import AgentDeployment
from orchestrator.sandboxes.agent_calls import HEALTH_TIMEOUT_S, answer_limits, sandbox_unavailable
from orchestrator.sandboxes.agent_launch import prepare_agent_launch
from orchestrator import metrics
from orchestrator.sandboxes.base import (
    IdleAction,
    LiveAgent,
    SandboxStatus,
    SandboxUser,
    idle_action,
    loses_group_access,
    runs_processes,
)
from orchestrator.sandboxes.bwrap import BwrapProbe, HostSystem, bwrap_command, interpreter_mounts
from orchestrator.sandboxes.cgroups import CgroupError, CgroupPlan, SandboxCgroups, SandboxLimits
from orchestrator.sandboxes.warden import Warden
from orchestrator.sandboxes.netns import Isolation, decide_isolation, netns_command, netns_usable
from orchestrator.errors import ToolError
from orchestrator.log import kv
from orchestrator.settings import Settings
from orchestrator.users.dirs import UnsafeDirectory, UserDirectories
from sandbox_agent.client import AgentClient, AsyncAgentClient
from sandbox_agent.errors import AgentUnavailable
from sandbox_agent.peer import ExpectedPeer

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
STOP_GRACE_S = 3.0
STDERR_LINE_MAX = 4096  # bytes of one forwarded agent stderr line
_AGENT_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclass
class _Agent:
    user_id: int
    proc: subprocess.Popen[bytes]
    live: LiveAgent  # its clients (the blocking one also for health and cancels) and call count
    plan_hash: str
    build: str
    instance_id: str
    run_as_uid: int | None
    started_at: float = field(default_factory=time.time)
    group_gids: tuple[int, ...] = ()  # of the plan it was started with
    cgroup: CgroupPlan | None = None  # as root: the sandbox's cgroup, which the agent joined before it ran
    stalled: bool = False  # missed a call's deadline: killed before the next call
    forgotten: bool = False  # failed a call: replaced before the next call
    stderr_tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=20))

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def in_flight(self) -> int:
        return self.live.count.in_flight

    @property
    def last_used(self) -> float:
        return self.live.count.last_used

    @property
    def paused(self) -> bool:  # frozen by the reaper: thawed before the next call
        return self.live.count.paused


class SpawnThread:
    """Starts the agents' processes from one thread that lives as long as the backend. bwrap's
    --die-with-parent (PR_SET_PDEATHSIG) fires when the *thread* that forked it exits, and the
    threads calls run on come and go: an agent started from one would die with it."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="agent-spawner")
        self._thread.start()

    def run(self, start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        """`start()` on the spawner thread. After `close` an OSError at once: a start asked of
        a closed backend fails clearly instead of waiting for a thread that is gone."""
        done: Future[subprocess.Popen[bytes]] = Future()
        with self._lock:
            if self._closed:
                raise OSError(errno.ESHUTDOWN, "the process backend is closed: no agent starts")
            self._queue.put((start, done))
        return done.result()

    def _loop(self) -> None:
        while (job := self._queue.get()) is not None:
            start, done = job
            try:
                done.set_result(start())
            except BaseException as exc:  # handed to the caller's thread
                done.set_exception(exc)

    def close(self) -> None:
        with self._lock:  # what was queued before runs; nothing is queued after
            if not self._closed:
                self._closed = True
                self._queue.put(None)


class ProcessBackend:
    name = "process"

    def __init__(
        self,
        settings: Settings,
        layout: DataLayout,
        directories: UserDirectories,
        deployment: AgentDeployment,
        *,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.settings = settings
        self.layout = layout
        self.directories = directories
        self.deployment = deployment
        self.start_timeout_s = start_timeout_s
        self._agents: dict[int, _Agent] = {}
        self._user_locks: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()  # guards the two dicts and the agents' flags
        self._bwrap = BwrapProbe() if settings.process_sandbox == "bwrap" else None
        netns = netns_usable() if directories.chown and self._bwrap is None else (False, "not needed")
        self._netns = netns[0]
        self._cgroups: SandboxCgroups | None = None
        cgroups: tuple[bool, str | None, str] = (False, "not root: sandbox cgroups cannot be made", "none")
        if directories.chown:
            limits = SandboxLimits(
                cpus=settings.sandbox_cpus, memory_bytes=settings.sandbox_memory_mb * 1024 * 1024,
                pids=settings.sandbox_pids,
            )  # fmt: skip
            found = SandboxCgroups(directories.uid_base, limits)
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
        self._answer_limits = answer_limits(settings)
        self._spawner = SpawnThread()
        self._warden = Warden(None)  # thaws our SIGSTOPped agents, kills our cgroups, should we vanish

    # --- lifecycle ------------------------------------------------------------------------

    def _user_lock(self, user_id: int) -> threading.Lock:
        with self._lock:
            return self._user_locks.setdefault(user_id, threading.Lock())

    def ensure(self, user: SandboxUser) -> LiveAgent:
        if user.template is not None:
            raise template_unsupported(user)
        return self._ready(user).live

    def warm(self, user: SandboxUser) -> LiveAgent | None:
        """The user's agent when it can take the call as it is (no start, no lock to wait for)."""
        if user.template is not None:
            return None  # `ensure` refuses it
        with self._lock:
            agent = self._agents.get(user.user_id)
        if agent is None or agent.paused or agent.stalled or agent.forgotten or not agent.alive:
            return None
        if self._staleness(agent, user) is not None and (
            not agent.live.count.busy or loses_group_access(agent.group_gids, user.plan.group_gids)
        ):
            return None  # outdated and idle, or carrying a gid its plan lost: `ensure` replaces it
        return agent.live

    def resume(self, user: SandboxUser) -> LiveAgent | None:
        with self._lock:
            agent = self._agents.get(user.user_id)
        if agent is None or not agent.paused:
            return None
        with self._user_lock(user.user_id):
            if self._agents.get(user.user_id) is not agent or not agent.paused:
                return None  # resumed or replaced meanwhile: `ensure` decides
            started = time.monotonic()
            self._thaw(agent)
            metrics.observe_start(self.name, "resume", time.monotonic() - started)
            log.info("agent resumed %s", kv(user=user.user_id, pid=agent.proc.pid))
        return self.warm(user)  # None when it is outdated after all: `ensure` replaces it

    def _tree(self, agent: _Agent) -> list[psutil.Process]:
        # The agent and everything it started: with bwrap the agent is the launcher's child,
        # and shells run in sessions of their own, so its process group alone is not enough.
        try:
            root = psutil.Process(agent.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def _freeze(self, agent: _Agent) -> bool:
        if not agent.live.count.pause_if_idle():
            return False  # a call came first
        if agent.cgroup is not None and self._cgroups is not None:
            try:
                if self._cgroups.freeze(agent.cgroup):
                    return True
                log.warning("a sandbox cgroup did not freeze in time %s", kv(user=agent.user_id))
            except OSError as exc:
                log.warning("freezing a sandbox cgroup failed %s", kv(user=agent.user_id, error=exc))
            self._cgroups.thaw(agent.cgroup)
            agent.live.count.unpause()
            return False
        try:
            self._warden.frozen(agent.proc.pid, psutil.Process(agent.proc.pid).create_time())
        except psutil.Error:  # it just exited: nothing to freeze
            agent.live.count.unpause()
            return False
        for proc in self._tree(agent):
            try:
                proc.suspend()
            except psutil.Error:
                pass
        return True

    def _thaw(self, agent: _Agent) -> None:
        if agent.cgroup is not None and self._cgroups is not None:
            self._cgroups.thaw(agent.cgroup)
            agent.live.count.unpause()
            return
        for proc in reversed(self._tree(agent)):
            try:
                proc.resume()
            except psutil.Error:
                pass
        agent.live.count.unpause()
        self._warden.thawed(agent.proc.pid)

    def forget(self, user_id: int, *, agent: LiveAgent | None = None, stalled: bool = False) -> None:
        with self._lock:
            current = self._agents.get(user_id)
            if current is None or (agent is not None and current.live is not agent):
                return  # already replaced: the new agent did not fail
            current.forgotten = True
            current.stalled = current.stalled or stalled

    def _ready(self, user: SandboxUser) -> _Agent:
        with self._user_lock(user.user_id):
            agent = self._agents.get(user.user_id)
            if agent is not None and agent.paused:
                self._thaw(agent)  # e.g. the retry of a call: then judged like any other agent
            if agent is not None:
                if agent.stalled:
                    log.warning("replacing a stalled agent %s", kv(user=user.user_id, pid=agent.proc.pid))
                elif agent.forgotten and agent.alive:
                    if agent.in_flight > 0:
                        # Unreachable for new connections (e.g. the user's shell swapped its
                        # socket) while other calls still run on it through open ones: those
                        # are not killed for this one; it is replaced once they are done.
                        raise sandbox_unavailable(user.user_id, "its agent stopped accepting connections")
                    log.warning("replacing an agent that failed a call %s", kv(user=user.user_id, pid=agent.proc.pid))
                elif agent.alive:
                    stale = self._staleness(agent, user)
                    lost = loses_group_access(agent.group_gids, user.plan.group_gids)
                    busy = stale is not None and (agent.in_flight > 0 or runs_processes(agent.live, agent.live.count))
                    if stale is None or (busy and not lost):
                        return agent  # an outdated agent keeps serving until it is idle (no process runs)
                    log.info("restarting an outdated agent %s", kv(user=user.user_id, reason=stale))
                else:
                    log.warning(
                        "agent died; starting a new one %s",
                        kv(user=user.user_id, exit_code=agent.proc.returncode, stderr=" | ".join(agent.stderr_tail)[-300:]),
                    )
                self._terminate(agent)
            return self._start(user)

    def _staleness(self, agent: _Agent, user: SandboxUser) -> str | None:
        if agent.plan_hash != user.plan.plan_hash:
            return "plan_changed"
        if agent.build != self.deployment.build:
            return "build_drift"
        return None

    def _start(self, user: SandboxUser) -> _Agent:
        user_id = user.user_id
        namespaced = self._bwrap is not None
        run_as = self.directories.sandbox_uid(user_id) if self.directories.chown else None
        try:
            release = self.deployment.ensure()
            launch = prepare_agent_launch(
                self.settings, self.directories, user, in_sandbox=namespaced,
                # In its own PID namespace the agent cannot see our pid: bwrap --die-with-parent
                # ends the sandbox with us instead.
                parent_pid=None if namespaced else os.getpid(),
                private_network=self.isolation.process_network == "namespace",
            )  # fmt: skip
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
                shm_mb=self.settings.sandbox_shm_mb,
                extra_read_only=interpreter_mounts(python),
                bwrap=binary,
            )
        try:
            self._remove_stale_socket(launch.socket_path)
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
                    cgroup = self._cgroups.prepare(run_as)
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
        started = time.monotonic()
        peer = ExpectedPeer(uid=run_as) if run_as is not None else None
        agent = _Agent(
            user_id=user_id,
            proc=proc,
            # As root, only a socket served by the user's own uid is spoken to (SO_PEERCRED):
            # the socket dir is the user's, and a link there could lead anywhere.
            live=LiveAgent(
                user_id,
                AgentClient(
                    launch.socket_path, launch.token, expected_peer=peer, answer_limits=self._answer_limits
                ),
                AsyncAgentClient(
                    launch.socket_path, launch.token, expected_peer=peer, answer_limits=self._answer_limits
                ),
            ),
            plan_hash=user.plan.plan_hash,
            group_gids=user.plan.group_gids,
            build=release.build,
            instance_id=launch.config.instance_id,
            run_as_uid=run_as,
            cgroup=cgroup,
        )
        threading.Thread(target=self._forward_stderr, args=(agent,), daemon=True, name=f"agent-{user_id}-stderr").start()
        try:
            self._wait_healthy(agent)
        except ToolError:
            self._terminate(agent)
            raise
        with self._lock:
            self._agents[user_id] = agent
        metrics.observe_start(self.name, "cold", time.monotonic() - started)
        log.info(
            "agent started %s",
            kv(user=user_id, pid=proc.pid, uid=run_as if run_as is not None else os.geteuid(), build=release.build),
        )
        return agent

    def _remove_stale_socket(self, socket_path: Path) -> None:
        """So that readiness can only be the new agent. The socket dir is the user's: whatever
        sits at the socket's name (even a directory) goes. Safe as root: `sockets/` is root's,
        so `sockets/{uid}` cannot be swapped for a link, and the removal never follows a link."""
        remove_tree(socket_path)

    def _wait_healthy(self, agent: _Agent) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        delay = 0.005
        while True:
            if not agent.alive:
                time.sleep(0.05)  # let the stderr forwarder catch the last lines
                raise sandbox_unavailable(
                    agent.user_id,
                    f"the agent exited with code {agent.proc.returncode}: {' | '.join(agent.stderr_tail)[-500:]}",
                )
            try:
                health = agent.live.blocking.health(timeout_s=HEALTH_TIMEOUT_S)
                if health.instance_id == agent.instance_id:
                    return
            except AgentUnavailable:
                pass
            if time.monotonic() > deadline:
                raise sandbox_unavailable(agent.user_id, f"the agent did not answer within {self.start_timeout_s:g} s")
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

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

    def cgroup_of(self, user_id: int) -> CgroupPlan | None:
        with self._lock:
            agent = self._agents.get(user_id)
        return agent.cgroup if agent is not None else None

    def _terminate(self, agent: _Agent) -> None:
        """Stop the agent and everything it started (shells run in their own sessions)."""
        with self._lock:
            if self._agents.get(agent.user_id) is agent:
                del self._agents[agent.user_id]
        if agent.paused and agent.alive:
            self._thaw(agent)  # a stopped process does not act on SIGTERM
        tree: list[psutil.Process] = []
        if agent.cgroup is None:  # with a cgroup, its kill below takes everything
            try:
                tree = psutil.Process(agent.proc.pid).children(recursive=True)
            except psutil.Error:
                pass
        if agent.alive and agent.stalled:
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
        agent.live.blocking.close()
        agent.live.calls.close()

    def stop(self, user_id: int) -> None:
        with self._user_lock(user_id):
            agent = self._agents.get(user_id)
            if agent is not None:
                self._terminate(agent)
                log.info("agent stopped %s", kv(user=user_id))

    # --- calls ------------------------------------------------------------------------------

    def cancel_calls(self, user_id: int, *, run_id: str | None = None, session_id: str | None = None) -> int:
        with self._lock:
            agent = self._agents.get(user_id)
        if agent is None or not agent.alive:
            return 0  # no agent, no call of it in flight (its shells died with it)
        try:
            return agent.live.blocking.cancel(run_id=run_id, session_id=session_id)
        except AgentUnavailable as exc:
            # It cannot say what it stopped: stop it whole rather than leave calls running.
            log.warning("agent did not answer a cancel; stopping it %s", kv(user=user_id, error=exc.message))
            self.stop(user_id)
            return 0

    # --- idleness ---------------------------------------------------------------------------

    def reap_idle(self, now: float | None = None) -> list[int]:
        """Pause or stop the idle agents (`idle_action`); returns the users stopped."""
        now = time.monotonic() if now is None else now
        with self._lock:
            # Calls and idleness only: asking an agent for its processes waits for its answer.
            candidates = [a.user_id for a in self._agents.values() if self._idle_action(a, now) is not IdleAction.NOTHING]
        stopped = []
        for user_id in candidates:
            with self._user_lock(user_id):
                agent = self._agents.get(user_id)
                if agent is None:
                    continue
                # Again, under the lock (a call may have come), and now asking whether background
                # processes run there (they make it busy, whatever the calls).
                processes = agent.alive and not agent.paused and runs_processes(agent.live, agent.live.count)
                action = self._idle_action(agent, now, processes=processes)
                idle_s = round(now - agent.last_used, 1)
                if action is IdleAction.STOP:
                    self._terminate(agent)
                    stopped.append(user_id)
                    log.info("idle agent stopped %s", kv(user=user_id, idle_s=idle_s))
                elif action is IdleAction.PAUSE and agent.alive and self._freeze(agent):
                    log.info("idle agent paused %s", kv(user=user_id, pid=agent.proc.pid, idle_s=idle_s))
                else:
                    continue
                metrics.SANDBOX_IDLE_ACTIONS.labels(self.name, action.value).inc()
        return stopped

    def _idle_action(self, agent: _Agent, now: float, *, processes: bool = False) -> IdleAction:
        return idle_action(
            idle_s=now - agent.last_used,
            in_flight=agent.in_flight,
            paused=agent.paused,
            has_running_processes=processes,
            pause_after_s=self.settings.pause_after_s,
            idle_timeout_s=self.settings.idle_timeout_s,
        )

    # --- status -----------------------------------------------------------------------------

    def _status_of(self, agent: _Agent) -> SandboxStatus:
        return SandboxStatus(
            user_id=agent.user_id,
            backend=self.name,
            state=("paused" if agent.paused else "running") if agent.alive else "failed",
            plan_hash=agent.plan_hash,
            agent_build=agent.build,
            busy=agent.in_flight,
            detail={
                "pid": agent.proc.pid,
                "uid": agent.run_as_uid if agent.run_as_uid is not None else os.geteuid(),
                "socket": agent.live.blocking.socket_path,
                "namespace": "bwrap" if self._bwrap is not None else "none",
                "cgroup": str(agent.cgroup.v2_dir) if agent.cgroup is not None else None,
                "network": self.isolation.process_network,
                "started_at": agent.started_at,
                "idle_s": round(time.monotonic() - agent.last_used, 3),
            },
            since=iso(datetime.fromtimestamp(agent.started_at, timezone.utc)),
        )

    def status(self) -> list[SandboxStatus]:
        with self._lock:
            agents = list(self._agents.values())
        return [self._status_of(a) for a in sorted(agents, key=lambda a: a.user_id)]

    def close(self) -> None:
        with self._lock:
            agents = list(self._agents.values())
        for agent in agents:
            self._terminate(agent)
        self._spawner.close()
        self._warden.close()
        if self._cgroups is not None:
            self._cgroups.close()


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
