"""The process's own RLIMIT_NOFILE: raised at `orchestrator serve` start, read for the budget,
and how many descriptors are open now (for the admin's /healthz)."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass


class LimitRefused(RuntimeError):
    """The asked-for limit cannot be had; the text says what to do."""


@dataclass(frozen=True)
class LimitChange:
    before: int  # the soft limit the process started with
    after: int  # the soft limit now
    hard: int


def raise_descriptor_limit(wanted: int | None) -> LimitChange:
    """Raise the soft RLIMIT_NOFILE to `wanted` (unset: to the hard limit). Past the hard
    limit only a process with CAP_SYS_RESOURCE gets there (it raises both); else LimitRefused.
    Never lowers the limit below what it is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if wanted is None else wanted
    if hard != resource.RLIM_INFINITY and target > hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, target))
        except (OSError, ValueError) as exc:
            raise LimitRefused(
                f"ORCH_FD_LIMIT={target} is above the hard descriptor limit {hard} and it cannot be raised ({exc}): "
                "raise the hard limit (systemd LimitNOFILE=, docker --ulimit nofile=) or ask for less"
            ) from None
        return LimitChange(soft, target, target)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return LimitChange(soft, target, hard)
    return LimitChange(soft, soft, hard)


def descriptor_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def open_descriptors() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself held
    except OSError:  # out of descriptors itself, or no /proc
        return None
