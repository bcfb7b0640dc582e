"""The test run's own sandbox uid block, free on this host.

As root every service a test starts claims `base .. base + max_user_id` in the host's uid block
registry and refuses to start beside a live instance whose block overlaps (another test run, a
developer's `make run` on the default block). So a run picks, before any test, a span of uids
that no live instance and no other test run holds, and passes it to every service through
ORCH_SANDBOX_UID_BASE / ORCH_MAX_USER_ID (which the fixtures keep): the module's services use
the base block, tests that need a second service or a block of their own use the
`block(index)` spans above it. The span is reserved by a flocked file in a directory of test
reservations, held for the life of the pytest process (the kernel drops it however that ends).

Set ORCH_SANDBOX_UID_BASE yourself and nothing is chosen (the run uses yours, as before).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from orchestrator.sandboxes.uid_registry import live_claims

WIDTH = 5_000_000  # ORCH_MAX_USER_ID of the run's services: user ids up to here
BLOCKS = 12  # the run's span: its base block and blocks for second services above it
SPAN = BLOCKS * (WIDTH + 1)
FIRST_BASE = 100_000
LAST_UID = 1_999_999_999  # below the default group gids (2,000,000,000 and up)
RESERVATIONS = Path("/run/sandbox-orchestrator/test-uid-spans")

_held: list[int] = []  # the reservation's fd: open for the life of the process


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def free_base(taken: list[tuple[int, int]]) -> int | None:
    """Pure: the lowest base whose span overlaps nothing taken, on SPAN boundaries."""
    base = FIRST_BASE
    while base + SPAN - 1 <= LAST_UID:
        if not any(_overlaps((base, base + SPAN - 1), t) for t in taken):
            return base
        base += SPAN
    return None


def _reserved_spans(dir_fd: int) -> list[tuple[int, int]]:
    spans = []
    for name in os.listdir(dir_fd):
        if not name.endswith(".span") or not name[:-5].isdecimal():
            continue
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.unlink(name, dir_fd=dir_fd)  # nobody holds it: that run has ended
        except BlockingIOError:
            base = int(name[:-5])
            spans.append((base, base + SPAN - 1))
        finally:
            os.close(fd)
    return spans


def claim_for_this_run() -> None:
    """Choose and reserve the run's span; export it to the services the tests start."""
    if os.geteuid() != 0 or os.environ.get("ORCH_SANDBOX_UID_BASE"):
        return
    registry = Path(os.environ.get("ORCH_UID_REGISTRY_DIR") or "/run/sandbox-orchestrator/uid-blocks")
    RESERVATIONS.mkdir(mode=0o700, parents=True, exist_ok=True)
    dir_fd = os.open(RESERVATIONS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX)  # one chooser at a time
        taken = [(c.block.first, c.block.last) for c in live_claims(registry)] + _reserved_spans(dir_fd)
        base = free_base(taken)
        if base is None:
            raise RuntimeError(f"no free sandbox uid span of {SPAN} uids on this host: {sorted(taken)}")
        fd = os.open(f"{base}.span", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        fcntl.flock(fd, fcntl.LOCK_EX)
        _held.append(fd)
    finally:
        os.close(dir_fd)  # closing the directory releases its flock
    os.environ["ORCH_SANDBOX_UID_BASE"] = str(base)
    os.environ["ORCH_MAX_USER_ID"] = str(WIDTH)


def block(index: int) -> dict[str, int]:
    """Settings for the run's `index`-th extra block (1 .. BLOCKS-1), above its base block."""
    if not 0 < index < BLOCKS:
        raise ValueError(f"block index {index} outside 1..{BLOCKS - 1}")
    base = int(os.environ.get("ORCH_SANDBOX_UID_BASE") or 100_000)
    width = int(os.environ.get("ORCH_MAX_USER_ID") or WIDTH)
    return {"sandbox_uid_base": base + index * (width + 1), "max_user_id": width}
