"""The swap race: another process exchanges a directory and a symlink to outside
with renameat2(RENAME_EXCHANGE) as fast as it can, on the other core, while reads, writes,
listings and greps run through the tools. Zero escapes in at least 1,000,000 operations.

The same race makes a realpath-then-open check leak (checked below), so the race is real.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sandbox_agent.errors import AgentToolError
from sandbox_agent.path_sandbox import PathSandbox, Root
from sandbox_agent.tools.files import read_file, write_file
from sandbox_agent.tools.search import grep_search, list_dir
from sandbox_agent.wire import GrepSearchArgs, ListDirArgs, ReadFileArgs, WriteFileArgs
from tests.sandbox_agent.conftest import USER, build_tree, start_agent, stop_agent, tool_context

OPERATIONS = int(os.environ.get("RACE_OPS", 1_000_000))
INSIDE, OUTSIDE = "inside content\n", "OUTSIDE SECRET\n"
MARKER = "outside-only-marker"

SWAPPER = textwrap.dedent(
    """
    import ctypes, os, signal, sys
    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": 316, "aarch64": 276}[os.uname().machine]
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
    pairs = [(a.encode(), b.encode()) for a, b in (p.split(":") for p in sys.argv[2:])]
    swaps = 0
    def done(*_):
        print(swaps, flush=True)
        os._exit(0)
    signal.signal(signal.SIGTERM, done)
    print("ready", flush=True)
    while True:
        for a, b in pairs:
            if libc.syscall(nr, fd, a, fd, b, 2) == 0:  # RENAME_EXCHANGE
                swaps += 1
    """
)


@dataclass
class Race:
    proc: subprocess.Popen[str]
    started: float = field(default_factory=time.monotonic)

    def stop(self) -> tuple[int, float]:
        """(swaps, swaps per second)."""
        elapsed = time.monotonic() - self.started
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=10)
        swaps = int(out.split()[-1])
        return swaps, swaps / elapsed


def race_tree_into(data: Path, workdir: Path) -> tuple[Path, Path, Path]:
    """Two directory/link pairs in the workdir, swapped by the swapper: `d` with `l` (an
    absolute link to outside) and `d2` with `l2` (a relative link leaving through `..`)."""
    outside = data / "outside"
    for name in ("d", "d2"):
        (workdir / name / "sub").mkdir(parents=True)
        (workdir / name / "file.txt").write_text(INSIDE)
        (workdir / name / "sub" / "deep.txt").write_text(INSIDE)
    (outside / "file.txt").write_text(OUTSIDE)
    (outside / MARKER).write_text(OUTSIDE)
    (outside / "sub").mkdir()
    (outside / "sub" / "deep.txt").write_text(OUTSIDE)
    os.symlink(outside, workdir / "l")
    os.symlink("../../../outside", workdir / "l2")
    return data, workdir, outside


def race_tree(base: Path) -> tuple[Path, Path, Path]:
    tree = build_tree(base)
    return race_tree_into(tree.data, tree.workdir)


def start_swapper(workdir: Path) -> Race:
    proc = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(workdir), "d:l", "d2:l2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return Race(proc)


def outside_state(outside: Path) -> dict[str, str]:
    return {str(p.relative_to(outside)): p.read_text() for p in sorted(outside.rglob("*")) if p.is_file()}


@pytest.fixture
def race_setup(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    yield race_tree(tmp_path)


def naive_read(root: str, path: str) -> str | None:
    """realpath + prefix check + open: the classic check-then-use."""
    try:
        real = os.path.realpath(path)
    except OSError:  # realpath itself trips over the swap now and then
        return None
    if not (real == root or real.startswith(root + "/")):
        return None
    try:
        with open(real) as fh:
            return fh.read()
    except OSError:
        return None


@pytest.mark.slow
def test_the_race_is_real_for_a_realpath_check(race_setup: tuple[Path, Path, Path]) -> None:
    data, workdir, _ = race_setup
    root = str(data / "runtime" / "17")
    race = start_swapper(workdir)
    leaks = 0
    try:
        for i in range(200_000):
            if naive_read(root, str(workdir / "d" / "file.txt")) == OUTSIDE:
                leaks += 1
                if leaks >= 3:
                    break
    finally:
        race.stop()
    assert leaks >= 3, "the swap race did not make the naive check leak: the race test would prove nothing"


@dataclass
class Tally:
    ops: int = 0
    escapes: list[str] = field(default_factory=list)
    refused: int = 0


def worker(sandbox: PathSandbox, ctx_factory, stop: threading.Event, tally: Tally, seed: int) -> None:  # type: ignore[no-untyped-def]
    ctx = ctx_factory()
    paths = ["d/file.txt", "l/file.txt", "d2/file.txt", "l2/file.txt", "d/sub/deep.txt", "l/sub/deep.txt"]
    dirs = ["d", "l", "d2", "l2", "d/sub", "l/sub"]
    i = seed
    while not stop.is_set():
        i += 1
        kind = i % 20
        try:
            if kind < 16:  # reads dominate, as in real use
                content = read_file(ctx, ReadFileArgs(path=paths[i % len(paths)]))["content"]
                if content != INSIDE:
                    tally.escapes.append(f"read {paths[i % len(paths)]}: {content!r}")
            elif kind == 16:
                write_file(ctx, WriteFileArgs(path=f"{dirs[i % 4]}/written-{seed}.txt", content="w"))
            elif kind in (17, 18):
                names = [e["name"] for e in list_dir(ctx, ListDirArgs(path=dirs[i % len(dirs)]))["entries"]]
                if MARKER in names:
                    tally.escapes.append(f"list {dirs[i % len(dirs)]}: {names}")
            else:
                found = grep_search(ctx, GrepSearchArgs(pattern="OUTSIDE", path=dirs[i % 4]))["matches"]
                if found:
                    tally.escapes.append(f"grep {dirs[i % 4]}: {found}")
        except AgentToolError as exc:
            # Refused (the path was the link at that instant) or gone mid-swap: both fine.
            if exc.code not in ("path_escape", "not_found", "not_a_directory", "conflict"):
                tally.escapes.append(f"unexpected {exc.code}: {exc.message}")
            tally.refused += 1
        tally.ops += 1


def run_race(data: Path, workdir: Path, outside: Path, *, resolver: str, operations: int, threads: int = 3) -> None:
    before = outside_state(outside)
    sandbox = PathSandbox(
        [Root(str(data / "runtime" / "17"), True, "runtime")], data_root=str(data), user_id=USER, resolver=resolver  # type: ignore[arg-type]
    )
    from tests.sandbox_agent.conftest import Tree

    tree = Tree(data, workdir)
    race = start_swapper(workdir)
    stop = threading.Event()
    tallies = [Tally() for _ in range(threads)]
    pool = [
        threading.Thread(target=worker, args=(sandbox, lambda: tool_context(tree, sandbox), stop, tallies[k], k * 7919))
        for k in range(threads)
    ]
    started = time.monotonic()
    for t in pool:
        t.start()
    try:
        while sum(t.ops for t in tallies) < operations and not any(t.escapes for t in tallies):
            time.sleep(0.2)
            assert time.monotonic() - started < 900, "the race test is far too slow"
    finally:
        stop.set()
        for t in pool:
            t.join()
        swaps, rate = race.stop()
        sandbox.close()
    ops = sum(t.ops for t in tallies)
    escapes = [e for t in tallies for e in t.escapes]
    refused = sum(t.refused for t in tallies)
    print(f"\nrace resolver={resolver}: {ops} ops, {refused} refused, {swaps} swaps ({rate:.0f}/s), "
          f"{time.monotonic() - started:.1f} s, escapes={len(escapes)}")
    assert escapes == []
    assert ops >= operations
    assert refused > ops // 100, "the swaps hardly ever hit: the race proved nothing"
    assert rate > 10_000, f"only {rate:.0f} swaps/s"
    assert outside_state(outside) == before


@pytest.mark.slow
def test_a_million_operations_under_the_swap_race_never_escape(race_setup: tuple[Path, Path, Path]) -> None:
    data, workdir, outside = race_setup
    run_race(data, workdir, outside, resolver="auto", operations=OPERATIONS)


@pytest.mark.slow
def test_the_walk_fallback_under_the_swap_race(race_setup: tuple[Path, Path, Path]) -> None:
    data, workdir, outside = race_setup
    run_race(data, workdir, outside, resolver="walk", operations=200_000)


@pytest.mark.slow
def test_the_live_agent_under_the_swap_race(tmp_path: Path) -> None:
    """A shorter run through the real agent over its socket."""
    import concurrent.futures

    agent = start_agent(build_tree(tmp_path / "a"))
    data = agent.tree.data
    workdir = agent.tree.workdir
    try:
        _, _, outside = race_tree_into(data, workdir)
        before = outside_state(outside)
        race = start_swapper(workdir)
        cwd = str(workdir)

        def one(i: int) -> str | None:
            path = ["d/file.txt", "l/file.txt", "d2/sub/deep.txt", "l2/sub/deep.txt"][i % 4]
            try:
                if i % 10 == 9:
                    agent.client.call("write_file", {"path": f"{path.split('/')[0]}/w.txt", "content": "w"}, cwd=cwd)
                    return None
                if i % 10 == 8:
                    names = [e["name"] for e in agent.client.call("list_dir", {"path": path.split("/")[0]}, cwd=cwd)["entries"]]
                    return f"list {names}" if MARKER in names else None
                content = agent.client.call("read_file", {"path": path}, cwd=cwd)["content"]
                return None if content == INSIDE else f"read {path}: {content!r}"
            except AgentToolError as exc:
                return None if exc.code in ("path_escape", "not_found", "not_a_directory", "conflict") else exc.code

        try:
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                results = list(pool.map(one, range(20_000)))
        finally:
            swaps, rate = race.stop()
        escapes = [r for r in results if r]
        print(f"\nlive agent race: {len(results)} calls, {swaps} swaps ({rate:.0f}/s), escapes={len(escapes)}")
        assert escapes == []
        assert outside_state(outside) == before
    finally:
        stop_agent(agent)

