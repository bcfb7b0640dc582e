"""What a strict reader of an HTTP/1 request head refuses, for every listener that forwards a
head it did not write itself (the egress proxy's plain HTTP, the preview relay): a head is split
at CRLF only, and a line that another reader would split or join differently is a smuggling
attempt (a second `Host` the checks never saw)."""

from __future__ import annotations

# A bare CR or LF is a line break to some readers; a NUL ends a string to others.
_NOT_IN_A_LINE = frozenset(b"\r\n\x00")


def smuggles(line: bytes) -> bool:
    """Pure: whether a line of a head split at CRLF holds a bare CR, LF or NUL, or continues the
    line before it (obs-fold: a leading space or tab)."""
    return line[:1] in (b" ", b"\t") or any(byte in _NOT_IN_A_LINE for byte in line)
