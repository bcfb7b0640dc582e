"""The one retry decision of the call protocol (orchestrator/sandboxes/calling.py, `next_send`):
pure, so every row of it is tested here without an agent; the live cases (an agent dying
mid-call, a call sent once more to a fresh agent) are in test_call_protocol.py."""

from __future__ import annotations

import pytest

from orchestrator.call_ledger import SandboxPaused
from orchestrator.sandboxes.calling import Send, next_send
from sandbox_agent.errors import AgentTimedOut, AgentUnavailable, ContextRefused

NOT_DELIVERED = AgentUnavailable("connection refused", delivered=False)
DELIVERED = AgentUnavailable("reset mid-answer", delivered=True)


@pytest.mark.parametrize(
    ("failure", "resent_to_fresh", "expected"),
    [
        (NOT_DELIVERED, False, Send.AGAIN_TO_FRESH_AGENT),
        (SandboxPaused(), False, Send.AGAIN_TO_FRESH_AGENT),
        (NOT_DELIVERED, True, Send.FAIL),  # the one resend is spent
        (SandboxPaused(), True, Send.FAIL),
        (DELIVERED, False, Send.FAIL),  # it may have run: never sent twice
        (AgentTimedOut("no answer in 30 s"), False, Send.FAIL),
        (ContextRefused("an earlier BUILD"), False, Send.AGAIN_WITHOUT_CONTEXT),
        (ContextRefused("an earlier BUILD"), True, Send.AGAIN_WITHOUT_CONTEXT),
    ],
)
def test_only_what_certainly_never_ran_is_sent_again(failure: Exception, resent_to_fresh: bool, expected: Send) -> None:
    assert next_send(failure, resent_to_fresh=resent_to_fresh) is expected
