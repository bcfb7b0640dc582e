"""A path-safety corpus: the path arguments a hostile model may send, as data (pure).

Ported from fuzzdb's `attack/path-traversal/traversals-8-deep-exotic-encoding.txt`
(github.com/fuzzdb-project/fuzzdb, New BSD licence). Only its data is reused: the spellings of
`..` and of a separator it combines (plain, percent-encoded once and twice, overlong UTF-8,
`0x` hex, IIS `%u` wide characters, doubled and mixed separators) and its padding families
(a long name, a run of `./`, a long run of dots before the climb). The generator is ours: each
dot-dot spelling with each separator, 2, 3 and 8 levels deep (from a session's working
directory: the user's runtime dir, the data root, far above it), before a target that really
exists there (another user's secret, a file outside every root, /etc/passwd).

Each case is then sent as written, made absolute, and as a careless decoder would pass it on
(percent-decoded once and twice, `%uXXXX` decoded): that yields real `..`, real NUL bytes
(the classic `%00` suffix) and bytes that are not UTF-8. `EDGE_CASES` adds the argument
shapes no traversal list spells but every path tool must refuse clearly: empty, NUL, lone
surrogates a JSON string can carry, a name or a path longer than the kernel takes.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

# fuzzdb's spellings of `..`
DOT_DOTS = (
    "..",
    "...",
    "....",
    "%2e%2e",
    "%252e%252e",
    "%c0%2e%c0%2e",
    "%c0%ae%c0%ae",
    "%25c0%25ae%25c0%25ae",
    "0x2e0x2e",
    "%%32%65%%32%65",
    "%uff0e%uff0e",
)
# fuzzdb's spellings of a separator
SEPARATORS = (
    "/",
    "\\",
    "//",
    "///",
    "\\\\",
    "%2f",
    "%5c",
    "%252f",
    "%255c",
    "%c0%af",
    "%c1%9c",
    "%c0%2f",
    "%c0%5c",
    "%25c0%25af",
    "%25c1%259c",
    "0x2f",
    "0x5c",
    "%%32%66",
    "%%35%63",
    "%u2215",
    "%u2216",
    "%uEFC8",
    "%uF025",
)
# How deep the climb goes from the working directory `{data}/runtime/17/s1`, and what lies
# there: another user's runtime dir, the data root's `outside/`, something far above.
TARGETS = {2: "18/s9/secret.txt", 3: "outside/secret.txt", 8: "etc/passwd"}
# The classic NUL-byte suffixes of a traversal (a filter checks the extension, C stops at NUL).
SUFFIXES = ("", "%00", "%00.png")
# What a successful escape would return: no tool answer may ever contain one of these.
SECRETS = ("18's secret", "outside secret", "root:x:0:0")


def _padding_families() -> list[str]:
    out: list[str] = []
    for depth, target in TARGETS.items():
        climb = "../" * depth
        out.append("A" * 255 + "/" + "../" * (depth + 1) + target)  # a long name, then one more level up
        out.append("./" * 150 + climb + target)
        out.append("." * 74 + "/" + climb + target)
        out.append(".\\" * 50 + "..\\" * depth + target)
        out.append("/.//..//" * depth + target)
        out.append("/./\\/./" * depth + target)
        out.append("/\\../" * depth + target)
        out.append("/..\\/" * depth + target)
    return out


def traversals() -> list[str]:
    """fuzzdb's combinations, as written."""
    out: list[str] = []
    for dots in DOT_DOTS:
        for sep in SEPARATORS:
            for depth, target in TARGETS.items():
                suffixes = SUFFIXES if depth == 3 else ("",)
                for suffix in suffixes:
                    out.append((dots + sep) * depth + target + suffix)
    return out + _padding_families()


_WIDE = re.compile(r"%u([0-9a-fA-F]{4})")


def decoded(text: str) -> str:
    """What a careless decoder passes on: `%uXXXX` and percent escapes decoded once, bytes that
    are not UTF-8 kept as lone surrogates (how Python decodes a file name)."""
    return unquote(_WIDE.sub(lambda m: chr(int(m.group(1), 16)), text), errors="surrogateescape")


def edge_cases(workdir: str) -> list[str]:
    """Argument shapes every path tool must refuse clearly (ours, not fuzzdb's)."""
    return [
        "",
        "\x00",
        "a\x00b",
        "hello.txt\x00.png",
        f"{workdir}/hello.txt\x00",
        "\ud800",  # a lone surrogate: JSON's "\ud800", no UTF-8 at all
        "/\ud800/x",
        "\udcff\ud800",
        "x/\udfff",
        "n" * 256,  # a name the kernel refuses (NAME_MAX)
        "é" * 128,  # 256 bytes in UTF-8
        "a/" * 2100 + "x",  # longer than PATH_MAX
        "/" + "d/" * 2048,
    ]


def corpus(workdir: str) -> list[str]:
    """Every case once, in a stable order: as written, absolute, decoded once and twice."""
    seen: dict[str, None] = {}
    for case in traversals():
        for variant in (case, "/" + case, decoded(case), decoded(decoded(case))):
            seen.setdefault(variant, None)
    for case in edge_cases(workdir):
        seen.setdefault(case, None)
    return list(seen)


def sample(cases: list[str], every: int) -> list[str]:
    """Every `every`-th case plus the edge cases: what goes over a real socket."""
    edges = set(edge_cases(""))
    return [c for i, c in enumerate(cases) if i % every == 0 or c in edges]
