"""File names that are not UTF-8, on the way out and back in (pure).

Names are decoded with `surrogateescape`, so a byte that is not UTF-8 becomes a lone
surrogate (U+DC80..U+DCFF). No JSON encoder for a model or a bot can carry those (the host's
answer was a 500), so every string that holds one leaves the agent *escaped*: the byte as
`\\xNN`, a backslash doubled; the object holding it gets `<key>_encoding: "escaped"`. Names
that are valid UTF-8 travel unchanged, backslashes included.

Back in, a path that contains `\\xNN` (NN >= 80) is first taken literally (a file may really
be called that); only when that is not found is the unescaped form tried. So every listed
name can be fed back, except when a file literally named like another's escaped form exists
next to it: then the literal one wins.
"""

from __future__ import annotations

import re
from typing import Any

ESCAPED = "escaped"
# Every lone surrogate: U+DC80..U+DCFF are the bytes of names; any other one can only come
# from a request echoed back (defence in depth: the argument models refuse most) and is
# shown as its `\uXXXX` text.
_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPE = re.compile(r"\\\\|\\x([89a-fA-F][0-9a-fA-F])")


def has_surrogates(text: str) -> bool:
    return _SURROGATE.search(text) is not None


def escape_text(text: str) -> str:
    """The printable, lossless form of `text` that holds lone surrogates."""
    out = text.replace("\\", "\\\\")
    return _SURROGATE.sub(_escape_one, out)


def _escape_one(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def unescape_path(path: str) -> str | None:
    """The surrogateescape form of an escaped path, or None when `path` has no `\\xNN`."""
    if "\\x" not in path:
        return None
    changed = False

    def replace(match: re.Match[str]) -> str:
        nonlocal changed
        if match.group(1) is None:
            return "\\"
        changed = True
        return chr(0xDC00 + int(match.group(1), 16))

    alternative = _ESCAPE.sub(replace, path)
    return alternative if changed else None


def escape_names(value: Any) -> Any:
    """`value` (a JSON-able answer) with every string that holds a lone surrogate escaped and
    flagged; called only when plain encoding failed, so common answers pay nothing."""
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            new = escape_names(item)
            out[key] = new
            if isinstance(key, str) and _was_escaped(item):
                out[f"{key}_encoding"] = ESCAPED
        return out
    if isinstance(value, list):
        return [escape_names(item) for item in value]
    if isinstance(value, str) and has_surrogates(value):
        return escape_text(value)
    return value


def _was_escaped(item: Any) -> bool:
    if isinstance(item, str):
        return has_surrogates(item)
    return isinstance(item, list) and any(isinstance(i, str) and has_surrogates(i) for i in item)
