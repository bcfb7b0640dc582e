"""The docs and comments stand on their own: no tracked Markdown or Python file cites the
specification's sections, the design notes or their decision ids, none of which is in the
repository. Say the rule itself, or point to a page under docs/ (docs/bots.md,
docs/architecture.md, ...)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SECTION = "\N{SECTION SIGN}"
# What a citation looks like: a section sign (alone or after "SPEC"), a design note by
# number ("seed 00…"), or a decision id such as D7 used as a reference.
CITATION = re.compile("|".join([re.escape(SECTION), r"\bseed 0{2}", r"(?<![\w.\-/])D\d{1,2}(?![\w.\-/])"]))
SKIPPED_DIRS = {".git", ".venv", "node_modules", ".pytest-tmp", ".pytest_cache", "__pycache__", "data", ".wheelhouse"}


def tracked_sources() -> list[Path]:
    """The Markdown and Python files of this checkout: git's list, or (in an export without
    .git) a walk that leaves out the virtualenv, caches and data."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "--", "*.md", "*.py"],
            check=True, capture_output=True, timeout=30,
        ).stdout  # fmt: skip
        return [REPO / name for name in out.decode().split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        found = []
        for root, dirs, files in os.walk(REPO):
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
            found += [Path(root, f) for f in files if f.endswith((".md", ".py"))]
        return found


def citations(text: str) -> list[tuple[int, str]]:
    return [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1) if CITATION.search(line)]


def test_the_pattern_catches_each_kind_of_citation() -> None:
    cited = [
        f"SPEC {SECTION}12: the API",
        f"(seed 002 {SECTION}5.8)",
        f"## Records (seed {SECTION}4)",
        "# seed 000's acceptance table",
        "archive_hint_enabled=owner,  # D6",
        "failed (D7): invalid skills",
    ]
    clean = ["sha256 digest D4F1", "CONTAINER_TOOL_SPECS = (", "a 3D model", "id-D12x", "path/D7/file", "seed 42"]
    assert [line for line in cited if not citations(line)] == []
    assert [line for line in clean if citations(line)] == []


def test_no_tracked_file_cites_the_specification_or_the_design_notes() -> None:
    files = tracked_sources()
    assert any(path.name == "README.md" for path in files), "the file list is empty: nothing was checked"
    hits = []
    for path in files:
        if path == Path(__file__):
            continue  # its examples of what a citation looks like are not citations
        try:
            text = path.read_text(encoding="utf-8")
        except (FileNotFoundError, UnicodeDecodeError):
            continue  # deleted in the working tree, or not text
        hits += [f"{path.relative_to(REPO)}:{number}: {line}" for number, line in citations(text)]
    assert hits == [], "say the rule itself or point to docs/*.md instead:\n" + "\n".join(hits)
