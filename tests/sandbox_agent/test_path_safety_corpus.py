"""Every case of the ported path-safety corpus (tests/sandbox_agent/path_corpus.py, from
fuzzdb's traversal list, New BSD licence) through every agent tool that takes a path, in
process, on a real PathSandbox over a real tree (both resolvers).

A refusal is a structured error that carries the `path` it refused (as the model sent it, or
resolved against the working directory) and its reason (a known code and a message); an
answer never holds a byte from outside the roots, and nothing outside them is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from sandbox_agent.calls import InFlightCall
from sandbox_agent.errors import AgentToolError
from sandbox_agent.names import escape_text, has_surrogates
from sandbox_agent.path_sandbox import PathSandbox, shown_path
from sandbox_agent.processes import ProcessTable
from sandbox_agent.tools.context import ToolContext
from sandbox_agent.tools.processes import process_start
from sandbox_agent.tools.files import edit_file, read_bytes, read_file, write_bytes, write_file
from sandbox_agent.tools.search import glob_search, grep_search, list_dir
from sandbox_agent.wire import (
    CallContext,
    EditFileArgs,
    GlobSearchArgs,
    GrepSearchArgs,
    ListDirArgs,
    ProcessStartArgs,
    ReadBytesArgs,
    ReadFileArgs,
    WriteBytesArgs,
    WriteFileArgs,
)
from tests.sandbox_agent.conftest import Tree, build_tree, start_agent, stop_agent, tool_context
from tests.sandbox_agent.path_corpus import SECRETS, corpus, sample

# Why a path tool may refuse: each one is a documented error code.
REASONS = frozenset(
    {
        "invalid_arguments",
        "not_found",
        "path_escape",
        "foreign_runtime_path",
        "foreign_upload_path",
        "symlink_escape",
        "not_a_directory",
        "is_a_directory",
        "not_a_regular_file",
        "read_only",
        "no_match",
        "binary_file",
        "symlink_loop",
    }
)

Call = Callable[[ToolContext, str], Any]

# The tools that take a path, each with the case in its path argument; the search tools also
# with the case as their glob.
PATH_TOOLS: dict[str, Call] = {
    "read_file": lambda ctx, p: read_file(ctx, ReadFileArgs(path=p)),
    "read_bytes": lambda ctx, p: read_bytes(ctx, ReadBytesArgs(path=p)),
    "list_dir": lambda ctx, p: list_dir(ctx, ListDirArgs(path=p)),
    "glob_search.path": lambda ctx, p: glob_search(ctx, GlobSearchArgs(pattern="*", path=p)),
    "grep_search.path": lambda ctx, p: grep_search(ctx, GrepSearchArgs(pattern="secret", path=p)),
    "glob_search.pattern": lambda ctx, p: glob_search(ctx, GlobSearchArgs(pattern=p)),
    "grep_search.glob": lambda ctx, p: grep_search(ctx, GrepSearchArgs(pattern="secret", glob=p)),
}
WRITE_TOOLS: dict[str, Call] = {
    "edit_file": lambda ctx, p: edit_file(ctx, EditFileArgs(path=p, old="secret", new="x")),
    "write_file": lambda ctx, p: write_file(ctx, WriteFileArgs(path=p, content="planted")),
    "write_bytes": lambda ctx, p: write_bytes(ctx, WriteBytesArgs(path=p, content_base64="cGxhbnRlZA==")),
}


def accepted_paths(case: str, cwd: str) -> set[str]:
    """How a refusal may name the path it refused: as sent, resolved against the cwd and
    lexically normalized (how every other answer names it), or cut with `...` when it is
    longer than an answer should quote."""
    joined = case if case.startswith("/") else f"{cwd}/{case}"
    resolved = shown_path([p for p in joined.split("/") if p and p != "."])
    return {case, resolved, case[:200] + "...", cwd}


def inside(path: str, roots: list[str]) -> bool:
    return any(posixpath.commonpath([path, root]) == root for root in roots)


def answer_problem(result: Any, roots: list[str]) -> str | None:
    """What is wrong with a successful answer: a byte from outside, or a path outside."""
    if hasattr(result, "model_dump"):  # read_bytes
        text = result.data.decode("utf-8", "replace") + result.path
        paths = [result.path]
    else:
        text = json.dumps(result, ensure_ascii=False, default=str)
        paths = [result["path"]] + [m if isinstance(m, str) else m["path"] for m in result.get("matches", [])]
    leaked = [s for s in SECRETS if s in text]
    if leaked:
        return f"answer holds {leaked}"
    outside = [p for p in paths if not inside(p, roots)]
    return f"answer names paths outside the roots: {outside[:3]}" if outside else None


def refusal_problem(exc: AgentToolError, case: str, cwd: str) -> str | None:
    if exc.code not in REASONS or not exc.message:
        return f"unexplained refusal {exc.code}: {exc.message!r}"
    if exc.path is None:
        return f"{exc.code} without path"
    if exc.path not in accepted_paths(case, cwd):
        return f"{exc.code} names another path: {exc.path!r}"
    return None


def run_corpus(tree: Tree, sandbox: PathSandbox, tools: dict[str, Call]) -> tuple[int, list[str]]:
    """(calls made, problems found) of every case through every tool."""
    ctx = tool_context(tree, sandbox)
    roots = [root.path for root in sandbox.roots]
    cases = corpus(str(tree.workdir))
    problems: list[str] = []
    calls = 0
    for name, call in tools.items():
        for number, case in enumerate(cases):
            calls += 1
            try:
                result = call(ctx, case)
            except AgentToolError as exc:
                problem = refusal_problem(exc, case, ctx.cwd)
            except ValidationError as exc:  # the agent answers these without any path
                problem = f"refused by the argument model: {exc.errors()[0]['msg']}"
            else:
                problem = answer_problem(result, roots)
            if problem is not None:
                problems.append(f"{name}(#{number} {case[:80]!a}): {problem}")
    return calls, problems


def outside_snapshot(base: Path, roots: list[str]) -> dict[str, str]:
    """Every entry below `base` outside the roots: its kind and, for files, its content hash."""
    seen: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if not inside(os.path.join(dirpath, d), roots)]
        for name in dirnames:
            seen[os.path.join(dirpath, name)] = "dir"
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not inside(path, roots):
                with open(path, "rb") as fh:
                    seen[path] = hashlib.sha256(fh.read()).hexdigest()
    return seen


def assert_clean(calls: int, problems: list[str]) -> None:
    shown = "\n".join(problems[:15])
    assert not problems, f"{len(problems)} of {calls} corpus calls went wrong:\n{shown}"


def test_every_read_and_search_of_the_corpus_is_served_inside_or_refused_with_its_path(
    tree: Tree, sandbox: PathSandbox
) -> None:
    roots = [root.path for root in sandbox.roots]
    before = outside_snapshot(tree.data.parent, roots)
    calls, problems = run_corpus(tree, sandbox, PATH_TOOLS)
    assert_clean(calls, problems)
    assert outside_snapshot(tree.data.parent, roots) == before


def test_every_background_process_cwd_of_the_corpus_is_inside_or_refused_with_its_path(
    tree: Tree, sandbox: PathSandbox
) -> None:
    """process_start's `cwd` is a path argument too; a process that starts runs `true`."""
    table = ProcessTable(max_processes=8, spool_bytes=4096, max_runtime_s=30)
    context = CallContext(run_id="r-1", session_id="s-1", output_dir=str(tree.workdir))
    base = tool_context(tree, sandbox)
    ctx = dataclasses.replace(base, call=InFlightCall(context), processes=table)
    roots = [root.path for root in sandbox.roots]
    problems: list[str] = []
    cases = corpus(ctx.cwd)
    try:
        for number, case in enumerate(cases):
            try:
                result = process_start(ctx, ProcessStartArgs(command="true", cwd=case))
            except AgentToolError as exc:
                problem = refusal_problem(exc, case, ctx.cwd)
            else:
                problem = None if inside(result["cwd"], roots) else f"started in {result['cwd']!r}"
            if problem is not None:
                problems.append(f"process_start(#{number} {case[:80]!a}): {problem}")
    finally:
        table.kill_session("s-1")
    assert_clean(len(cases), problems)


