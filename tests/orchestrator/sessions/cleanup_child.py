"""Run a session deletion in its own process, for the kill -9 tests.

usage: python cleanup_child.py DATA_DIR SESSION_ID [BLOCK_MARKER]
With BLOCK_MARKER, a cleanup step writes that file and then blocks forever (the test kills
the process there); without it, the deletion runs normally (the test kills it mid-removal).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from orchestrator.service import OrchestratorService
from tests.conftest import make_settings


def main() -> None:
    data_dir, session_id = Path(sys.argv[1]), sys.argv[2]
    service = OrchestratorService(make_settings(data_dir))
    if len(sys.argv) > 3:
        marker = Path(sys.argv[3])

        def block(_deleted) -> None:
            marker.write_text("reached")
            time.sleep(600)

        service.sessions.register_cleanup_step("block", block)
    print("deleting", flush=True)
    service.sessions.delete(session_id, actor="child")
    print("finished", flush=True)


if __name__ == "__main__":
    main()
