"""Named crash points for fault-injection tests (docs/collaboration.md).

With `ORCH_CRASH_AT=<name>` in its environment, the process kills itself with SIGKILL when it
reaches that point: a real crash, with no cleanup, no flush and no answer to the caller. Tests
start `orchestrator serve` with it, then restart without it and check what survived. Unset
(always, in production) a crash point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "ORCH_CRASH_AT"


def crash_point(name: str) -> None:
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
