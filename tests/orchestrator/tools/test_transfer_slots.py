"""The bound on payload transfers held in memory: per user and overall, a wait with a deadline,
then a clear `busy` that did nothing; a slot given back lets the next one in."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator.errors import ToolError
from orchestrator.tools.transfer_slots import TransferSlots, may_start


def test_the_decision() -> None:
    assert may_start(running=0, running_of_user=0, transfers_max=4, user_transfers_max=2)
    assert not may_start(running=1, running_of_user=2, transfers_max=4, user_transfers_max=2)
    assert not may_start(running=4, running_of_user=0, transfers_max=4, user_transfers_max=2)


def test_per_user_and_global_bounds_wait_then_refuse() -> None:
    slots = TransferSlots(transfers_max=3, user_transfers_max=2, wait_s=0.2)
    with slots.held(1, tool="send_file"), slots.held(1, tool="send_file"):
        started = time.monotonic()
        with pytest.raises(ToolError) as refused:
            with slots.held(1, tool="send_file"):
                pass
        assert refused.value.code == "busy" and time.monotonic() - started >= 0.2
        assert "ORCH_USER_TRANSFERS_MAX" in refused.value.message and "Nothing was sent" in refused.value.message
        with slots.held(2, tool="send_file"):  # another user still gets the last global slot
            with pytest.raises(ToolError):
                with slots.held(3, tool="send_image"):
                    pass


def test_a_waiting_transfer_goes_as_soon_as_a_slot_is_given_back() -> None:
    slots = TransferSlots(transfers_max=1, user_transfers_max=1, wait_s=5)
    got: list[float] = []
    release = threading.Event()

    def holder() -> None:
        with slots.held(1, tool="send_file"):
            release.wait()

    thread = threading.Thread(target=holder)
    thread.start()
    time.sleep(0.05)
    waiter = threading.Thread(target=lambda: slots.held(2, tool="send_file").__enter__() or got.append(time.monotonic()))
    waiter.start()
    time.sleep(0.1)
    assert got == []  # waiting
    freed = time.monotonic()
    release.set()
    waiter.join(5)
    thread.join(5)
    assert got and got[0] - freed < 0.5