def test_every_write_of_the_corpus_lands_inside_or_is_refused_with_its_path(tree: Tree, sandbox: PathSandbox) -> None:
    (tree.data / "etc").mkdir()
    (tree.data / "etc/passwd").write_text("root:x:0:0 outside secret\n")
    roots = [root.path for root in sandbox.roots]
    before = outside_snapshot(tree.data.parent, roots)
    calls, problems = run_corpus(tree, sandbox, WRITE_TOOLS)
    assert_clean(calls, problems)
    assert outside_snapshot(tree.data.parent, roots) == before
    assert (tree.data / "outside/secret.txt").read_text() == "outside secret\n"


@pytest.mark.parametrize("case", ["", "a\x00b", "\ud800", "a/" * 2100 + "x"])
def test_a_refused_argument_names_the_path_it_refused(tree: Tree, sandbox: PathSandbox, case: str) -> None:
    with pytest.raises(AgentToolError) as info:
        read_file(tool_context(tree, sandbox), ReadFileArgs(path=case))
    assert info.value.code == "invalid_arguments"
    assert info.value.path in (case, case[:200] + "...")


# Over the agent's real Unix socket: the wire's JSON (a lone surrogate travels as JSON's
# `\udXXX` escape, the way a model's argument reaches the host), the envelope, the escaping.
SOCKET_TOOLS: dict[str, Callable[[str], tuple[str, dict[str, Any]]]] = {
    "read_file": lambda p: ("read_file", {"path": p}),
    "list_dir": lambda p: ("list_dir", {"path": p}),
    "write_file": lambda p: ("write_file", {"path": p, "content": "planted"}),
    "grep_search.path": lambda p: ("grep_search", {"pattern": "secret", "path": p}),
    "glob_search.pattern": lambda p: ("glob_search", {"pattern": p}),
    "grep_search.glob": lambda p: ("grep_search", {"pattern": "secret", "glob": p}),
}


def on_the_wire(text: str) -> str:
    """How the agent renders a string it answers (sandbox_agent/names.py)."""
    return escape_text(text) if has_surrogates(text) else text


def wire_problem(envelope: dict[str, Any], case: str, cwd: str, roots: list[str]) -> str | None:
    if envelope["ok"]:
        return answer_problem(envelope["result"], roots)
    error = envelope["error"]
    if error["code"] not in REASONS or not error["message"]:
        return f"unexplained refusal {error['code']}: {error['message']!r}"
    if "path" not in error:
        return f"{error['code']} without path"
    accepted = {on_the_wire(p): has_surrogates(p) for p in accepted_paths(case, cwd)}
    if error["path"] not in accepted:
        return f"{error['code']} names another path: {error['path']!r}"
    if accepted[error["path"]] and error.get("path_encoding") != "escaped":
        return "an escaped path without path_encoding"
    return None


def test_a_sample_of_the_corpus_through_the_agent_socket(tmp_path: Path) -> None:
    agent = start_agent(build_tree(tmp_path))
    roots = [root.path for root in agent.tree.roots()]
    cwd = str(agent.tree.workdir)
    unwatched = [*roots, str(agent.tree.p("sockets"))]  # the agent's own socket and config
    before = outside_snapshot(tmp_path, unwatched)
    cases = sample(corpus(cwd), 20)
    problems: list[str] = []
    headers = {"Authorization": f"Bearer {agent.token}", "Content-Type": "application/json"}
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=agent.config.socket_path), base_url="http://agent") as raw:
            for name, request in SOCKET_TOOLS.items():
                for case in cases:
                    tool, arguments = request(case)
                    body = json.dumps({"arguments": arguments, "cwd": cwd}).encode()  # ASCII: surrogates as \udXXX
                    answer = raw.post(f"/v1/tools/{tool}", content=body, headers=headers)
                    assert answer.status_code == 200, answer.text
                    problem = wire_problem(answer.json(), case, cwd, roots)
                    if problem is not None:
                        problems.append(f"{name}({case[:80]!a}): {problem}")
    finally:
        stop_agent(agent)
    assert_clean(len(cases) * len(SOCKET_TOOLS), problems)
    assert outside_snapshot(tmp_path, unwatched) == before
