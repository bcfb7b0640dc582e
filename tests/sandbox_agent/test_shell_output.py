"""Huge shell output (issue 14 item 5): head and tail within one budget, binary reported as
binary, the full output spooled to the session's shell-output/ with bounded rotation. Real
shell calls in-process (the deciders have their own tests below); the API tests with both
backends are in tests/orchestrator/tools/test_shell_output_api.py."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from sandbox_agent.calls import InFlightCall
from sandbox_agent.path_sandbox import PathSandbox
from sandbox_agent.tools.context import ToolContext
from sandbox_agent.tools.search import grep_search
from sandbox_agent.tools.shell import shell
from sandbox_agent.tools.shell_output import SpoolEntry, is_binary, render, rotation_victims, share_budget
from sandbox_agent.wire import CallContext, GrepSearchArgs, ShellArgs
from tests.sandbox_agent.conftest import Tree, tool_context

ERROR_LINE = "error: the build failed at the very end"


def spool_ctx(tree: Tree, sandbox: PathSandbox, **limits: object) -> tuple[ToolContext, Path]:
    spool = tree.workdir / "shell-output"
    spool.mkdir(exist_ok=True)
    base = tool_context(tree, sandbox, **limits)
    call = InFlightCall(CallContext(run_id="r1", session_id="s1", output_dir=str(spool)))
    return ToolContext(base.sandbox, base.config, base.cwd, call), spool


def run(ctx: ToolContext, command: str) -> dict:
    return shell(ctx, ShellArgs(command=command))


def test_item5_three_megabytes_of_random_bytes_are_reported_as_binary_and_spooled(tree: Tree, sandbox: PathSandbox) -> None:
    ctx, spool = spool_ctx(tree, sandbox)
    result = run(ctx, "head -c 3000000 /dev/urandom | tee random.bin")
    assert result["exit_code"] == 0 and result["output_complete"] is True
    assert result["stdout_binary"] is True and result["stdout_bytes"] == 3_000_000
    assert "\ufffd" not in result["stdout"] and len(result["stdout"]) < 300, result["stdout"][:300]
    assert result["stdout"].startswith("[binary output: 3000000 bytes, not shown; the full output is in ")
    spooled = Path(result["stdout_file"])
    assert spooled.parent == spool and result["stdout_file"] in result["stdout"]
    assert hashlib.sha256(spooled.read_bytes()).digest() == hashlib.sha256((tree.workdir / "random.bin").read_bytes()).digest()


def test_item5_two_megabytes_of_text_keep_the_error_at_the_end(tree: Tree, sandbox: PathSandbox) -> None:
    ctx, spool = spool_ctx(tree, sandbox)
    result = run(ctx, f"yes 'compiling module' | head -c 2000000; echo '{ERROR_LINE}' >&2; echo '{ERROR_LINE}'; exit 2")
    assert result["exit_code"] == 2 and result["truncated"] is True
    stdout = result["stdout"]
    assert len(stdout.encode()) + len(result["stderr"].encode()) <= 32 * 1024  # the marker inside the budget
    assert stdout.startswith("compiling module\n") and stdout.endswith(ERROR_LINE + "\n")
    head, marker_and_tail = stdout.split("\n[... ", 1)
    marker, tail = marker_and_tail.split(" ...]\n", 1)
    assert marker == f"{result['stdout_bytes'] - len(head) - len(tail)} bytes omitted; the full output is in {result['stdout_file']}"
    assert result["stderr"] == ERROR_LINE + "\n" and "stderr_file" not in result  # short: shown whole, not spooled
    assert os.path.getsize(result["stdout_file"]) == 2_000_000 + len(ERROR_LINE) + 1
    # the model can search the spool with its own tools
    found = grep_search(ctx, GrepSearchArgs(pattern="build failed", path=result["stdout_file"]))
    assert [m["line"] for m in found["matches"]] == [2_000_000 // len("compiling module\n") + 1]  # after a cut line


def test_item5_small_output_is_not_spooled(tree: Tree, sandbox: PathSandbox) -> None:
    ctx, spool = spool_ctx(tree, sandbox)
    result = run(ctx, "echo hello")
    assert result["stdout"] == "hello\n" and result["truncated"] is False and "stdout_file" not in result
    assert list(spool.iterdir()) == []


def test_item5_the_spool_of_a_session_is_bounded_and_rotated(tree: Tree, sandbox: PathSandbox) -> None:
    ctx, spool = spool_ctx(tree, sandbox, shell_output_cap_bytes=1024, shell_spool_max_bytes=64 * 1024)
    (spool / "notes.txt").write_text("the model's own file: never rotated\n")
    paths = [run(ctx, f"head -c 40000 /dev/zero | tr '\\0' {n}")["stdout_file"] for n in range(6)]
    spooled = sorted(p for p in spool.iterdir() if p.name != "notes.txt")
    assert sum(p.stat().st_size for p in spooled) <= 64 * 1024
    assert spooled[-1] == Path(paths[-1]) and Path(paths[0]) not in spooled
    assert (spool / "notes.txt").exists()
    last = run(ctx, "head -c 40000 /dev/zero | tr '\\0' x")
    assert last["stdout_file_bytes"] == 32 * 1024  # one file holds at most half of the budget
    assert os.path.getsize(last["stdout_file"]) == 32 * 1024


def test_item5_a_spool_dir_replaced_by_a_symlink_is_not_followed(tree: Tree, sandbox: PathSandbox) -> None:
    ctx, spool = spool_ctx(tree, sandbox)
    spool.rmdir()
    outside = tree.p("outside")
    os.symlink(outside, spool)  # what the sandbox's own shell could do
    before = sorted(outside.iterdir())
    result = run(ctx, "yes | head -c 100000")
    assert result["exit_code"] == 0 and "stdout_file" not in result
    assert "bytes omitted ...]" in result["stdout"]  # said plainly: no spool path
    assert sorted(outside.iterdir()) == before


# --- the deciders -----------------------------------------------------------------------------


def test_share_budget_gives_a_short_stream_all_it_needs() -> None:
    assert share_budget([10, 100_000], 1000) == [10, 990]
    assert share_budget([100_000, 100_000], 1000) == [500, 500]
    assert share_budget([5, 5], 1000) == [5, 5]
    assert share_budget([0, 3000], 1000) == [0, 1000]


def test_is_binary() -> None:
    assert is_binary(os.urandom(4096))
    assert is_binary(b"text\x00more")
    assert not is_binary("héllo wörld ✓ ".encode() * 100)
    assert not is_binary("✓".encode() * 100 + "✓".encode()[:2])  # a character cut at the end


def test_render_cuts_at_character_boundaries() -> None:
    data = "✓".encode() * 1000
    shown = render(data[:1000], data[-1000:], len(data), 400, None)
    assert "\ufffd" not in shown.text and shown.cut
    assert shown.text.startswith("✓" * 25) and shown.text.endswith("✓" * 80)
    assert len(shown.text.encode()) <= 400  # the marker included


def test_rotation_removes_the_oldest_first() -> None:
    entries = [SpoolEntry(f"2026010{n}T000000.000000-0000000{n}.stdout", 30) for n in range(1, 5)]
    assert rotation_victims(entries, room=50, max_bytes=100, max_files=10) == [entries[0].name, entries[1].name, entries[2].name]
    assert rotation_victims(entries, room=0, max_bytes=1000, max_files=3) == [entries[0].name, entries[1].name]


def test_item5_the_marker_stays_inside_the_budget_whatever_the_spool_paths_length() -> None:
    from sandbox_agent.tools.shell_output import render

    data = b"compiling module\n" * 10_000
    for spool_path in ("/d/shell-output/x.txt", "/" + "deep-directory-name/" * 40 + "x.txt"):
        shown = render(data[:4096], data[-4096:], len(data), 2048, spool_path)
        assert shown.cut and len(shown.text.encode()) <= 2048, len(shown.text.encode())
        assert spool_path in shown.text and shown.text.startswith("compiling module")
