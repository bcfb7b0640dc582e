"""`make run`'s first step, before the install: is the data dir somewhere the server will accept?

Runs with the system python from the checkout (standard library only, like
`orchestrator/startup_checks.py`), so a data dir under /tmp is refused within a second with
what to set, not after a minute of installing. The server checks again at start with the
sandbox ids it knows (`serve` refuses what this lets through, never the other way round).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from orchestrator.startup_checks import path_chain, unsafe_ancestor_problem

SUGGESTED = "/var/lib/sandbox-orchestrator"


def data_dir_advice(data_dir: Path) -> str | None:
    """Pure over the path's owners and modes: None when acceptable, else what to set."""
    problem = unsafe_ancestor_problem(
        path_chain(data_dir), own_gid=os.getegid(), as_root=os.geteuid() == 0, sandbox_ids=()
    )
    if problem is None:
        return None
    return (
        f"make run: refused before installing: {problem}.\n"
        f"Set ORCH_DATA_DIR to a directory outside it, for example:\n"
        f"    ORCH_DATA_DIR={SUGGESTED} make run"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 -m orchestrator.preflight DATA_DIR", file=sys.stderr)
        return 64
    advice = data_dir_advice(Path(argv[1]))
    if advice is not None:
        print(advice, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
