"""Preview URLs as the orchestrator runs them (docs/previews.md): links made, read and revoked
(the `expose_port` tool and `/v1/runs/{run_id}/previews`), and the listener that serves them,
on an address and an event loop of its own (`ORCH_PREVIEW_LISTEN`): never the API's origin,
and a visitor's flood never queues behind, or in front of, the API's requests.

Each link's make and revoke is audited with the request; each visitor connection's end (user,
port, bytes, duration, outcome) by a writer thread of its own, so no SQLite write runs on the
relay's loop."""

from __future__ import annotations

import asyncio
import logging
import queue
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from urllib.parse import urlsplit

from orchestrator import audit, metrics
from orchestrator.descriptors.budget import DescriptorBudget
from orchestrator.errors import NotFound, RunEnded
from orchestrator.log import kv
from orchestrator.previews.access import AccessCookie, load_or_create_key
from orchestrator.previews.model import PreviewRecord, check_port, expiry, host_suffix, preview_url
from orchestrator.previews.relay import ConnectionRecord, PreviewLimits, PreviewRelay
from orchestrator.previews.store import PreviewStore
from orchestrator.runs.records import RunRecord, RunStatus
from orchestrator.sandboxes.base import LiveAgent
from orchestrator.sandboxes.router import SandboxRouter
from orchestrator.settings import PreviewSettings
from orchestrator.state_store import StateStore
from orchestrator.throttled_log import budget_loop_accept_errors, ThrottledLog

log = logging.getLogger(__name__)

AUDIT_BACKLOG = 10_000
ACCESS_KEY_FILE = "preview-access.key"  # in the state dir: the access cookie's signing key
START_THREADS = 8  # sandboxes started or resumed for visitors at once


def listen_address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


