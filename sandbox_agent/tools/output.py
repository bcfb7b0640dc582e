"""Capping output with a marker the model can see."""

from __future__ import annotations


def truncation_marker(omitted_bytes: int) -> str:
    return f"\n[... output truncated: {omitted_bytes} more bytes not shown ...]\n"


def cap_bytes(data: bytes, cap: int, omitted: int = 0) -> tuple[str, bool]:
    """Decode `data` (at most `cap` bytes kept) and append a marker when anything was cut."""
    if len(data) > cap:
        omitted += len(data) - cap
        data = data[:cap]
    text = data.decode("utf-8", "replace")
    if omitted:
        return text + truncation_marker(omitted), True
    return text, False


def looks_binary(head: bytes) -> bool:
    # Same heuristic as git and grep: a NUL byte near the start.
    return b"\x00" in head
