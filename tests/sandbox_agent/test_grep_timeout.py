"""grep_search cannot hang the agent: a catastrophically backtracking regex is cut off at the
time limit with a `timeout` error, and the agent answers other calls meanwhile."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from sandbox_agent.errors import AgentToolError
from sandbox_agent.path_sandbox import PathSandbox
from sandbox_agent.tools.search import grep_search
from sandbox_agent.wire import GrepSearchArgs
from tests.sandbox_agent.conftest import Tree, build_tree, start_agent, stop_agent, tool_context

# (a|aa)+$ on 60 a's and a '!': the engine tries every way to split the a's before it fails,
# far more than anyone could wait for (about 1.6 ** 60 steps).
EVIL = r"(a|aa)+$"
EVIL_LINE = "a" * 60 + "!\n"


def test_a_catastrophic_regex_is_cut_off_with_a_timeout_error(tree: Tree, sandbox: PathSandbox) -> None:
    (tree.workdir / "evil.txt").write_text("fine line\n" + EVIL_LINE)
    ctx = tool_context(tree, sandbox, grep_timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(AgentToolError) as info:
        grep_search(ctx, GrepSearchArgs(pattern=EVIL))
    elapsed = time.monotonic() - started
    assert info.value.code == "timeout"
    assert info.value.path == str(tree.workdir / "evil.txt")  # where it got stuck
    assert "0.5 s" in info.value.message and "backtracking" in info.value.message
    assert info.value.details["timeout_s"] == 0.5
    assert elapsed < 5, elapsed
    # the same pattern on harmless input, and ordinary patterns, answer as before
    assert grep_search(ctx, GrepSearchArgs(pattern=EVIL, path="hello.txt"))["matches"] == []
    assert [m["line"] for m in grep_search(ctx, GrepSearchArgs(pattern=r"^wor\w+$", path="hello.txt"))["matches"]] == [2]


def test_the_limit_covers_the_whole_search_not_each_line(tree: Tree, sandbox: PathSandbox) -> None:
    # Many lines that are each slow-ish but under any per-line limit must still stop in time.
    (tree.workdir / "many.txt").write_text(("a" * 22 + "!\n") * 400)
    ctx = tool_context(tree, sandbox, grep_timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(AgentToolError) as info:
        grep_search(ctx, GrepSearchArgs(pattern=EVIL))
    assert info.value.code == "timeout"
    assert time.monotonic() - started < 5


def test_python_re_syntax_is_kept(tree: Tree, sandbox: PathSandbox) -> None:
    (tree.workdir / "code.py").write_text("def f(x):\n    return x  # TODO(bob): tidy\nclass C: pass\n")
    ctx = tool_context(tree, sandbox)
    for pattern, lines in [
        (r"TODO\((?P<who>\w+)\)", [2]),
        (r"^(?:def|class)\s", [1, 3]),
        (r"(?i)return X", [2]),
        (r"x(?=\))", [1]),
    ]:
        found = grep_search(ctx, GrepSearchArgs(pattern=pattern, path="code.py"))["matches"]
        assert [m["line"] for m in found] == lines, pattern
    for bad in ("(", "a{2,1}", "[z-a]"):
        with pytest.raises(AgentToolError) as info:
            grep_search(ctx, GrepSearchArgs(pattern=bad, path="code.py"))
        assert info.value.code == "invalid_arguments", bad


def test_the_agent_stays_responsive_while_a_grep_backtracks(tmp_path: Path) -> None:
    tree = build_tree(tmp_path)
    (tree.workdir / "evil.txt").write_text(EVIL_LINE)
    agent = start_agent(tree, grep_timeout_s=4)
    try:
        outcome: list[object] = []

        def evil_grep() -> None:
            try:
                outcome.append(agent.client.call("grep_search", {"pattern": EVIL}, cwd=str(tree.workdir)))
            except AgentToolError as exc:
                outcome.append(exc)

        started = time.monotonic()
        worker = threading.Thread(target=evil_grep)
        worker.start()
        time.sleep(0.5)  # the grep is backtracking now
        assert agent.client.health(timeout_s=5).busy >= 1
        for _ in range(5):
            asked = time.monotonic()
            assert agent.client.call("read_file", {"path": "hello.txt"}, cwd=str(tree.workdir))["content"] == "hello\nworld\n"
            assert agent.client.health(timeout_s=5).build
            # stdlib `re` would hold the GIL for the whole grep: these would wait ~4 s
            assert time.monotonic() - asked < 1.0
        assert worker.is_alive()  # still grepping while the others were answered
        worker.join(30)
        assert time.monotonic() - started < 15
        (error,) = outcome
        assert isinstance(error, AgentToolError) and error.code == "timeout", error
        assert agent.client.health(timeout_s=5).busy == 0
    finally:
        stop_agent(agent)
