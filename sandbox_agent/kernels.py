"""Code kernels the agent keeps (docs/interpreter.md): one per (session, language, name), each a
driver process (kernel_driver.py, run with the user's python) that runs an ipykernel or a
bash, speaking JSON lines over pipes.

A kernel's driver is *kept* by process_tree (the leftover sweep after a `shell` call spares it
and its descendants, the kernel included); when a kernel ends — shut down, restarted, idle,
its session deleted, the agent stopping — its whole tree is killed, so nothing it started
outlives it. At most `kernels_max` run at once; one idle for `kernel_idle_s` is shut down.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import IO, Any

from sandbox_agent import process_tree
from sandbox_agent.errors import AgentToolError

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_driver.py")
START_TIMEOUT_S = 60.0
LINE_MAX = 32 * 1024 * 1024  # one event of the driver (a large image travels base64)
STDERR_KEPT = 4096  # the end of a driver's stderr: why it could not start
EOF = {"ev": "eof"}

log = logging.getLogger("sandbox_agent")

KernelKey = tuple[str, str, str]  # (session id, language, name)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def idle_victims(last_used: dict[KernelKey, float], executing: set[KernelKey], now: float, idle_s: float) -> list[KernelKey]:
    """Pure: the kernels to shut down for idleness (never one that is executing)."""
    return [key for key, used in last_used.items() if key not in executing and now - used >= idle_s]


@dataclass
class Kernel:
    key: KernelKey
    popen: subprocess.Popen[bytes]
    leader: process_tree.Leader
    runtime_dir: str
    events: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    started_at: str = field(default_factory=now_iso)
    last_used_at: str = field(default_factory=now_iso)
    last_used_mono: float = field(default_factory=time.monotonic)
    executing: threading.Lock = field(default_factory=threading.Lock)
    stderr_tail: bytearray = field(default_factory=bytearray)
    ended: bool = False

    @property
    def session_id(self) -> str:
        return self.key[0]

    @property
    def language(self) -> str:
        return self.key[1]

    @property
    def name(self) -> str:
        return self.key[2]

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "language": self.language,
            "session_id": self.session_id,
            "started_at": self.started_at,
            "last_used_at": self.last_used_at,
        }

    def send(self, message: dict[str, Any]) -> bool:
        stdin = self.popen.stdin
        if stdin is None:
            return False
        try:
            stdin.write(json.dumps(message).encode() + b"\n")
            stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def touch(self) -> None:
        self.last_used_mono = time.monotonic()
        self.last_used_at = now_iso()


class KernelTable:
    def __init__(self, *, max_kernels: int, idle_s: float) -> None:
        self.max_kernels = max_kernels
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._kernels: dict[KernelKey, Kernel] = {}
        self._starting: set[KernelKey] = set()
        self._reaper: threading.Thread | None = None
        self._closed = threading.Event()

    # --- reading ----------------------------------------------------------------------------

    def count(self) -> int:
        with self._lock:
            return len(self._kernels) + len(self._starting)

    def of_session(self, session_id: str) -> list[Kernel]:
        with self._lock:
            return sorted((k for k in self._kernels.values() if k.session_id == session_id), key=lambda k: k.started_at)

    def get(self, key: KernelKey) -> Kernel | None:
        with self._lock:
            return self._kernels.get(key)

    # --- starting ---------------------------------------------------------------------------

    def obtain(
        self, key: KernelKey, start: Callable[[str, str], tuple[subprocess.Popen[bytes], process_tree.Leader]], tmp_dir: str
    ) -> tuple[Kernel, bool]:
        """The kernel of `key`, started when there is none: (kernel, started now). `start`
        gets (marker, runtime dir) and spawns the driver as a kept process."""
        with self._lock:
            kernel = self._kernels.get(key)
            if kernel is not None and not kernel.ended:
                return kernel, False
            running = len(self._kernels) + len(self._starting)
            if key in self._starting:
                raise AgentToolError("kernel_busy", "This kernel is starting for another call; try again in a moment.")
            if running >= self.max_kernels:
                raise AgentToolError(
                    "too_many_kernels",
                    f"{running} kernels run already, the most this user may have ({self.max_kernels}). "
                    "Shut one down with kernel_shutdown (kernel_list shows them) or wait until an idle one ends.",
                    running=running,
                )
            self._starting.add(key)
        try:
            kernel = self._start(key, start, tmp_dir)
        finally:
            with self._lock:
                self._starting.discard(key)
        with self._lock:
            self._kernels[key] = kernel
            self._ensure_reaper()
        return kernel, True

    def _start(
        self, key: KernelKey, start: Callable[[str, str], tuple[subprocess.Popen[bytes], process_tree.Leader]], tmp_dir: str
    ) -> Kernel:
        try:
            runtime_dir = tempfile.mkdtemp(prefix="kernel-", dir=tmp_dir)
        except OSError as exc:
            raise AgentToolError("kernel_failed", f"Could not make the kernel's private directory: {exc}") from None
        marker = os.urandom(12).hex()
        try:
            popen, leader = start(marker, runtime_dir)
        except FileNotFoundError as exc:
            shutil.rmtree(runtime_dir, ignore_errors=True)
            raise AgentToolError(
                "interpreter_unavailable", f"There is no python to run a kernel with in this sandbox ({exc.filename}).",
                missing="python",
            ) from None  # fmt: skip
        except OSError as exc:
            shutil.rmtree(runtime_dir, ignore_errors=True)
            raise AgentToolError("kernel_failed", f"Could not start the kernel: {exc}") from None
        kernel = Kernel(key=key, popen=popen, leader=leader, runtime_dir=runtime_dir)
        assert popen.stdout is not None and popen.stderr is not None
        threading.Thread(target=_read_events, args=(popen.stdout, kernel.events), daemon=True, name="kernel-read").start()
        threading.Thread(target=_read_stderr, args=(popen.stderr, kernel.stderr_tail), daemon=True, name="kernel-err").start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                event = kernel.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                event = {"ev": "fatal", "message": f"The kernel did not start within {START_TIMEOUT_S:g} s."}
            if event.get("ev") == "ready":
                log.info("kernel started session=%s language=%s name=%s pid=%d", *key, popen.pid)
                return kernel
            if event.get("ev") in ("fatal", "eof"):
                self._end(kernel)
                why = str(event.get("message") or "")[:2000]
                if event is EOF or event.get("ev") == "eof":
                    popen.wait(timeout=5)
                    why = bytes(kernel.stderr_tail).decode("utf-8", "replace").strip()[-2000:] or "it exited at once"
                if event.get("missing") or "No module named" in why:
                    raise AgentToolError(
                        "interpreter_unavailable",
                        f"run_code needs ipykernel in the sandbox's python, which lacks it: {why}",
                        missing=str(event.get("missing") or "ipykernel"),
                    )
                raise AgentToolError("kernel_failed", f"The kernel could not start: {why}")

    def _ensure_reaper(self) -> None:
        if self._reaper is None:
            self._reaper = threading.Thread(target=self._reap_idle, daemon=True, name="kernel-idle")
            self._reaper.start()

    def _reap_idle(self) -> None:
        period = min(max(self.idle_s / 4, 0.05), 30.0)
        while not self._closed.wait(period):
            with self._lock:
                last_used = {key: k.last_used_mono for key, k in self._kernels.items()}
                executing = {key for key, k in self._kernels.items() if k.executing.locked()}
            for key in idle_victims(last_used, executing, time.monotonic(), self.idle_s):
                kernel = self.get(key)
                if kernel is not None and kernel.executing.acquire(blocking=False):
                    try:
                        log.info("kernel idle session=%s language=%s name=%s", *key)
                        self.stop(kernel)
                    finally:
                        kernel.executing.release()

    # --- ending -----------------------------------------------------------------------------

    def stop(self, kernel: Kernel) -> None:
        """End a kernel: its driver is told to go (stdin closed), then its whole tree killed."""
        with self._lock:
            if self._kernels.get(kernel.key) is kernel:
                del self._kernels[kernel.key]
        self._end(kernel)

    def _end(self, kernel: Kernel) -> None:
        if kernel.ended:
            return
        kernel.ended = True
        process_tree.kill_kept(kernel.leader)  # driver, kernel and everything they started
        try:
            kernel.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        process_tree.disown(kernel.leader)
        for stream in (kernel.popen.stdin,):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        shutil.rmtree(kernel.runtime_dir, ignore_errors=True)
        log.info("kernel ended session=%s language=%s name=%s", *kernel.key)

    def kill_session(self, session_id: str) -> int:
        victims = self.of_session(session_id)
        for kernel in victims:
            self.stop(kernel)
        return len(victims)

    def kill_all(self) -> None:
        self._closed.set()
        with self._lock:
            victims = list(self._kernels.values())
        for kernel in victims:
            self.stop(kernel)


def _read_events(stream: IO[bytes], events: queue.Queue[dict[str, Any]]) -> None:
    """The driver's protocol lines as events; an over-long or malformed line is dropped."""
    try:
        while True:
            line = stream.readline(LINE_MAX)
            if not line:
                break
            if not line.endswith(b"\n"):  # longer than LINE_MAX: skip to its end
                while line and not line.endswith(b"\n"):
                    line = stream.readline(LINE_MAX)
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and isinstance(event.get("ev"), str):
                events.put(event)
    except (OSError, ValueError):
        pass
    finally:
        events.put(EOF)
        try:
            stream.close()
        except OSError:
            pass


def _read_stderr(stream: IO[bytes], tail: bytearray) -> None:
    try:
        for chunk in iter(lambda: stream.read1(65536), b""):  # type: ignore[attr-defined]
            tail.extend(chunk)
            del tail[: max(0, len(tail) - STDERR_KEPT)]
    except (OSError, ValueError):
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass
