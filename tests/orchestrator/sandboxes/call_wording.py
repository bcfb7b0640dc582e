"""What a model is told when its sandbox died during a call, written out once for the tests
of every backend: the same words whatever the backend, and never also "did not run"."""

from __future__ import annotations


def died_mid_call(user_id: int) -> str:
    return (
        f"The sandbox of user {user_id} is not available (it stopped answering during the call). "
        "The tool may have run partly: check its effects before repeating it. The sandbox is "
        "restarted on the next call."
    )
