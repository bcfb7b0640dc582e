"""A hostile sandbox plants a large skill file; MCP reads of it (resources/read, a tools/call
read_bytes) are transfers like the bot-facing read_bytes: they count against the transfer
slots (docs/lifecycle.md), so concurrent MCP reads cannot take the server past its memory
envelope, and a read whose user has no free slot answers `busy` having sent nothing."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from orchestrator.client import OrchestratorClient
from orchestrator.mcp.connect import run_session
from orchestrator.tools.transfer_slots import TransferSlots
from tests.conftest import API_TOKEN
from tests.orchestrator.mcp.conftest import OWNER, Live

BIG = 3 * 1024 * 1024  # over the 1 MiB from which a read_bytes answer is a transfer
FRONT = b"---\nname: big\ndescription: planted\n---\n"


@contextmanager
def all_slots_taken(slots: TransferSlots, user_id: int) -> Iterator[None]:
    """Every slot of `user_id` held (as by two slow transfers), with a short wait for others."""
    wait_s, slots.wait_s = slots.wait_s, 0.3
    taken = 0
    try:
        for _ in range(slots.user_transfers_max):
            assert slots._try_take(user_id)
            taken += 1
        yield
    finally:
        for _ in range(taken):
            slots.give_back(user_id)
        slots.wait_s = wait_s


def test_large_mcp_reads_of_a_planted_skill_file_take_a_transfer_slot(live: Live, bot: OrchestratorClient) -> None:
    session = bot.create_session(owner_user_id=OWNER, channel="web")
    run = bot.start_run(session.session_id, trigger="web")
    # The sandbox's own shell: a skill of its own in its runtime dir, one file of 3 MiB of
    # control bytes (each one six characters once escaped in JSON).
    planted = bot.call_tool(
        run.run_id, "shell",
        {"command": f"mkdir -p skills/big && printf -- '{FRONT.decode().encode('unicode_escape').decode()}' > skills/big/SKILL.md"
                    f" && head -c {BIG - len(FRONT)} /dev/zero | tr '\\0' '\\1' >> skills/big/SKILL.md && wc -c skills/big/SKILL.md"},
    ).raise_for_error()  # fmt: skip
    assert planted.result["exit_code"] == 0 and str(BIG) in planted.result["stdout"], planted.result
    slots = live.service.dispatcher._transfers
    assert slots is not None

    async def scenario() -> None:
        async with run_session(live.url, run.run_id, API_TOKEN) as (mcp, _):
            with all_slots_taken(slots, OWNER):
                with pytest.raises(MCPError) as busy:
                    await mcp.read_resource("skill://big/SKILL.md")
                assert busy.value.error.data["code"] == "busy", busy.value.error.data
                refused = await mcp.call_tool("read_bytes", {"path": "skills/big/SKILL.md"})
                assert refused.is_error and refused.structured_content["code"] == "busy", refused.structured_content
            # With a slot free the same reads answer every byte, and give the slot back.
            read = await mcp.read_resource("skill://big/SKILL.md")
            text = read.contents[0].text
            assert len(text) == BIG and text.startswith(FRONT.decode()) and text.endswith("\x01")
            whole = await mcp.call_tool("read_bytes", {"path": "skills/big/SKILL.md"})
            assert not whole.is_error
            data = base64.b64decode(whole.structured_content["content_base64"])
            assert len(data) == BIG and data.startswith(FRONT) and data.endswith(b"\x01")
            assert slots._total == 0

    anyio.run(scenario)


@pytest.mark.parametrize("size", [1024 * 1024 + 1, 1024 * 1024 + 5000])
def test_a_streamed_read_bytes_answers_every_byte_whatever_its_size(live: Live, bot: OrchestratorClient, size: int) -> None:
    """The spool of a large read_bytes is read back by descriptor (pread): bytes still in a
    write buffer would be missing from the answer, or from a tool_call_id repeat's record."""
    session = bot.create_session(owner_user_id=OWNER, channel="web")
    run = bot.start_run(session.session_id, trigger="web")
    made = bot.call_tool(run.run_id, "shell", {"command": f"head -c {size} /dev/urandom > odd.bin && sha256sum odd.bin"}).raise_for_error()
    expected = made.result["stdout"].split()[0]
    import hashlib

    plain = bot.call_tool(run.run_id, "read_bytes", {"path": "odd.bin"}, tool_call_id="odd-1").raise_for_error()
    assert hashlib.sha256(base64.b64decode(plain.result["content_base64"])).hexdigest() == expected
    repeat = bot.call_tool(run.run_id, "read_bytes", {"path": "odd.bin"}, tool_call_id="odd-1").raise_for_error()
    assert hashlib.sha256(base64.b64decode(repeat.result["content_base64"])).hexdigest() == expected

    async def scenario() -> None:
        async with run_session(live.url, run.run_id, API_TOKEN) as (mcp, _):
            whole = await mcp.call_tool("read_bytes", {"path": "odd.bin"})
            assert not whole.is_error
            data = base64.b64decode(whole.structured_content["content_base64"])
            assert hashlib.sha256(data).hexdigest() == expected, len(data)

    anyio.run(scenario)

