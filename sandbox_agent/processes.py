"""Background processes the agent owns (docs/processes.md): started by `process_start`, they
belong to the agent, not to the HTTP call, and keep running when the caller goes away.

Each process has an unguessable id, the session it was started for (it is visible only to
calls of that session: another session's or another user's process is `not_found`), its
process group and session of its own (signals go to the whole group), and its output spooled
to a bounded ring file in the session's `shell-output/` directory (process_spool.py).

A process's leader is reaped by its own waiter thread; the leftover sweep of `shell` spares
the leader and its descendants (process_tree.keep). It is killed, whole tree, when its
session is cancelled (deleted), past the maximum runtime, and when the agent shuts down
(sandbox stopped or recreated).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import secrets
import select
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sandbox_agent import process_tree
from sandbox_agent.errors import AgentToolError
from sandbox_agent.process_spool import Ring, decode_run
from sandbox_agent.wire import PROCESS_ID_PATTERN

PROCESS_ID = re.compile(PROCESS_ID_PATTERN)
SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "KILL": signal.SIGKILL, "HUP": signal.SIGHUP}
ENDED_KEPT = 64  # ended processes kept listable per agent; the oldest go (with their spool)
READ_BYTES = 1024 * 1024
PIPE_BYTES = 1024 * 1024  # a larger pipe: fewer wake-ups of the reader for a chatty process
PIPE_GRACE_S = 2.0  # after the leader exits, how long its output is still read
WRITE_TIMEOUT_S = 5.0
COMMAND_SHOWN = 1000
_SPOOL_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

log = logging.getLogger("sandbox_agent")


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def exit_code_of(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # a signal, as a shell reports it


def winsize(cols: int, rows: int) -> bytes:
    return struct.pack("HHHH", rows, cols, 0, 0)


@dataclass
class ManagedProcess:
    process_id: str
    session_id: str
    run_id: str | None
    command: str
    pty: bool
    popen: subprocess.Popen[bytes]
    leader: process_tree.Leader
    ring: Ring
    spool_dir_fd: int
    spool_name: str
    spool_path: str
    input_fd: int | None  # stdin pipe, or the PTY's master
    started_at: str = field(default_factory=_now_iso)
    started_mono: float = field(default_factory=time.monotonic)
    exit_code: int | None = None
    ended_at: str | None = None
    end_reason: str | None = None  # exited | signal | max_runtime | session_deleted | agent_stopped
    exit_announced: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    readers: list[threading.Thread] = field(default_factory=list)
    stop_reading: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)  # exited and output read

    @property
    def running(self) -> bool:
        return not self.finished.is_set()

    def summary(self) -> dict[str, Any]:
        shown = self.command if len(self.command) <= COMMAND_SHOWN else self.command[:COMMAND_SHOWN] + "..."
        return {
            "process_id": self.process_id,
            "command": shown,
            "state": "running" if self.running else "exited",
            "pid": self.popen.pid,
            "pty": self.pty,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "exit_code": self.exit_code if not self.running else None,
            "end_reason": self.end_reason if not self.running else None,
            "cursor": self.ring.total,
            "first_cursor": self.ring.start,
            "spool_file": self.spool_path,
        }


class ProcessTable:
    def __init__(
        self,
        *,
        max_processes: int,
        spool_bytes: int,
        max_runtime_s: float,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.max_processes = max_processes
        self.spool_bytes = spool_bytes
        self.max_runtime_s = max_runtime_s
        self._lock = threading.Lock()
        self._procs: dict[str, ManagedProcess] = {}
        self._on_change = on_change

    # --- reading ----------------------------------------------------------------------------

    def running_count(self) -> int:
        with self._lock:
            return sum(1 for proc in self._procs.values() if proc.running)

    def get(self, session_id: str, process_id: str) -> ManagedProcess:
        """The process if it is this session's; `not_found` otherwise (also for another
        session's or user's id: nothing says whether it exists)."""
        with self._lock:
            proc = self._procs.get(process_id) if PROCESS_ID.fullmatch(process_id) else None
        if proc is None or proc.session_id != session_id:
            raise AgentToolError("not_found", f"There is no process {process_id} in this session.")
        return proc

    def of_session(self, session_id: str) -> list[ManagedProcess]:
        with self._lock:
            return sorted(
                (proc for proc in self._procs.values() if proc.session_id == session_id),
                key=lambda proc: proc.started_mono,
            )

    # --- starting ---------------------------------------------------------------------------

    def start(
        self,
        *,
        command: str,
        session_id: str,
        run_id: str | None,
        spool_dir: tuple[int, str],
        popen: Callable[[dict[str, int], str], subprocess.Popen[bytes]],
        pty: tuple[int, int] | None,
    ) -> ManagedProcess:
        """Start `popen(fds, marker)` (fds: stdin/stdout/stderr to give the child) as a kept
        process; `spool_dir` is (dir fd, path shown), owned by the process once it started
        (the caller closes it when this raises)."""
        dir_fd, dir_path = spool_dir
        with self._lock:
            running = sum(1 for proc in self._procs.values() if proc.running)
            if running >= self.max_processes:
                raise AgentToolError(
                    "too_many_processes",
                    f"{running} processes are running already, the most this sandbox allows "
                    f"({self.max_processes}). Stop one (process_signal) or wait for one to end.",
                    running=running,
                )
            self._evict_ended()
        process_id = f"p-{secrets.token_hex(12)}"
        spool_name = f"process-{process_id}.out"
        try:
            ring_fd = os.open(spool_name, _SPOOL_FLAGS, 0o600, dir_fd=dir_fd)
        except OSError as exc:
            raise AgentToolError("process_failed", f"Could not create the process's output spool: {exc}") from None
        marker = secrets.token_hex(12)
        child_fds: list[int] = []
        ours: list[int] = []  # (stdin writer or master, stdout reader, stderr reader)
        try:
            if pty is not None:
                master, slave = os.openpty()
                fcntl.ioctl(slave, termios.TIOCSWINSZ, winsize(*pty))
                child_fds = [slave]
                ours = [master]
                fds = {"stdin": slave, "stdout": slave, "stderr": slave}
            else:
                in_r, in_w = os.pipe()
                out_r, out_w = os.pipe()
                err_r, err_w = os.pipe()
                child_fds = [in_r, out_w, err_w]
                ours = [in_w, out_r, err_r]
                fds = {"stdin": in_r, "stdout": out_w, "stderr": err_w}
            for fd in ours:
                os.set_inheritable(fd, False)
            for fd in ours[1:]:
                try:
                    fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
                except OSError:
                    pass  # past /proc/sys/fs/pipe-max-size for this uid: the default size
            proc, leader = process_tree.spawn(lambda: popen(fds, marker), marker, kept=True)
        except (OSError, subprocess.SubprocessError) as exc:
            for fd in [*child_fds, *ours, ring_fd]:
                try:
                    os.close(fd)
                except OSError:
                    pass
            try:
                os.unlink(spool_name, dir_fd=dir_fd)
            except OSError:
                pass
            raise AgentToolError("process_failed", f"Could not start the process: {exc}") from None
        for fd in child_fds:
            os.close(fd)
        os.set_blocking(ours[0], False)  # writes have a deadline (a child that never reads)
        managed = ManagedProcess(
            process_id=process_id,
            session_id=session_id,
            run_id=run_id,
            command=command,
            pty=pty is not None,
            popen=proc,
            leader=leader,
            ring=Ring(ring_fd, self.spool_bytes),
            spool_dir_fd=dir_fd,
            spool_name=spool_name,
            spool_path=f"{dir_path.rstrip('/')}/{spool_name}",
            input_fd=ours[0],
        )
        streams = [("pty", ours[0])] if pty is not None else [("stdout", ours[1]), ("stderr", ours[2])]
        for name, fd in streams:
            reader = threading.Thread(target=self._read, args=(managed, name, fd), daemon=True, name=f"proc-read-{name}")
            managed.readers.append(reader)
        with self._lock:
            self._procs[process_id] = managed
        for reader in managed.readers:
            reader.start()
        threading.Thread(target=self._wait, args=(managed,), daemon=True, name="proc-wait").start()
        log.info(
            "process started process=%s pid=%d session=%s run=%s pty=%s",
            process_id, proc.pid, session_id, run_id, managed.pty,
        )  # fmt: skip
        self._on_change()
        return managed

    def _evict_ended(self) -> None:
        ended = sorted((p for p in self._procs.values() if not p.running), key=lambda p: p.started_mono)
        for proc in ended[: max(0, len(ended) - ENDED_KEPT + 1)]:
            del self._procs[proc.process_id]
            self._discard_spool(proc)

    def _discard_spool(self, proc: ManagedProcess) -> None:
        proc.ring.close()
        try:
            os.unlink(proc.spool_name, dir_fd=proc.spool_dir_fd)
        except OSError:
            pass  # the session's directory is gone already
        try:
            os.close(proc.spool_dir_fd)
        except OSError:
            pass

    # --- the threads of one process -------------------------------------------------------

    def _read(self, proc: ManagedProcess, stream: str, fd: int) -> None:
        """Drain one pipe (or the PTY) into the ring until EOF, or until told to stop (a
        descendant that escaped still holding it open)."""
        try:
            while not proc.stop_reading.is_set():
                ready, _, _ = select.select([fd], [], [], 0.25)
                if not ready:
                    continue
                try:
                    data = os.read(fd, READ_BYTES)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    if exc.errno == errno.EIO:  # a PTY whose every slave end closed
                        break
                    raise
                if not data:
                    break
                proc.ring.append(stream, data)
        except (OSError, ValueError):
            pass
        finally:
            if stream != "pty":  # the master is also the input fd: closed by _wait
                os.close(fd)

    def _wait(self, proc: ManagedProcess) -> None:
        deadline = proc.started_mono + self.max_runtime_s
        pid = proc.popen.pid
        try:
            pidfd: int | None = os.pidfd_open(pid)
        except OSError:
            pidfd = None
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._kill(proc, "max_runtime")
                    break
                if pidfd is not None:
                    if select.select([pidfd], [], [], min(left, 3600))[0]:
                        break
                else:
                    try:
                        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
                        break
                    except ChildProcessError:
                        break
        finally:
            if pidfd is not None:
                os.close(pidfd)
        with proc.lock:
            # Not reaped yet: the group id is still this one's, so its members can be told.
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            returncode = proc.popen.wait()
            proc.exit_code = exit_code_of(returncode)
            proc.ended_at = _now_iso()
            if proc.end_reason is None:
                proc.end_reason = "signal" if returncode < 0 else "exited"
        process_tree.disown(proc.leader)
        for reader in proc.readers:
            reader.join(PIPE_GRACE_S)
        proc.stop_reading.set()
        for reader in proc.readers:
            reader.join()
        if proc.input_fd is not None:
            try:
                os.close(proc.input_fd)
            except OSError:
                pass
            proc.input_fd = None
        proc.finished.set()
        proc.ring.close_writer()
        log.info(
            "process exited process=%s pid=%d session=%s exit_code=%s reason=%s output_bytes=%d",
            proc.process_id, pid, proc.session_id, proc.exit_code, proc.end_reason, proc.ring.total,
        )  # fmt: skip
        self._on_change()

    # --- acting on one --------------------------------------------------------------------

    def signal(self, proc: ManagedProcess, name: str) -> bool:
        """Send `name` to the process's whole group; False when it had ended already."""
        number = SIGNALS[name]
        if number == signal.SIGKILL:
            return self._kill(proc, "signal")
        with proc.lock:
            if proc.exit_code is not None:
                return False
            try:
                os.killpg(proc.popen.pid, number)
            except ProcessLookupError:
                return False
        log.info("process signalled process=%s signal=%s session=%s", proc.process_id, name, proc.session_id)
        return True

    def _kill(self, proc: ManagedProcess, reason: str) -> bool:
        """SIGKILL the whole tree (group, session, descendants, marker holders)."""
        with proc.lock:
            if proc.exit_code is not None:
                return False
            proc.end_reason = proc.end_reason or reason
            try:
                os.killpg(proc.popen.pid, signal.SIGKILL)
            except OSError:
                pass
        process_tree.kill_kept(proc.leader)
        log.info("process killed process=%s reason=%s session=%s", proc.process_id, reason, proc.session_id)
        return True

    def write(self, proc: ManagedProcess, data: bytes, close: bool) -> int:
        """Write to its stdin (or the PTY) within a deadline; returns the bytes written."""
        fd = proc.input_fd
        if fd is None or not proc.running:
            raise AgentToolError("process_ended", f"The process {proc.process_id} has ended; it takes no input.")
        written = 0
        deadline = time.monotonic() + WRITE_TIMEOUT_S
        try:
            while written < len(data):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([], [fd], [], left)[1]:
                    break
                try:
                    written += os.write(fd, data[written:])
                except BlockingIOError:
                    continue
        except BrokenPipeError:
            raise AgentToolError("process_ended", f"The process {proc.process_id} closed its input.") from None
        if close and not proc.pty and written == len(data):
            with proc.lock:
                if proc.input_fd is not None:
                    os.close(proc.input_fd)
                    proc.input_fd = None
        return written

    def resize(self, proc: ManagedProcess, cols: int, rows: int) -> None:
        if not proc.pty:
            raise AgentToolError("not_a_terminal", f"The process {proc.process_id} was not started with pty: true.")
        with proc.lock:
            if proc.input_fd is None or proc.exit_code is not None:
                raise AgentToolError("process_ended", f"The process {proc.process_id} has ended.")
            # The kernel tells the terminal's foreground group (SIGWINCH).
            fcntl.ioctl(proc.input_fd, termios.TIOCSWINSZ, winsize(cols, rows))

    # --- lifecycle --------------------------------------------------------------------------

    def kill_session(self, session_id: str, *, wait_s: float = 10.0) -> int:
        """Kill every running process of the session (it is being deleted) and forget them."""
        victims = [proc for proc in self.of_session(session_id) if proc.running]
        for proc in victims:
            self._kill(proc, "session_deleted")
        deadline = time.monotonic() + wait_s
        for proc in victims:
            proc.finished.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            for proc in [p for p in self._procs.values() if p.session_id == session_id and not p.running]:
                del self._procs[proc.process_id]
                self._discard_spool(proc)
        return len(victims)

    def kill_all(self, *, wait_s: float = 3.0) -> None:
        """At agent shutdown: nothing it owns outlives it."""
        with self._lock:
            victims = [proc for proc in self._procs.values() if proc.running]
        for proc in victims:
            self._kill(proc, "agent_stopped")
        deadline = time.monotonic() + wait_s
        for proc in victims:
            proc.finished.wait(max(0.0, deadline - time.monotonic()))


