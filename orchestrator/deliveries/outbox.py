"""Outgoing deliveries: what `send_file` / `send_image` hand to the chat bot.

A delivery is a row in the state store plus its bytes in `{data}/outbox/{delivery_id}` (`DataLayout.outbox_file`)
(host only: no sandbox mounts it). The bot fetches the bytes with `GET /v1/deliveries/{id}`,
may delete the delivery once it has posted it, and otherwise it expires after
`ORCH_DELIVERY_TTL_S`: a periodic sweep removes expired rows and their files. Deleting a session
removes its deliveries. The bytes are written (temp file, fsync, rename) before the row is
inserted, and the row is deleted before the file, so a crash leaves at most an orphan file,
which the sweep removes too.

Every delivery's bytes are charged to the user whose sandbox produced them
(`orchestrator/quotas/host_copies.py`): while they stream in as a transfer, then as a
delivery until its row is deleted; a send past the user's budget is refused mid-stream.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from mounts import ids
from mounts.layout import DataLayout
from orchestrator.errors import Gone, NotFound
from orchestrator.log import kv
from orchestrator.quotas.host_copies import ChargedWrites, HostCopies
from mounts.fs.atomic_write import replace_file_at
from mounts.fs.spool import FileSpool, spool_at
from mounts.fs.nofollow import UnsafePath, closing_fd, open_below, open_regular_at, remove_file_at
from orchestrator.sessions.cleanup import DeletedSession
from orchestrator.state_store import StateStore

log = logging.getLogger(__name__)

# An outbox file without a row is left this long (a delivery being created has a file but no
# row yet) before the sweep removes it.
ORPHAN_GRACE_S = 3600.0


@dataclass(frozen=True)
class Delivery:
    delivery_id: str
    run_id: str
    session_id: str
    runtime_user_id: int
    tool: str  # send_file | send_image
    kind: str  # file | image
    file_name: str
    media_type: str
    size: int
    sha256: str
    source: str  # the path or URL the model gave
    created_at: str
    expires_at: str
    fetched_at: str | None

    @property
    def fetch_path(self) -> str:
        return f"/v1/deliveries/{self.delivery_id}"


@dataclass(frozen=True)
class NewDelivery:
    run_id: str
    session_id: str
    runtime_user_id: int
    tool: str
    kind: str
    file_name: str
    media_type: str
    source: str
    data: bytes


# The spool of one delivery's bytes (`DeliveryStore.spool`): written in pieces to a hidden
# temp file of the outbox as they arrive from the sandbox, hashed and counted as they come.
DeliverySpool = FileSpool


def _delivery(row: sqlite3.Row) -> Delivery:
    return Delivery(**{key: row[key] for key in row.keys()})


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")


def valid_delivery_id(value: str) -> bool:
    return len(value) == 27 and value.startswith("dl-") and all(c in "0123456789abcdef" for c in value[3:])


class DeliveryStore:
    def __init__(self, store: StateStore, layout: DataLayout, *, ttl_s: float, copies: HostCopies) -> None:
        self._store = store
        self._layout = layout
        self.ttl_s = ttl_s
        self._copies = copies

    def charged_usage(self) -> dict[tuple[int, str], int]:
        """What the deliveries on disk take, per user: the counters' start (one query)."""
        with self._store.read() as tx:
            rows = tx.all("SELECT runtime_user_id, SUM(size) AS bytes FROM deliveries GROUP BY runtime_user_id")
        return {(row["runtime_user_id"], "deliveries"): row["bytes"] or 0 for row in rows}

    def next_expiry(self, runtime_user_id: int) -> str | None:
        """When the user's oldest delivery expires (None: it has none); for a refusal's words."""
        with self._store.read() as tx:
            row = tx.one("SELECT MIN(expires_at) AS at FROM deliveries WHERE runtime_user_id = ?", (runtime_user_id,))
        return row["at"] if row is not None else None

    def _outbox_fd(self) -> int:
        fd = open_below(self._layout.root, self._layout.outbox_root.relative_to(self._layout.root).parts, create=True)
        assert fd is not None
        return fd

    @contextmanager
    def spool(self, head_bytes: int, runtime_user_id: int) -> Iterator[DeliverySpool]:
        """A spool for one delivery's bytes (see `DeliverySpool`), for `create(..., spool=)`;
        its temp file is removed when the block ends, whatever happened (a killed process
        leaves it for the sweep's orphan rule). Each piece is charged to the user before it is
        written (`HostCopyRefused` past the budget); uncommitted, the charge goes back."""
        meter = ChargedWrites(self._copies, runtime_user_id)
        try:
            with closing_fd(self._outbox_fd()) as dir_fd, spool_at(dir_fd, head_bytes, meter=meter) as spool:
                yield spool
        finally:
            meter.settle(kept_as=None)  # a no-op once `create` kept it as a delivery

    def create(self, new: NewDelivery, *, now: datetime | None = None, spool: DeliverySpool | None = None) -> Delivery:
        """Store a delivery: its bytes are `new.data`, or what `spool` holds (renamed into place,
        never read back into memory)."""
        created = now or datetime.now(timezone.utc)
        delivery = Delivery(
            delivery_id=f"dl-{secrets.token_hex(12)}",
            run_id=new.run_id,
            session_id=new.session_id,
            runtime_user_id=new.runtime_user_id,
            tool=new.tool,
            kind=new.kind,
            file_name=new.file_name,
            media_type=new.media_type,
            size=len(new.data) if spool is None else spool.size,
            sha256=hashlib.sha256(new.data).hexdigest() if spool is None else spool.sha256,
            source=new.source,
            created_at=_iso(created),
            expires_at=_iso(created + timedelta(seconds=self.ttl_s)),
            fetched_at=None,
        )
        if spool is None:
            self._copies.charge(new.runtime_user_id, "deliveries", delivery.size)  # before a byte is written
            try:
                with closing_fd(self._outbox_fd()) as dir_fd:
                    replace_file_at(dir_fd, ids.file_name(delivery.delivery_id), new.data)
            except BaseException:
                self._copies.release(new.runtime_user_id, "deliveries", delivery.size)
                raise
        else:
            spool.commit_at(ids.file_name(delivery.delivery_id))
        try:
            with self._store.write() as tx:
                columns = list(delivery.__dict__)
                tx.execute(
                    f"INSERT INTO deliveries ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})",
                    [getattr(delivery, c) for c in columns],
                )
        except BaseException:
            self._remove_files([delivery.delivery_id])  # no row: its bytes go, and with them their charge
            if spool is None:
                self._copies.release(new.runtime_user_id, "deliveries", delivery.size)
            raise
        if spool is not None and isinstance(spool.meter, ChargedWrites):
            spool.meter.settle(kept_as="deliveries")
        return delivery

    def get(self, delivery_id: str, *, now: datetime | None = None) -> Delivery:
        """The live delivery; 404 when unknown, 410 when it expired (its bytes are gone)."""
        if not valid_delivery_id(delivery_id):
            raise NotFound(f"delivery {delivery_id} not found")
        with self._store.read() as tx:
            row = tx.one("SELECT * FROM deliveries WHERE delivery_id = ?", (delivery_id,))
        if row is None:
            raise NotFound(f"delivery {delivery_id} not found")
        delivery = _delivery(row)
        if delivery.expires_at <= _iso(now or datetime.now(timezone.utc)):
            raise Gone(f"delivery {delivery_id} expired at {delivery.expires_at}", expired_at=delivery.expires_at)
        return delivery

    def open_bytes(self, delivery: Delivery) -> int:
        """A file descriptor on the delivery's bytes (the caller closes it); marks it fetched.
        Anything but our regular file under its name (a FIFO, a link) is 410, never waited on."""
        with closing_fd(self._outbox_fd()) as dir_fd:
            try:
                fd = open_regular_at(dir_fd, ids.file_name(delivery.delivery_id))
            except UnsafePath as exc:
                log.warning("outbox file refused %s", kv(delivery=delivery.delivery_id, reason=exc.reason))
                fd = None
        if fd is None:
            raise Gone(f"delivery {delivery.delivery_id} has no bytes any more")
        try:
            with self._store.write() as tx:
                tx.execute(
                    "UPDATE deliveries SET fetched_at = COALESCE(fetched_at, ?) WHERE delivery_id = ?",
                    (_iso(datetime.now(timezone.utc)), delivery.delivery_id),
                )
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read_bytes(self, delivery: Delivery) -> bytes:
        with closing_fd(self.open_bytes(delivery)) as fd, open(fd, "rb", closefd=False) as fh:
            return fh.read()

    def list_for_run(self, run_id: str) -> list[Delivery]:
        with self._store.read() as tx:
            rows = tx.all("SELECT * FROM deliveries WHERE run_id = ? ORDER BY created_at, delivery_id", (run_id,))
        return [_delivery(row) for row in rows]

    def delete(self, delivery_id: str) -> None:
        """The bot has posted it: drop the row, then the bytes. Unknown ids are 404."""
        if not valid_delivery_id(delivery_id):
            raise NotFound(f"delivery {delivery_id} not found")
        if not self._delete_where("delivery_id = ?", (delivery_id,)):
            raise NotFound(f"delivery {delivery_id} not found")

    def _remove_files(self, delivery_ids: list[str]) -> None:
        if not delivery_ids:
            return
        with closing_fd(self._outbox_fd()) as dir_fd:
            for delivery_id in delivery_ids:
                remove_file_at(dir_fd, ids.file_name(delivery_id))

    def _delete_where(self, where: str, params: tuple) -> list[str]:
        with self._store.write() as tx:
            rows = tx.all(f"DELETE FROM deliveries WHERE {where} RETURNING delivery_id, runtime_user_id, size", params)
        removed = [row["delivery_id"] for row in rows]
        self._remove_files(removed)
        for row in rows:  # the bytes are gone: so is their charge
            self._copies.release(row["runtime_user_id"], "deliveries", row["size"])
        return removed

    def forget_session(self, deleted: DeletedSession) -> list[str]:
        """A session cleanup step: its deliveries go with it."""
        return self._delete_where("session_id = ?", (deleted.session_id,))

    def sweep(self, *, now: datetime | None = None) -> tuple[list[str], list[str]]:
        """Remove expired deliveries, and outbox files no row refers to (after a grace time)."""
        moment = now or datetime.now(timezone.utc)
        expired = self._delete_where("expires_at <= ?", (_iso(moment),))
        orphans: list[str] = []
        with closing_fd(self._outbox_fd()) as dir_fd:
            names = os.listdir(dir_fd)
            with self._store.read() as tx:
                known = {row["delivery_id"] for row in tx.all("SELECT delivery_id FROM deliveries")}
            cutoff = moment.timestamp() - ORPHAN_GRACE_S
            for name in names:
                if name in known:
                    continue
                try:
                    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if info.st_mtime < cutoff:  # also the temp files of a killed write
                    remove_file_at(dir_fd, name)
                    orphans.append(name)
        if expired or orphans:
            log.info("outgoing deliveries swept %s", kv(expired=len(expired), orphan_files=len(orphans)))
        return expired, orphans
