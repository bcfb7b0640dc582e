"""The orchestrator's lease on its docker sandboxes: what their dead-man switch rests on.

Each sandbox's supervisor (PID 1 of the container, sandbox_agent/supervisor.py) ends the
container once its lease has expired. The lease is an expiry time in `agent-secrets/{uid}/lease`,
which only root writes and the sandbox can only read, so no process of the sandbox can extend
it; calls to the agent do not either. The orchestrator writes it before every start and renews
it for every sandbox it manages, from a thread of its own, as long as it lives: when it is gone,
each sandbox ends within the dead-man limit (ORCH_IDLE_TIMEOUT_S + ORCH_DEAD_MAN_MARGIN_S).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from mounts.fs.nofollow import UnsafePath, closing_fd
from mounts.layout import LEASE_FILE
from orchestrator.log import kv
from orchestrator.sandboxes.agent_launch import write_private_file
from orchestrator.users.dirs import UnsafeDirectory, UserDirectories
from sandbox_agent.supervisor import dead_man_check_s, lease_text

log = logging.getLogger(__name__)


def renew_every_s(limit_s: float) -> float:
    """Pure: how often the lease is renewed, a quarter of its length within [0.1, 30] s, so a
    late round or two never lets a managed sandbox's lease run out."""
    return min(max(limit_s / 4, 0.1), 30.0)


def write_lease(directories: UserDirectories, user_id: int, *, limit_s: float, now: float | None = None) -> None:
    """The user's lease, valid `limit_s` from `now` (wall clock: the container reads the same
    clock), written atomically (root-owned, readable by the sandbox's group)."""
    expires_at = (time.time() if now is None else now) + limit_s
    group = directories.sandbox_uid(user_id) if directories.chown else None
    with closing_fd(directories.open_agent_secrets_dir(user_id, create=True)) as dir_fd:
        write_private_file(dir_fd, LEASE_FILE, lease_text(expires_at, dead_man_check_s(limit_s)), group=group)


class LeaseRenewer:
    """A daemon thread renewing the leases of `managed()` users every `renew_every_s(limit_s)`
    until `close()`; the first round runs at `start()`."""

    def __init__(self, directories: UserDirectories, limit_s: float, managed: Callable[[], Iterable[int]]) -> None:
        self._directories = directories
        self._limit_s = limit_s
        self._managed = managed
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def renew(self, user_id: int) -> None:
        try:
            write_lease(self._directories, user_id, limit_s=self._limit_s)
        except (OSError, UnsafeDirectory, UnsafePath) as exc:  # that sandbox ends at its expiry: fail closed
            log.error("renewing a sandbox lease failed %s", kv(user=user_id, error=exc))

    def renew_all(self) -> None:
        for user_id in list(self._managed()):
            self.renew(user_id)

    def start(self) -> None:
        with self._lock:
            if self._thread is not None or self._closed.is_set():
                return
            self._thread = threading.Thread(target=self._run, name="sandbox-leases", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        every = renew_every_s(self._limit_s)
        while not self._closed.is_set():
            self.renew_all()
            self._closed.wait(every)

    def close(self) -> None:
        """Stop renewing: the sandboxes' leases run out by themselves."""
        self._closed.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout=5)