def output_answer(proc: ManagedProcess, since: int, max_bytes: int) -> dict[str, Any]:
    """The answer of `process_output`: ordered chunks after `since`, decoded without splitting
    a character, and the cursor to pass next."""
    finished = not proc.running  # read before the ring: a finish after this still has its bytes
    total = proc.ring.total
    if since > total:
        raise AgentToolError("invalid_arguments", f"since={since} is past the output's end ({total} bytes so far).")
    piece = proc.ring.read(since, max_bytes)
    chunks = []
    replaced = 0
    cursor = piece.start
    for index, chunk in enumerate(piece.chunks):
        last = index == len(piece.chunks) - 1
        # A character split across the end of this read waits for the next one, unless
        # nothing more can come (the process finished and this is its last byte).
        final = not last or (finished and chunk.cursor + len(chunk.data) >= piece.total)
        decoded = decode_run(chunk.data, final=final)
        replaced += decoded.replaced
        if decoded.used:
            chunks.append({"stream": chunk.stream, "cursor": chunk.cursor, "text": decoded.text})
        cursor = chunk.cursor + decoded.used
        if decoded.used < len(chunk.data):
            break
    done = finished and cursor >= piece.total
    answer: dict[str, Any] = {
        "process_id": proc.process_id,
        "chunks": chunks,
        "next": cursor,
        "dropped_bytes": piece.dropped,
        "replaced_bytes": replaced,
        "total_bytes": piece.total,
        "running": not finished,
        "exit_code": proc.exit_code if finished else None,
        "end_reason": proc.end_reason if finished else None,
        "complete": done,
    }
    if piece.dropped:
        answer["note"] = (
            f"{piece.dropped} bytes before cursor {piece.start} were dropped: the process's spool keeps "
            f"only its last {proc.ring.cap} bytes."
        )
    return answer


def announce_exit(proc: ManagedProcess) -> bool:
    """True once per process, the first time an answer shows it ended (the host audits it)."""
    with proc.lock:
        if proc.running or proc.exit_announced:
            return False
        proc.exit_announced = True
        return True
