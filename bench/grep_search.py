"""grep_search cost of the time-limited `regex` engine, side by side with stdlib `re`.

In process (no HTTP), on a tree of 300 text files x 200 lines (about 3 MB), the same walk and
caps: `grep_search` as shipped (`regex`, a timeout on every match attempt, GIL released) and
the same code with stdlib `re` (no timeout: one bad pattern freezes the whole agent). Two
patterns: a literal that matches nothing (every line is tried) and a rare regex. Then the
time until a catastrophically backtracking pattern is cut off at a 1 s limit.

Run: .venv/bin/python bench/grep_search.py   (prints `name: value unit` lines)
"""

from __future__ import annotations

import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox_agent.errors import AgentToolError  # noqa: E402
from sandbox_agent.path_sandbox import PathSandbox, Root  # noqa: E402
from sandbox_agent.tools import search  # noqa: E402
from sandbox_agent.tools.context import ToolContext  # noqa: E402
from sandbox_agent.wire import AgentConfig, GrepSearchArgs  # noqa: E402

FILES, LINES, RUNS = 300, 200, 7


class StdlibPattern:
    """stdlib `re` behind the call shape grep_search uses (the timeout is ignored)."""

    def __init__(self, pattern: str) -> None:
        self._compiled = re.compile(pattern)

    def search(self, line: str, timeout: float | None = None) -> Any:
        return self._compiled.search(line)


def timed_grep(ctx: ToolContext, pattern: str) -> float:
    samples = []
    for _ in range(RUNS):
        started = time.perf_counter()
        search.grep_search(ctx, GrepSearchArgs(pattern=pattern))
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def main() -> None:
    base = Path(tempfile.mkdtemp(prefix="bench-grep-"))
    try:
        workdir = base / "runtime" / "17" / "s1"
        for i in range(FILES):
            folder = workdir / f"pkg{i % 10}"
            folder.mkdir(parents=True, exist_ok=True)
            body = "".join(f"    value_{n} = compute(item_{n}, limit={n * 7})  # line {n} of module {i}\n" for n in range(LINES))
            (folder / f"mod{i}.py").write_text(body + ("# FIXME(ann): rare\n" if i % 50 == 0 else ""))
        sandbox = PathSandbox([Root(str(base / "runtime" / "17"), True, "runtime")], data_root=str(base), user_id=17)
        config = AgentConfig(socket_path="/x", token_file="/x", user_id=17, data_root=str(base), home=str(base), tmp_dir=str(base), roots=[])
        ctx = ToolContext(sandbox, config, str(workdir))
        original = search._compile_regex
        for label, pattern in (("no_match_literal", "zzz_not_there"), ("rare_regex", r"FIXME\((\w+)\)")):
            shipped = timed_grep(ctx, pattern)
            search._compile_regex = StdlibPattern  # type: ignore[assignment]
            try:
                stdlib = timed_grep(ctx, pattern)
            finally:
                search._compile_regex = original
            print(f"grep_{label}_regex_with_timeout: {shipped:.1f} ms")
            print(f"grep_{label}_stdlib_re: {stdlib:.1f} ms")
            print(f"grep_{label}_ratio: {shipped / stdlib:.2f} x")
        (workdir / "evil.txt").write_text("a" * 60 + "!\n")
        limited = ToolContext(sandbox, config.model_copy(update={"limits": config.limits.model_copy(update={"grep_timeout_s": 1.0})}), str(workdir))
        started = time.perf_counter()
        try:
            search.grep_search(limited, GrepSearchArgs(pattern=r"(a|aa)+$", path="evil.txt"))
            print("grep_backtracking_cut_off: no (it finished)")
        except AgentToolError as exc:
            assert exc.code == "timeout"
            print(f"grep_backtracking_cut_off_after: {(time.perf_counter() - started) * 1000:.0f} ms (limit 1000 ms)")
        print(f"grep_tree: {FILES} files x {LINES} lines")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
