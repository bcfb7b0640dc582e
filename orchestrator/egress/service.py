"""The egress proxy as the orchestrator runs it: one asyncio loop in a thread of its own (so
a user's flood of connections never queues behind, or in front of, the HTTP API's loop), one
listening Unix socket per user in that user's socket directory, and the audit trail.

The runtime user of a connection is the listener it arrived on, and the peer must be that
user's sandbox (its uid, SO_PEERCRED; or under gVisor its container: `sandbox_agent.peer`), so
nothing a sandbox sends decides whose policy applies.

A listener is made when the user's sandbox is first called (the router's call hook) and made
again when its socket was removed or replaced (the socket directory is the sandbox's own).
Binding never resolves a path in that directory as root: the socket is bound in a root-only
staging directory and renamed into place on directory fds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import secrets
import socket
import stat
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from mounts.fs.nofollow import closing_fd, open_dir_at, open_root
from mounts.fs.tree_removal import remove_tree_at
from mounts.layout import EGRESS_SOCKET_FILE, EGRESS_STAGING_DIR, DataLayout
from orchestrator import audit, metrics
from orchestrator.descriptors.budget import EGRESS_PENDING_COST, DescriptorBudget, DescriptorHold, DescriptorsRefused, Feature
from orchestrator.credentials.injection import CredentialInjection
from orchestrator.egress.audit_budget import AuditBudget
from orchestrator.egress.caps import CapLimits, LookupGate, UserCaps
from orchestrator.egress.policy import parse_patterns, split_allow_setting
from orchestrator.egress.proxy import ConnectionRecord, EgressProxy, ProxyTimeouts, serve_unix
from orchestrator.egress.proxy import throttled as proxy_log
from orchestrator.egress.resolver import AresResolver, parse_dns_servers
from orchestrator.egress.rules import EgressRules
from orchestrator.clock import now_iso
from orchestrator.log import kv
from orchestrator.throttled_log import IntervalCounter, budget_loop_accept_errors
from orchestrator.settings import EgressSettings
from orchestrator.state_store import StateStore
from orchestrator.users.dirs import UserDirectories
from sandbox_agent.peer import ExpectedPeer, check_socket_peer, peer_credentials
from sandbox_agent.wire import CallContext

log = logging.getLogger(__name__)

HEAD_MAX_BYTES = 16 * 1024
RECHECK_S = 2.0  # how often a call re-checks that the user's socket is still ours
AUDIT_BACKLOG = 10_000
UNADMITTED_EXTRA = 256  # sockets a user may hold beyond its connection cap (heads on their way)
REFUSALS_INTERVAL_S = 60.0  # connections closed at once: one audit row and log line per user per minute


@dataclass
class _Listener:
    task: asyncio.Future[None]
    dev_ino: tuple[int, int]
    checked_at: float


class EgressService:
    def __init__(
        self,
        settings: EgressSettings,
        directories: UserDirectories,
        store: StateStore,
        descriptors: DescriptorBudget,
        *,
        peer_container: Callable[[int], str | None] = lambda user_id: None,
        credentials: CredentialInjection | None = None,
    ) -> None:
        self.settings = settings
        self.descriptors = descriptors
        # The user's gVisor container, whose gofer (uid 0) connects for its sandbox (docker.py).
        self.peer_container = peer_container
        self.layout: DataLayout = directories.layout
        self.directories = directories
        self.store = store
        self.rules = EgressRules(store, parse_patterns(split_allow_setting(settings.allow)))
        self.limits = CapLimits(
            max_connections=settings.max_connections,
            bytes_per_connection=settings.max_bytes_per_connection,
            bytes_per_day=settings.max_bytes_per_day,
        )
        self._caps: dict[int, UserCaps] = {}  # the loop's alone
        self._held: dict[int, int] = {}  # the loop's alone: the user's sockets being served
        self._refusals = IntervalCounter(REFUSALS_INTERVAL_S)  # the loop's alone
        self._context: dict[int, tuple[str | None, str | None]] = {}
        self._listeners: dict[int, _Listener] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._audit_budget = AuditBudget()  # the loop's alone
        self._audit_queue: queue.Queue[ConnectionRecord | dict[str, object] | None] = queue.Queue(AUDIT_BACKLOG)
        self._audit_thread: threading.Thread | None = None
        self._dropped = 0
        self._resolver = AresResolver(parse_dns_servers(settings.dns_servers), timeout_s=settings.dns_timeout_s)
        self.lookups = LookupGate(per_user=settings.dns_lookups_per_user, total=settings.dns_lookups)
        self.proxy = EgressProxy(
            allow_for=self.rules.allow_for,
            caps_for=self._caps_of,
            report=self._report,
            allow_loopback=settings.allow_loopback,
            timeouts=ProxyTimeouts(connect_s=settings.connect_timeout_s, resolve_s=settings.dns_timeout_s),
            resolver=self._resolver,
            lookups=self.lookups,
            head_max_bytes=HEAD_MAX_BYTES,
            credentials=credentials,
        )
        self.credentials = credentials
        if credentials is not None:  # a revocation or deletion ends the connections using it
            credentials.store.cut_listeners.append(self._cut)

    # --- the loop -------------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                budget_loop_accept_errors(loop, proxy_log)
                loop.call_soon(ready.set)
                loop.run_forever()

            self._thread = threading.Thread(target=run, name="egress-proxy", daemon=True)
            self._thread.start()
            ready.wait(10)
            self._audit_thread = threading.Thread(target=self._write_audit, name="egress-audit", daemon=True)
            self._audit_thread.start()
            self._loop = loop
        return self._loop

    def _cut(self, predicate: Callable[[str | None, int, str], bool]) -> None:
        loop = self._loop
        if loop is not None:
            asyncio.run_coroutine_threadsafe(self._cut_on_loop(predicate), loop).result(5)

    async def _cut_on_loop(self, predicate: Callable[[str | None, int, str], bool]) -> None:
        self.proxy.cut(predicate)

    def _caps_of(self, user_id: int) -> UserCaps:
        caps = self._caps.get(user_id)
        if caps is None:
            caps = self._caps[user_id] = UserCaps(self.limits)
        return caps

    # --- listeners ------------------------------------------------------------------------

    def before_call(self, user_id: int, context: CallContext | None) -> None:
        """The router's hook before each sandbox call: remember what the call is for (the
        audit names it) and make sure the user's listener is there. Warm: a dict lookup."""
        if context is not None:
            self._context[user_id] = (context.session_id, context.run_id)
        listener = self._listeners.get(user_id)
        now = time.monotonic()
        if listener is not None and now - listener.checked_at < RECHECK_S:
            return
        with self._lock:
            listener = self._listeners.get(user_id)
            if listener is not None and self._still_ours(user_id, listener):
                listener.checked_at = now
                return
            try:
                self._listen(user_id, replacing=listener)
            except Exception as exc:  # the call itself can still run; only its way out is missing
                log.error("egress listener not made %s", kv(user=user_id, error=exc))

    def _still_ours(self, user_id: int, listener: _Listener) -> bool:
        # sockets/ is root's, so sockets/{uid} cannot be a link; lstat does not follow the last.
        try:
            st = os.lstat(self.layout.egress_socket_path(user_id))
        except OSError:
            return False
        return stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == listener.dev_ino

    def _listen(self, user_id: int, *, replacing: _Listener | None) -> None:
        loop = self._ensure_loop()
        expected_uid = self.directories.sandbox_uid(user_id) if self.directories.chown else os.geteuid()
        sock, dev_ino = self._bind(user_id, expected_uid)

        async def start() -> asyncio.Future[None]:
            if replacing is not None:
                replacing.task.cancel()
            return asyncio.ensure_future(serve_unix(sock, lambda conn: self._admit(user_id, expected_uid, conn)))

        task = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
        self._listeners[user_id] = _Listener(task, dev_ino, time.monotonic())
        log.info("egress listener up %s", kv(user=user_id, socket=self.layout.egress_socket_path(user_id)))

    def _bind(self, user_id: int, owner: int) -> tuple[socket.socket, tuple[int, int]]:
        self.directories.ensure_socket_dir(user_id)
        name = f"{user_id}-{secrets.token_hex(6)}.sock"
        with closing_fd(open_root(self.layout.root)) as root_fd:
            sockets_fd = open_dir_at(root_fd, self.layout.sockets_root.name)
            assert sockets_fd is not None  # ensure_socket_dir made it
            with closing_fd(sockets_fd):
                staging_fd = open_dir_at(sockets_fd, EGRESS_STAGING_DIR, create=True)
                assert staging_fd is not None
                with closing_fd(staging_fd):
                    st = os.fstat(staging_fd)
                    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
                        os.fchmod(staging_fd, 0o700)
                    user_fd = open_dir_at(sockets_fd, str(user_id))
                    if user_fd is None:
                        raise FileNotFoundError(self.layout.socket_dir(user_id))
                    with closing_fd(user_fd):
                        if os.fstat(user_fd).st_dev != st.st_dev:
                            # The socket directory is a filesystem of its own (a bounded tmpfs
                            # with disk quotas): no rename reaches it from the staging directory.
                            return self._bind_directly(user_fd, owner)
                        return self._bind_in(staging_fd, user_fd, name)

    @staticmethod
    def _bind_directly(user_fd: int, owner: int) -> tuple[socket.socket, tuple[int, int]]:
        """Bind at the name in the sandbox's directory itself, through its directory fd: bind(2)
        never follows a link at the name (it is EADDRINUSE), and the owner is set without
        following one either (the mode is the umask's: the owner may connect)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            remove_tree_at(user_fd, EGRESS_SOCKET_FILE)  # whatever was there: never followed
            sock.bind(f"/proc/self/fd/{user_fd}/{EGRESS_SOCKET_FILE}")
            os.chown(EGRESS_SOCKET_FILE, owner, owner, dir_fd=user_fd, follow_symlinks=False)
            sock.listen(512)
            st = os.stat(EGRESS_SOCKET_FILE, dir_fd=user_fd, follow_symlinks=False)
        except BaseException:
            sock.close()
            raise
        sock.setblocking(False)
        return sock, (st.st_dev, st.st_ino)

    @staticmethod
    def _bind_in(staging_fd: int, user_fd: int, name: str) -> tuple[socket.socket, tuple[int, int]]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Through the directory fd: no path in the sandbox's directory is resolved, and the
            # data dir's depth cannot push the address past the 108 bytes a socket name has.
            sock.bind(f"/proc/self/fd/{staging_fd}/{name}")
            os.chmod(name, 0o666, dir_fd=staging_fd)  # a root-only dir: nothing to follow here
            sock.listen(512)
            st = os.stat(name, dir_fd=staging_fd, follow_symlinks=False)
            try:
                os.rename(name, EGRESS_SOCKET_FILE, src_dir_fd=staging_fd, dst_dir_fd=user_fd)
            except OSError:
                # The sandbox put a directory (or the like) at the name: remove it, never follow.
                remove_tree_at(user_fd, EGRESS_SOCKET_FILE)
                os.rename(name, EGRESS_SOCKET_FILE, src_dir_fd=staging_fd, dst_dir_fd=user_fd)
        except BaseException:
            sock.close()
            try:
                os.unlink(name, dir_fd=staging_fd)
            except OSError:
                pass
            raise
        sock.setblocking(False)
        return sock, (st.st_dev, st.st_ino)

    def _admit(self, user_id: int, expected_uid: int, conn: socket.socket) -> Coroutine[Any, Any, None] | None:
        """The work for a connection just accepted, or None after closing it at once: past the
        user's socket cap or its share of the server's descriptors. Every socket counts, not
        only admitted ones: connections that never send a head would otherwise hold the host's
        descriptors for their head timeout each."""
        held = self._held.get(user_id, 0)
        if held >= self.limits.max_connections + UNADMITTED_EXTRA:
            conn.close()
            self._refused(user_id, "too_many_sockets", f"the sandbox holds {held} egress sockets, its cap")
            return None
        try:
            hold = self.descriptors.try_acquire(user_id, Feature.EGRESS, EGRESS_PENDING_COST)
        except DescriptorsRefused as refusal:
            conn.close()
            self._refused(user_id, refusal.code, refusal.message)
            return None
        self._held[user_id] = held + 1
        return self._on_connection(user_id, expected_uid, conn, hold)

    def _refused(self, user_id: int, code: str, message: str) -> None:
        """Connections closed at once: told once per user, code and interval, with their count."""
        count = self._refusals.note((user_id, code))
        if not count:
            return
        log.warning("egress connections closed at once %s", kv(user=user_id, code=code, count=count, why=message))
        self._enqueue({"action": "egress_refused", "user_id": user_id, "code": code, "count": count})

    async def _on_connection(self, user_id: int, expected_uid: int, conn: socket.socket, hold: DescriptorHold) -> None:
        try:
            await self._serve_connection(user_id, expected_uid, conn, hold)
        finally:
            hold.release()
            self._held[user_id] -= 1

    async def _serve_connection(self, user_id: int, expected_uid: int, conn: socket.socket, hold: DescriptorHold) -> None:
        expected = ExpectedPeer(uid=expected_uid, container_id=self.peer_container(user_id))
        if check_socket_peer(conn, expected) is not None:
            try:
                peer_uid = peer_credentials(conn).uid
            except OSError:
                peer_uid = -1
            # Not this user's sandbox (only root and the uid itself can enter the directory).
            # Reported before the close: whoever sees the close finds the row on its way.
            self._report(
                ConnectionRecord(user_id=user_id, session_id=None, run_id=None, method="?", host="", port=0,
                                 address=None, verdict="peer_refused", reason=f"peer_uid_{peer_uid}",
                                 bytes_up=0, bytes_down=0, duration_ms=0)
            )  # fmt: skip
            conn.close()
            return
        await self.proxy.handle(user_id, conn, context=self._context.get(user_id, (None, None)), descriptors=hold)

    # --- audit ----------------------------------------------------------------------------

    def _report(self, record: ConnectionRecord) -> None:
        metrics.observe_egress(record.verdict, record.bytes_up, record.bytes_down)  # every one: counters cost no disk
        used = None if record.credential is None else f"credential={record.credential_owner}/{record.credential} grant={record.grant_id}"
        admission = self._audit_budget.admit(record.user_id, record.verdict, time.monotonic(), used)
        if admission.suppressed_before:
            self._enqueue(
                {"action": "egress_audit_suppressed", "user_id": record.user_id, "suppressed": admission.suppressed_before}
            )
        if not admission.write:
            if admission.first_suppressed:
                log.warning(
                    "egress audit budget spent: further connections this minute are counted, not written %s",
                    kv(user=record.user_id, rows=self._audit_budget.rows_per_window),
                )
            return
        level = logging.INFO if record.verdict == "allowed" else logging.WARNING
        log.log(
            level,
            "egress connection %s",
            kv(user=record.user_id, session=record.session_id, run=record.run_id, method=record.method,
               host=record.host, port=record.port, address=record.address, verdict=record.verdict,
               reason=record.reason, bytes_up=record.bytes_up, bytes_down=record.bytes_down,
               ms=record.duration_ms, credential=record.credential, grant=record.grant_id),
        )  # fmt: skip
        self._enqueue(record)

    def _enqueue(self, row: ConnectionRecord | dict[str, object]) -> None:
        try:
            self._audit_queue.put_nowait(row)
        except queue.Full:
            self._dropped += 1
            if self._dropped % 1000 == 1:
                log.error("egress audit backlog full; rows dropped %s", kv(dropped=self._dropped))

    def _write_audit(self) -> None:
        while True:
            record = self._audit_queue.get()
            if record is None:
                self._audit_queue.task_done()
                return
            try:
                with self.store.write() as tx:
                    if isinstance(record, dict):  # a summary: connections left out or closed at once
                        detail = dict(record)
                        action, user_id = str(detail.pop("action")), int(detail.pop("user_id"))  # type: ignore[call-overload]
                        audit.record(tx, actor=f"sandbox:{user_id}", action=action, runtime_user_id=user_id, **detail)
                        continue
                    audit.record(
                        tx, actor=f"sandbox:{record.user_id}", action="egress_connection",
                        session_id=record.session_id, runtime_user_id=record.user_id,
                        run_id=record.run_id, method=record.method, host=record.host, port=record.port,
                        address=record.address, verdict=record.verdict, reason=record.reason,
                        bytes_up=record.bytes_up, bytes_down=record.bytes_down, duration_ms=record.duration_ms,
                    )  # fmt: skip
                    if record.credential is not None:  # names the credential, never its value
                        audit.record(
                            tx, actor=f"sandbox:{record.user_id}", action="credential_used",
                            session_id=record.session_id, owner_user_id=record.credential_owner,
                            runtime_user_id=record.user_id, run_id=record.run_id, credential=record.credential,
                            grant_id=record.grant_id, host=record.host, port=record.port, verdict=record.verdict,
                            reason=record.reason, bytes_up=record.bytes_up, bytes_down=record.bytes_down,
                        )  # fmt: skip
                if record.credential is not None and record.credential_owner is not None and self.credentials is not None:
                    self.credentials.store.note_used(record.credential_owner, record.credential, now_iso())
            except Exception:  # a full disk must not stop the writer: the log line stays
                log.exception("egress audit row not written %s", kv(user=getattr(record, "user_id", None)))
            finally:
                self._audit_queue.task_done()

    def flush_audit(self, timeout_s: float = 5.0) -> None:
        """Wait until the rows reported so far are written (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while self._audit_queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    # --- status and shutdown --------------------------------------------------------------

    def status(self) -> dict[str, object]:
        return {"mode": self.settings.mode, "listeners": len(self._listeners), "allow_default": [str(p) for p in self.rules.defaults]}

    def close(self) -> None:
        loop = self._loop
        if loop is None:
            self._resolver.close()
            return
        listeners, self._listeners = dict(self._listeners), {}

        async def stop() -> None:
            for listener in listeners.values():
                listener.task.cancel()

        try:
            asyncio.run_coroutine_threadsafe(stop(), loop).result(5)
        except Exception:
            pass
        for user_id, listener in listeners.items():
            if self._still_ours(user_id, listener):
                try:
                    os.unlink(self.layout.egress_socket_path(user_id))
                except OSError:
                    pass
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        self._resolver.close()
        self._audit_queue.put(None)
        if self._audit_thread is not None:
            self._audit_thread.join(5)
        self._loop = None
