"""Code kernels in the agent (sandbox_agent/kernels.py, tools/kernels.py): the pure deciders,
and a real driver started with a python that cannot run a kernel."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest

from sandbox_agent import process_tree
from sandbox_agent.errors import AgentToolError
from sandbox_agent.kernels import DRIVER, KernelTable, idle_victims
from sandbox_agent.tools.kernels import IMAGES_MAX, Collected, cut_text, strip_ansi


def test_idle_kernels_are_those_unused_long_enough_and_not_executing() -> None:
    used = {("s", "python", "a"): 0.0, ("s", "python", "b"): 50.0, ("s", "bash", "c"): 0.0}
    assert idle_victims(used, {("s", "bash", "c")}, now=100.0, idle_s=60.0) == [("s", "python", "a")]


def test_tracebacks_lose_their_colours() -> None:
    coloured = "\x1b[0;31mZeroDivisionError\x1b[0m: division by zero\x1b]8;;http://x\x07link\x1b]8;;\x07"
    assert strip_ansi(coloured) == "ZeroDivisionError: division by zero" + "link"


def test_a_long_value_is_cut_with_a_marker() -> None:
    assert cut_text("abc", 10) == "abc"
    assert cut_text("é" * 10, 5) == "éé\n[... 15 bytes omitted ...]"


def test_output_keeps_head_and_tail_within_the_budget() -> None:
    collected = Collected.of(1024, 4096)
    for index in range(10_000):
        collected.take({"ev": "stream", "name": "stdout", "text": f"line {index}\n"})
    collected.take({"ev": "done", "status": "ok"})
    fields = collected.output_fields()
    assert fields["stdout"].startswith("line 0\n") and fields["stdout"].endswith("line 9999\n")
    assert "bytes omitted" in fields["stdout"] and len(fields["stdout"].encode()) <= 1024
    assert fields["truncated"] is True and collected.status == "ok"


def test_results_displays_images_and_errors() -> None:
    collected = Collected.of(1024, 4096)
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"x" * 10).decode()
    collected.take({"ev": "display", "data": {"image/png": png, "text/plain": "<Figure>"}})
    collected.take({"ev": "display", "data": {"text/plain": "shown"}})
    collected.take({"ev": "result", "data": {"text/plain": "42", "text/html": "<b>42</b>", "image/x": "?"}})
    for _ in range(IMAGES_MAX + 3):
        collected.take({"ev": "display", "data": {"image/svg+xml": "<svg/>"}})
    collected.take({"ev": "error", "ename": "E", "evalue": "v", "traceback": ["\x1b[31mone\x1b[0m", "two"]})
    collected.take({"ev": "done", "status": "error"})
    fields = collected.output_fields()
    assert fields["text"] == "42" and fields["data"] == {"text/plain": "42", "text/html": "<b>42</b>"}
    assert fields["stdout"] == "shown\n"  # displayed text reads like printed text
    assert collected.images[0] == ("image/png", b"\x89PNG\r\n\x1a\n" + b"x" * 10)
    assert len(collected.images) == IMAGES_MAX and collected.images_dropped == 4
    assert collected.error == {"ename": "E", "evalue": "v", "traceback": "one\ntwo"} and collected.status == "error"


def _starter(python: str, cwd: Path):  # type: ignore[no-untyped-def]
    def start(marker: str, runtime_dir: str):  # type: ignore[no-untyped-def]
        def popen() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                [python, "-u", DRIVER, "python", runtime_dir], cwd=cwd, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            )  # fmt: skip

        return process_tree.spawn(popen, marker, kept=True)

    return start


def test_a_python_without_ipykernel_says_what_is_missing(tmp_path: Path) -> None:
    bare = subprocess.run(["/usr/bin/python3", "-c", "import ipykernel"], capture_output=True)
    if bare.returncode == 0:
        pytest.skip("this host's /usr/bin/python3 has ipykernel")
    table = KernelTable(max_kernels=2, idle_s=60)
    with pytest.raises(AgentToolError) as refused:
        table.obtain(("s", "python", "default"), _starter("/usr/bin/python3", tmp_path), str(tmp_path))
    assert refused.value.code == "interpreter_unavailable" and "ipykernel" in refused.value.message
    assert refused.value.details["missing"] == "ipykernel"
    assert table.count() == 0 and list(tmp_path.iterdir()) == []  # nothing left: no kernel, no private dir
    with pytest.raises(AgentToolError) as absent:
        table.obtain(("s", "python", "default"), _starter(str(tmp_path / "no-python"), tmp_path), str(tmp_path))
    assert absent.value.code == "interpreter_unavailable" and absent.value.details["missing"] == "python"
