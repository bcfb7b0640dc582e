"""A large bot-facing read_bytes streams: the agent's raw answer goes into a spool file in
pieces, is verified, and the HTTP answer is the same JSON as before with its base64 encoded
on the fly; it takes a transfer slot; a lying agent's short or mis-sized answer is refused
before anything is answered (live server, real process-backend agents)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.client import OrchestratorClient
from orchestrator.http.app import create_app
from orchestrator.quotas.host_copies import HostCopies
from orchestrator.service import OrchestratorService
from orchestrator.tools import read_bytes_stream
from mounts.fs.spool import SpoolWriteFailed
from orchestrator.tools.read_bytes_stream import ReadBytesSpool, StreamedReadBytes, spool_failed
from orchestrator.tools.transfer_slots import TransferSlots
from sandbox_agent.client import AsyncAgentClient
from sandbox_agent.errors import AgentUnavailable, ToolFailure
from tests.conftest import API_TOKEN, TEST_ROOT, make_settings
from tests.live_server import free_port, live_server
from tests.api_calls import group_session, start_run, tool
from tests.sandbox_agent.lying_agent import answer_once, raw_read_bytes_answer

BIG = 3 * 1024 * 1024 + 1  # not a multiple of 3: the last base64 piece is padded
MEDIUM = 1200 * 1024  # streamed, and its JSON still fits the 2 MiB record cap


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[httpx.Client, OrchestratorService, str]]:
    """One live server (a 1 s slot wait keeps the bound's test short) and a run with a big
    and a medium file in its sandbox, for every test of the module."""
    base_dir = Path(tempfile.mkdtemp(dir=TEST_ROOT, prefix="orch-test-"))
    os.chmod(base_dir, 0o711)
    (base_dir / "data").mkdir()
    port = free_port()
    settings = make_settings(base_dir / "data", public_base_url=f"http://127.0.0.1:{port}", transfer_wait_s=1.0)
    service = OrchestratorService(settings)
    try:
        with live_server(create_app(service), port) as base:
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=60) as http:
                run = start_run(http, group_session(http), trigger="web")["run_id"]  # type: ignore[arg-type]
                made = tool(http, run, "shell", command=f"head -c {BIG} /dev/urandom > big.bin && head -c {MEDIUM} /dev/urandom > medium.bin && sha256sum big.bin medium.bin")  # type: ignore[arg-type]
                assert made["ok"], made
                yield http, service, run
    finally:
        service.close()
        shutil.rmtree(base_dir, ignore_errors=True)


def _sha_of(http: httpx.Client, run: str, name: str) -> str:
    out = tool(http, run, "shell", command=f"sha256sum {name}")  # type: ignore[arg-type]
    return out["result"]["stdout"].split()[0]


def unbounded_copies() -> HostCopies:
    """Host-copy counters no spool of these tests comes near (tests/orchestrator/quotas/ test the budget)."""
    return HostCopies(budget_bytes=1 << 40, watermark=lambda: None)


def _slots(service: OrchestratorService) -> TransferSlots:
    slots = service.dispatcher._transfers
    assert slots is not None
    return slots


def _all_slots_back(service: OrchestratorService) -> bool:
    """The server gives a slot back right after the last byte was sent, which the client may
    see a moment before."""
    deadline = time.monotonic() + 5
    while _slots(service)._total and time.monotonic() < deadline:
        time.sleep(0.01)
    return _slots(service)._total == 0


def test_a_large_read_bytes_streams_exactly_its_bytes_raw_http(served, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    http, service, run = served
    pieces: list[int] = []
    encode = StreamedReadBytes.encoded_piece
    monkeypatch.setattr(StreamedReadBytes, "encoded_piece", lambda self, offset: pieces.append(offset) or encode(self, offset))
    answer = http.post(f"/v1/runs/{run}/tools/read_bytes", json={"arguments": {"path": "big.bin"}})
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    assert int(answer.headers["content-length"]) == len(answer.content)
    body = answer.json()
    data = base64.b64decode(body["result"]["content_base64"], validate=True)
    assert hashlib.sha256(data).hexdigest() == _sha_of(http, run, "big.bin")
    # Byte for byte what JSONResponse renders for the whole result (the shape clients parse).
    assert list(body["result"]) == ["path", "size", "media_type", "content_base64"]
    assert answer.content == json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    assert len(pieces) == -(-BIG // read_bytes_stream.ENCODE_PIECE)  # encoded in pieces, never whole
    assert _all_slots_back(service)  # the slot went back once the answer was sent


def test_a_large_read_bytes_through_the_sync_sdk(served) -> None:  # type: ignore[no-untyped-def]
    http, _, run = served
    with OrchestratorClient(str(http.base_url), token=API_TOKEN) as bot:
        result = bot.call_tool(run, "read_bytes", {"path": "big.bin"})
    assert result.ok and result.result["size"] == BIG
    data = base64.b64decode(result.result["content_base64"], validate=True)
    assert hashlib.sha256(data).hexdigest() == _sha_of(http, run, "big.bin")


def test_a_small_read_bytes_keeps_the_whole_path(served, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    http, _, run = served
    opened: list[int] = []
    monkeypatch.setattr(ReadBytesSpool, "open", lambda self, length: opened.append(length))
    tool(http, run, "shell", command="printf 'hello' > small.txt")  # type: ignore[arg-type]
    small = tool(http, run, "read_bytes", path="small.txt")  # type: ignore[arg-type]
    assert small["ok"] and base64.b64decode(small["result"]["content_base64"]) == b"hello"
    assert opened == []  # no spool, no slot


def test_the_transfer_slot_bound_applies(served) -> None:  # type: ignore[no-untyped-def]
    http, service, run = served
    slots = _slots(service)
    user = service.run_repo.get(run).runtime_user_id  # type: ignore[union-attr]
    held = [slots._try_take(user) for _ in range(slots.user_transfers_max)]  # the user's own sends
    assert all(held)
    try:
        refused = tool(http, run, "read_bytes", path="big.bin")  # type: ignore[arg-type]
        assert refused["ok"] is False and refused["error"]["code"] == "busy", refused
        tool(http, run, "shell", command="printf 'hi' > tiny.txt")  # type: ignore[arg-type]
        assert tool(http, run, "read_bytes", path="tiny.txt")["ok"]  # type: ignore[arg-type] # small: no slot
    finally:
        for _ in held:
            slots.give_back(user)
    assert tool(http, run, "read_bytes", path="big.bin")["ok"]  # type: ignore[arg-type]
    assert _all_slots_back(service)


def test_a_repeat_gets_the_recorded_body_or_result_not_kept(served) -> None:  # type: ignore[no-untyped-def]
    http, _, run = served

    def call(path: str, call_id: str) -> httpx.Response:
        return http.post(f"/v1/runs/{run}/tools/read_bytes", json={"arguments": {"path": path}, "tool_call_id": call_id})

    first, again = call("medium.bin", "m-1"), call("medium.bin", "m-1")
    assert first.json()["ok"] and again.content == first.content  # fits the cap: recorded whole
    assert call("big.bin", "b-1").json()["ok"]
    repeat = call("big.bin", "b-1").json()
    assert repeat["ok"] is False and repeat["error"]["code"] == "result_not_kept"
    assert repeat["error"]["outcome"] == "ok"


@contextmanager
def _agent_answering(answer: bytes, **pieces: Any) -> Iterator[tuple[Path, str]]:
    """A directory, and a socket in it that answers one request with `answer` (a sandbox
    that replaced its agent may send anything; `pieces`: how, see `answer_once`)."""
    base_dir = Path(tempfile.mkdtemp(dir=TEST_ROOT, prefix="orch-test-"))
    try:
        path = str(base_dir / "agent.sock")
        thread = answer_once(path, answer, **pieces)
        yield base_dir, path
        thread.join(5)
    finally:
        shutil.rmtree(base_dir, ignore_errors=True)


def _read_bytes(path: str, spool: ReadBytesSpool, timeout_s: float) -> object:
    """read_bytes the way the dispatcher sends it: on the asyncio client, with a spool."""

    async def call() -> object:
        client = AsyncAgentClient(path, "t" * 43)
        try:
            return await client.call("read_bytes", {"path": "x"}, cwd="/", timeout_s=timeout_s, spool=spool)
        finally:
            client.close()

    return asyncio.run(call())


@pytest.mark.parametrize(
    ("announced", "length", "sent"),
    [
        (BIG, BIG, BIG // 2),  # Content-Length and header agree; half the bytes, then it hangs up
        (BIG - 7, BIG, BIG),  # the result header's size disagrees with the body
    ],
)
def test_a_lying_agents_large_answer_is_refused_and_its_spool_dropped(announced: int, length: int, sent: int) -> None:
    answer = raw_read_bytes_answer(announced=announced, length=length, body=b"z" * sent)
    with _agent_answering(answer) as (base_dir, path):
        slots = TransferSlots(transfers_max=1, user_transfers_max=1, wait_s=1)
        spool = ReadBytesSpool(slots, 5, base_dir, unbounded_copies())
        try:
            refused = _read_bytes(path, spool, timeout_s=10)
        except AgentUnavailable as exc:  # hung up: the connection's failure
            refused = exc
        assert isinstance(refused, (ToolFailure, AgentUnavailable)), refused
        assert "bytes arrived" in refused.message
        assert spool.file is not None  # it was spooled, never returned as a result
        spool.close()  # what the dispatcher does with a refused call's spool
        assert slots._total == 0 and os.listdir(base_dir) == ["agent.sock"]  # the temp file was never named


@pytest.mark.parametrize("field", ["path", "media_type"])
def test_a_large_answer_naming_an_unencodable_path_is_refused_and_gives_its_slot_back(field: str) -> None:
    """A sandbox that replaced its agent announces a lone surrogate (valid JSON, "\\udcff") in
    the result header of a large answer. The streamed answer's JSON cannot encode it: taken as a
    result, building the answer raised after the client returned, outside what gives the spool
    and the transfer slot back, so each such call kept a slot for good (two kept every
    transfer of the user `busy`, four every user's)."""
    fields = {"path": "/x", "size": BIG, "media_type": "application/octet-stream", field: "/odd\udcff"}
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {BIG}\r\n"
        f"X-Tool-Result: {json.dumps(fields)}\r\n\r\n"
    ).encode()
    with _agent_answering(head + b"z" * BIG) as (base_dir, path):
        slots = TransferSlots(transfers_max=1, user_transfers_max=1, wait_s=1)
        spool = ReadBytesSpool(slots, 5, base_dir, unbounded_copies())
        try:
            refused = _read_bytes(path, spool, timeout_s=10)  # a failure, never a result to stream
            assert isinstance(refused, ToolFailure) and refused.code == "agent_error", refused
        finally:
            spool.close()  # what the dispatcher does with a refused call's spool
        assert slots._total == 0


def test_an_answer_whose_last_bytes_come_late_is_streamed_and_recorded_whole() -> None:
    """An agent may send its body in pieces of any size; the last few bytes in a piece of their
    own must reach the streamed answer and a tool_call_id record (both read the spool back by
    descriptor), not stay behind in a write buffer, making a short answer or an ok with fewer
    bytes."""
    body = os.urandom(BIG)
    answer = raw_read_bytes_answer(announced=BIG, length=BIG, body=body)
    with _agent_answering(answer, tail=100, tail_after_s=0.2) as (base_dir, path):
        slots = TransferSlots(transfers_max=1, user_transfers_max=1, wait_s=1)
        spool = ReadBytesSpool(slots, 5, base_dir, unbounded_copies())
        streamed = StreamedReadBytes.of(_read_bytes(path, spool, timeout_s=10), spool)  # type: ignore[arg-type]
        try:
            sent = b"".join(base64.b64decode(streamed.encoded_piece(offset)) for offset in streamed.pieces())
            assert len(sent) == BIG and sent == body
            recorded = streamed.recorded_body(4 * BIG)
            assert base64.b64decode(recorded["result"]["content_base64"]) == body
        finally:
            streamed.close()


def test_a_full_disk_while_spooling_is_not_a_broken_agent(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A spool write that fails (here /dev/full: ENOSPC) surfaces as `SpoolWriteFailed`, which
    the dispatcher answers as `no_space`; an OSError would have been taken for a broken agent
    connection and the user's sandbox replaced."""
    with _agent_answering(raw_read_bytes_answer(announced=BIG, length=BIG, body=b"z" * BIG)) as (base_dir, path):
        slots = TransferSlots(transfers_max=1, user_transfers_max=1, wait_s=1)
        spool = ReadBytesSpool(slots, 5, base_dir, unbounded_copies())
        full = open("/dev/full", "wb", buffering=0)  # noqa: SIM115 - closed by the spool
        monkeypatch.setattr(read_bytes_stream.tempfile, "TemporaryFile", lambda **_: full)
        with pytest.raises(SpoolWriteFailed) as failed:
            _read_bytes(path, spool, timeout_s=10)
        assert failed.value.no_space and spool_failed(failed.value).code == "no_space"
        spool.close()
        assert slots._total == 0 and full.closed


def test_a_wait_for_a_slot_does_not_count_against_the_agents_deadline() -> None:
    """The slot comes free after 1 s, the call's deadline is 0.5 s: the agent answered in
    time, so the call succeeds (a missed deadline would replace the user's sandbox)."""
    data = os.urandom(BIG)
    with _agent_answering(raw_read_bytes_answer(announced=BIG, length=BIG, body=data)) as (base_dir, path):
        slots = TransferSlots(transfers_max=1, user_transfers_max=1, wait_s=5)
        assert slots._try_take(6)  # another user's transfer, done in a second
        threading.Timer(1.0, slots.give_back, (6,)).start()
        spool = ReadBytesSpool(slots, 5, base_dir, unbounded_copies())
        started = time.monotonic()
        result = _read_bytes(path, spool, timeout_s=0.5)
        assert time.monotonic() - started >= 1.0
        assert result.size == BIG and spool.file is not None  # type: ignore[attr-defined]
        spool.file.seek(0)
        assert spool.file.read() == data
        spool.close()
        assert slots._total == 0
