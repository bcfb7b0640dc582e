"""Outgoing deliveries: lifetime (expiry → 410, sweep), orphans, session deletion."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from orchestrator.deliveries.outbox import ORPHAN_GRACE_S, DeliveryStore, NewDelivery
from orchestrator.errors import Gone, NotFound
from orchestrator.service import OrchestratorService
from orchestrator.sessions.cleanup import DeletedSession


def new(session_id: str = "s-1", data: bytes = b"bytes") -> NewDelivery:
    return NewDelivery(
        run_id="r-1", session_id=session_id, runtime_user_id=67, tool="send_file", kind="file",
        file_name="a.txt", media_type="text/plain", source="/x/a.txt", data=data,
    )


@pytest.fixture
def store(service: OrchestratorService) -> DeliveryStore:
    return DeliveryStore(service.store, service.layout, ttl_s=3600, copies=service.host_copies)


def test_a_delivery_lives_until_it_expires_then_answers_gone_and_the_sweep_removes_it(
    store: DeliveryStore, service: OrchestratorService
) -> None:
    now = datetime.now(timezone.utc)
    delivery = store.create(new(data=b"hello"), now=now)
    assert store.get(delivery.delivery_id, now=now).size == 5
    assert store.read_bytes(delivery) == b"hello"
    assert store.get(delivery.delivery_id).fetched_at is not None
    later = now + timedelta(seconds=3601)
    with pytest.raises(Gone):
        store.get(delivery.delivery_id, now=later)
    assert store.sweep(now=now) == ([], [])
    expired, _ = store.sweep(now=later)
    assert expired == [delivery.delivery_id]
    assert not service.layout.outbox_file(delivery.delivery_id).exists()
    with pytest.raises(NotFound):
        store.get(delivery.delivery_id)


def test_the_outbox_file_is_host_only_and_private(store: DeliveryStore, service: OrchestratorService) -> None:
    delivery = store.create(new())
    path = service.layout.outbox_file(delivery.delivery_id)
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700


def test_orphan_files_are_swept_after_a_grace_time(store: DeliveryStore, service: OrchestratorService) -> None:
    store.create(new())
    outbox = service.layout.outbox_root
    orphan = outbox / "dl-000000000000000000000000"
    orphan.write_bytes(b"left by a crash")
    temp = outbox / ".dl-1.abc.tmp"
    temp.write_bytes(b"half")
    assert store.sweep() == ([], [])  # too young
    old = time.time() - ORPHAN_GRACE_S - 10
    for path in (orphan, temp):
        os.utime(path, (old, old))
    _, orphans = store.sweep()
    assert sorted(orphans) == sorted([orphan.name, temp.name])
    assert len(list(outbox.iterdir())) == 1


def test_forget_session_removes_only_that_sessions_deliveries(store: DeliveryStore, service: OrchestratorService) -> None:
    gone = store.create(new("s-gone"))
    kept = store.create(new("s-kept"))
    deleted = DeletedSession("s-gone", 17, None, None, "now", (17,))
    assert store.forget_session(deleted) == [gone.delivery_id]
    assert store.forget_session(deleted) == []  # idempotent
    assert store.get(kept.delivery_id).session_id == "s-kept"
    assert not service.layout.outbox_file(gone.delivery_id).exists()


def test_ids_that_are_not_delivery_ids_are_not_found_without_touching_the_disk(store: DeliveryStore) -> None:
    for bad in ("../state", "dl-", "dl-" + "g" * 24, "DL-" + "0" * 24):
        with pytest.raises(NotFound):
            store.get(bad)
        with pytest.raises(NotFound):
            store.delete(bad)


def test_a_symlinked_outbox_is_refused(store: DeliveryStore, service: OrchestratorService, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    service.layout.outbox_root.symlink_to(elsewhere)
    with pytest.raises(Exception, match="symlink"):
        store.create(new())
    assert list(elsewhere.iterdir()) == []