class PreviewService:
    def __init__(self, settings: PreviewSettings, store: StateStore, router: SandboxRouter, descriptors: DescriptorBudget) -> None:
        self.settings = settings
        self._store = store
        self.records = PreviewStore(store)
        self._router = router
        host, port = listen_address(settings.listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listening = socket.socket(family, socket.SOCK_STREAM)
        self._listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listening.bind((host, port))
        self._listening.listen(1024)
        bound = self._listening.getsockname()
        self.address = f"[{bound[0]}]:{bound[1]}" if family == socket.AF_INET6 else f"{bound[0]}:{bound[1]}"
        self.base_url = (settings.base_url or f"http://{self.address}").rstrip("/")
        self._starts = ThreadPoolExecutor(START_THREADS, thread_name_prefix="preview-start")
        self.relay = PreviewRelay(
            lookup=self.records.by_token,
            agent_for=self._agent_for,
            forget=lambda user_id, agent: router.backend_for(user_id).forget(user_id, agent=agent),
            descriptors=descriptors,
            limits=PreviewLimits(
                head_timeout_s=settings.head_timeout_s,
                idle_timeout_s=settings.idle_timeout_s,
                bytes_per_day=settings.max_bytes_per_day,
                scheme=urlsplit(self.base_url).scheme or "http",
                host_suffix=host_suffix(self.base_url),
                access=(
                    None if settings.cookie_link_s is None else AccessCookie(
                        key=load_or_create_key(settings.layout.state_dir / ACCESS_KEY_FILE),
                        link_s=settings.cookie_link_s, secure=urlsplit(self.base_url).scheme == "https",
                    )
                ),
            ),
            report=self._report,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._audit: queue.Queue[ConnectionRecord | None] = queue.Queue(AUDIT_BACKLOG)
        self._threads: list[threading.Thread] = []

    # --- links ----------------------------------------------------------------------------

    def create(self, run: RunRecord, port: int, ttl_s: int | None, *, actor: str) -> PreviewRecord:
        """A preview of `port` in the sandbox of the run's runtime user."""
        check_port(port)
        if run.status is not RunStatus.RUNNING:
            raise RunEnded(f"run {run.run_id} has ended ({run.status.value}): no preview is made for it")
        now = datetime.now(timezone.utc)
        expires = expiry(now, ttl_s, default_s=self.settings.ttl_s, max_s=self.settings.ttl_max_s)
        with self._store.write() as tx:
            record = self.records.create(
                tx, user_id=run.runtime_user_id, run_id=run.run_id, session_id=run.session_id, port=port,
                now=now, expires=expires,
            )  # fmt: skip
            audit.record(
                tx, actor=actor, action="preview_created", session_id=run.session_id, owner_user_id=run.owner_user_id,
                runtime_user_id=run.runtime_user_id, preview_id=record.preview_id, port=port, run_id=run.run_id,
                expires_at=record.expires_at,
            )  # fmt: skip
        metrics.PREVIEW_LINKS.labels("created").inc()
        log.info("preview created %s", kv(preview=record.preview_id, runtime_user=run.runtime_user_id, port=port))
        return record

    def get(self, preview_id: str) -> PreviewRecord:
        record = self.records.get(preview_id)
        if record is None or not record.live(datetime.now(timezone.utc)):
            raise NotFound(f"preview {preview_id} not found")
        return record

    def of_run(self, run_id: str) -> list[PreviewRecord]:
        """The run's live previews, oldest first."""
        return self.records.live_for_run(run_id, datetime.now(timezone.utc))

    def link(self, record: PreviewRecord) -> str:
        """The URL handed out for the preview: with the access cookie on, it carries a fresh key
        good for ORCH_PREVIEW_COOKIE_LINK_S (orchestrator/previews/access.py)."""
        url = self.url(record)
        access = self.relay.limits.access
        return url if access is None else access.link(url, record, datetime.now(timezone.utc))

    def revoke(self, preview_id: str, *, actor: str) -> None:
        """The link answers 404 from now on, and its open connections are cut."""
        record = self.get(preview_id)
        with self._store.write() as tx:
            if not self.records.delete(tx, preview_id):
                raise NotFound(f"preview {preview_id} not found")
            audit.record(
                tx, actor=actor, action="preview_revoked", session_id=record.session_id,
                runtime_user_id=record.user_id, preview_id=preview_id, port=record.port,
            )  # fmt: skip
        metrics.PREVIEW_LINKS.labels("revoked").inc()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.relay.cut, preview_id)

    def revoke_all_of_user(self, user_id: int, *, actor: str) -> int:
        """End every preview of a user (a purge): each answers 404 and its connections are cut;
        returns how many there were."""
        ended = 0
        for preview_id in self.records.ids_of_user(user_id):
            with self._store.write() as tx:
                if not self.records.delete(tx, preview_id):
                    continue
                audit.record(tx, actor=actor, action="preview_revoked", runtime_user_id=user_id, preview_id=preview_id)
            ended += 1
            metrics.PREVIEW_LINKS.labels("revoked").inc()
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self.relay.cut, preview_id)
        return ended

    def url(self, record: PreviewRecord) -> str:
        return preview_url(self.base_url, record.token)

    # --- the listener ---------------------------------------------------------------------

    async def _agent_for(self, user_id: int) -> LiveAgent:
        warm = self._router.warm_agent(user_id)
        if warm is not None:
            return warm
        return await asyncio.get_running_loop().run_in_executor(self._starts, self._router.live_agent, user_id)

    def start(self) -> None:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            budget_loop_accept_errors(loop, ThrottledLog(log))
            loop.call_soon(ready.set)
            serving = loop.create_task(self.relay.serve(self._listening))
            try:
                loop.run_until_complete(serving)
            except asyncio.CancelledError:
                pass

        thread = threading.Thread(target=run, name="preview-listener", daemon=True)
        thread.start()
        ready.wait(10)
        self._loop = loop
        writer = threading.Thread(target=self._write_audit, name="preview-audit", daemon=True)
        writer.start()
        self._threads = [thread, writer]
        log.info("preview listener %s", kv(address=self.address, base_url=self.base_url))

    def _report(self, record: ConnectionRecord) -> None:
        metrics.observe_preview(record.outcome, record.bytes_up, record.bytes_down)
        try:
            self._audit.put_nowait(record)
        except queue.Full:
            log.warning("preview audit backlog full: a row is dropped %s", kv(preview=record.preview_id))

    def _write_audit(self) -> None:
        while (record := self._audit.get()) is not None:
            try:
                with self._store.write() as tx:
                    audit.record(
                        tx, actor="preview", action="preview_connection", runtime_user_id=record.user_id,
                        preview_id=record.preview_id, port=record.port, outcome=record.outcome,
                        bytes_up=record.bytes_up, bytes_down=record.bytes_down, duration_s=record.duration_s,
                    )  # fmt: skip
            except Exception:
                log.exception("preview audit row not written")
            finally:
                self._audit.task_done()

    def flush_audit(self) -> None:
        """Until every ended connection so far has its row (tests, shutdown)."""
        self._audit.join()

    def close(self) -> None:
        if self._loop is not None:  # the accept loop and every relay end
            loop = self._loop
            loop.call_soon_threadsafe(lambda: [task.cancel() for task in asyncio.all_tasks(loop)])
        self._audit.put(None)
        for thread in self._threads:
            thread.join(timeout=5)
        self._listening.close()
        self._starts.shutdown(wait=False, cancel_futures=True)
