"""Serving the agent on its Unix socket (no network needed), and in a Kubernetes pod also on
the pod's loopback, where a port-forward of the Kubernetes API reaches it."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import socket
import stat
import sys
import threading
import time
from pathlib import Path
from types import FrameType

import psutil
import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from sandbox_agent import orphan_reaper, process_tree
from sandbox_agent.app import AgentState, create_app
from sandbox_agent.build import own_build_id
from sandbox_agent.egress_forwarder import start_egress
from sandbox_agent.path_sandbox import PathSandbox, Root
from sandbox_agent.port_tunnel import PortTunnels, protocol_class
from sandbox_agent.supervisor import dead_man_check_s, make_undumpable
from sandbox_agent.unix_path import reachable
from sandbox_agent.wire import AgentConfig, valid_token

log = logging.getLogger("sandbox_agent")


def load_config(path: str | Path) -> AgentConfig:
    return AgentConfig.model_validate_json(Path(path).read_bytes())


def load_token(path: str) -> str:
    """The token the orchestrator wrote (root-owned 0640 when it runs as root, else 0600): a
    plain file, read without following a link, bounded, and of a token's form, or no start."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SystemExit(f"token file {path} is not a regular file")
        if st.st_mode & 0o027:
            log.warning("token file %s is accessible by others (mode %o)", path, stat.S_IMODE(st.st_mode))
        token = os.read(fd, 256).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    if not valid_token(token):
        raise SystemExit(f"token file {path} holds no usable token")
    return token


def bind_unix_socket(path: str) -> socket.socket:
    """Listen on `path` with mode 0600, replacing a stale socket (never a directory)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISDIR(st.st_mode):
            raise SystemExit(f"socket path {path} is a directory")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket file is created 0600 (single-threaded here)
    try:
        with reachable(path) as short:
            sock.bind(short)
    finally:
        os.umask(old)
    sock.listen(128)
    return sock


def bind_loopback_port(port: int) -> socket.socket:
    """Listen on 127.0.0.1:`port` with TCP_NODELAY (accepted connections inherit it), so an
    answer uvicorn writes in two pieces (head, then body) is not held back by Nagle's
    algorithm waiting for the port-forward's delayed ACK (some 40 ms per answer)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    return sock


class AgentServer(uvicorn.Server):
    """uvicorn's server, except that a signal to stop wakes its main loop at once instead of at
    its next tick (uvicorn looks every 0.1 s): every sandbox stop waits for its agent to exit."""

    _wake: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def main_loop(self) -> None:
        """uvicorn's loop (`on_tick` every 0.1 s until it says stop), woken early by a signal."""
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            try:
                await asyncio.wait_for(self._wake.wait(), 0.1)
            except asyncio.TimeoutError:
                pass
            should_exit = await self.on_tick(counter)


def _watch_parent(server: uvicorn.Server, parent_pid: int) -> None:
    """An agent of the process backend must not outlive the orchestrator that started it. The
    orchestrator may be a grandparent (bwrap sits in between), so this watches that very
    process (pid and start time), not getppid()."""
    try:
        started = psutil.Process(parent_pid).create_time()
    except psutil.Error:
        started = None
    while not server.should_exit:
        try:
            parent = psutil.Process(parent_pid)
            # A zombie is dead too: it only waits for its own parent to reap it.
            alive = parent.create_time() == started and parent.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            alive = False
        if not alive:
            log.warning("the orchestrator (pid %s) is gone; shutting down", parent_pid)
            server.should_exit = True
            return
        time.sleep(0.5)


def _dead_man_switch(server: uvicorn.Server, state: AgentState, idle_exit_s: float) -> None:
    """Exit after `idle_exit_s` without a call: the orchestrator normally stops an idle sandbox
    first (its idle timeout is shorter); this one acts when no orchestrator is left to. The
    monotonic clock also runs while the agent is frozen, so a thawed orphan exits at once.
    A second line only: the tenant can call, stop or kill its agent, so in a docker sandbox
    the supervisor's lease is what bounds an orphan (sandbox_agent/supervisor.py)."""
    while not server.should_exit:
        time.sleep(dead_man_check_s(idle_exit_s))
        idle = state.idle_for(time.monotonic())
        if idle is not None and idle >= idle_exit_s:
            log.warning("no call for %.0f s: the dead-man switch stops this sandbox", idle)
            server.should_exit = True
            return


def _kill_descendants() -> None:
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(children, timeout=2)


def _own_ports(listen_port: int | None, proxy_env: dict[str, str]) -> frozenset[int]:
    ports = {listen_port} if listen_port is not None else set()
    proxy = proxy_env.get("HTTP_PROXY", "")
    if proxy.rpartition(":")[2].isdigit():
        ports.add(int(proxy.rpartition(":")[2]))
    return frozenset(ports)


def limit_processes(limit: int | None) -> None:
    """Cap the processes (and threads) of this uid, hard, so shells cannot raise it again."""
    if limit is None:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))


def serve(config: AgentConfig) -> None:
    # First: the tenant's processes run as this very uid; undumpable, the agent cannot be
    # ptraced, nor its memory, descriptors or environment read through /proc, by them.
    make_undumpable()
    limit_processes(config.max_processes)
    if process_tree.adopt_orphans():
        orphan_reaper.start()
    process_tree.sweep_uid(config.sweep_uid)
    sandbox = PathSandbox(
        [Root(r.path, r.access == "rw", r.purpose) for r in config.roots],
        data_root=config.data_root,
        user_id=config.user_id,
        resolver=config.resolver,
    )
    if config.egress is not None:
        # The forwarder's port is known only once it is bound (any free one on a shared network).
        proxy_env = start_egress(config.egress, config.home)
        config = config.model_copy(update={"shell_env": {**config.shell_env, **proxy_env}})
    else:
        proxy_env = {}
    state = AgentState(config, sandbox, load_token(config.token_file))
    sock = bind_unix_socket(config.socket_path)
    bound = os.stat(config.socket_path)
    sockets = [sock]
    if config.listen_port is not None:
        sockets.append(bind_loopback_port(config.listen_port))
    # Previews reach the sandbox's ports through CONNECT on these sockets (port_tunnel.py),
    # never the agent's own port or the egress forwarder's.
    tunnels = PortTunnels(state.token_ok, _own_ports(config.listen_port, proxy_env), state.enter, state.leave)
    server = AgentServer(
        uvicorn.Config(
            create_app(state),
            http=protocol_class(AutoHTTPProtocol, tunnels),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_keep_alive=5,  # idle connections from the orchestrator's pool
            timeout_graceful_shutdown=3,
        )
    )
    # uvicorn re-raises a captured SIGTERM after its graceful shutdown; with this handler that
    # becomes SystemExit, so the cleanup below still runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if config.parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(server, config.parent_pid), daemon=True).start()
    if config.idle_exit_s is not None:
        threading.Thread(target=_dead_man_switch, args=(server, state, config.idle_exit_s), daemon=True).start()
    log.info(
        "agent listening socket=%s port=%s user=%s build=%s resolver=%s roots=%d",
        config.socket_path, config.listen_port, config.user_id, own_build_id(), sandbox.resolver, len(config.roots),
    )
    try:
        server.run(sockets=sockets)
    finally:
        state.processes.kill_all()  # a stopped or recreated sandbox keeps none of them
        state.kernels.kill_all()
        _kill_descendants()
        try:
            st = os.stat(config.socket_path)
            if (st.st_dev, st.st_ino) == (bound.st_dev, bound.st_ino):  # not a successor's socket
                os.unlink(config.socket_path)
        except OSError:
            pass
        sandbox.close()
