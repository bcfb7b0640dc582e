"""Glob patterns for `glob_search` and `grep_search` (pure).

`*` and `?` stay within one name, `**` spans directories (`**/` also matches zero of them),
`[abc]`/`[!abc]` are classes and `{a,b}` alternatives. Python 3.11's fnmatch lets `*` cross
`/` and has no `**`, hence this small translator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class GlobError(ValueError):
    pass


def _segment(seg: str) -> str:
    out: list[str] = []
    i, n = 0, len(seg)
    while i < n:
        c = seg[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = seg.find("]", i + 2 if i + 1 < n and seg[i + 1] in "!^" else i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = seg[i + 1 : j]
                negate = body[:1] in ("!", "^")
                body = body[1:] if negate else body
                body = body.replace("\\", "\\\\")
                out.append(f"[^/{body}]" if negate else f"[{body}]")
                i = j
        elif c == "{":
            j = seg.find("}", i)
            if j < 0:
                out.append(re.escape(c))
            else:
                options = seg[i + 1 : j].split(",")
                out.append("(?:" + "|".join(_segment(o) for o in options) + ")")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class Glob:
    pattern: str
    regex: re.Pattern[str]
    max_depth: int | None  # directories below the base a match can be in; None: unbounded
    name_only: bool  # no `/`: matched against the file name at any depth (grep's `glob`)

    def matches(self, rel_path: str) -> bool:
        subject = rel_path.rsplit("/", 1)[-1] if self.name_only else rel_path
        return self.regex.fullmatch(subject) is not None


def compile_glob(pattern: str, *, name_only_when_plain: bool = False) -> Glob:
    if not pattern or "\x00" in pattern:
        raise GlobError("the pattern is empty")
    if pattern.startswith("/"):
        raise GlobError("the pattern must be relative; put the directory in `path`")
    segments = [s for s in pattern.split("/") if s not in ("", ".")]
    if ".." in segments:
        raise GlobError("the pattern may not contain `..`; put the directory in `path`")
    if not segments:
        raise GlobError("the pattern is empty")
    parts: list[str] = []
    for k, seg in enumerate(segments):
        last = k == len(segments) - 1
        if seg == "**":
            parts.append(".*" if last else "(?:.*/)?")
        else:
            parts.append(_segment(seg) + ("" if last else "/"))
    regex = re.compile("".join(parts), re.DOTALL)
    unbounded = "**" in segments
    name_only = name_only_when_plain and len(segments) == 1 and not unbounded
    return Glob(pattern, regex, None if unbounded or name_only else len(segments) - 1, name_only)
