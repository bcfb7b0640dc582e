"""key=value log fields, the one format of every structured log line (`orchestrator.log.kv`
is this function; `mounts` does not depend on `orchestrator`)."""

from __future__ import annotations

from typing import Any

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(char: str) -> str:
    known = _ESCAPES.get(char)
    if known is not None:
        return known
    if char.isprintable():
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def field_text(value: Any) -> str:
    """One value as it appears in a line: bare when it is plain, else quoted with every
    character that could end, rewrite or hide the line (CR, LF, escape sequences, Unicode line
    separators, NUL ...) escaped. Values come from clients and sandboxes too (a model's
    tool_call_id, a file name): raw, a carriage return or an U+2028 would let them show a
    forged line to a terminal or a line splitter."""
    text = "null" if value is None else str(value)
    if text and text.isprintable() and not any(c in text for c in ' "='):
        return text
    return '"' + "".join(map(_escaped, text)) + '"'


def kv(**fields: Any) -> str:
    """`a=1 b="two words"`."""
    return " ".join(f"{key}={field_text(value)}" for key, value in fields.items())
