"""PathSandbox benchmark (targets in docs/performance.md).

1. Median µs per resolve-and-open (and close) of a 3-component path relative to the cwd,
   with 10 allowed roots like a real plan: ours with openat2, ours with the O_NOFOLLOW walk,
   a naive realpath + prefix check + open, and a plain open() for reference.
2. Escapes per 20,000 reads while another process swaps a directory and a symlink to outside
   with renameat2(RENAME_EXCHANGE) as fast as it can: naive vs ours (both resolvers).

Run: .venv/bin/python bench/path_sandbox.py   (prints `name: value unit` lines)
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox_agent.errors import AgentToolError  # noqa: E402
from sandbox_agent.path_sandbox import PathSandbox, Root  # noqa: E402

RUNS = 200_000
RACE_READS = 20_000
INSIDE, OUTSIDE = b"inside\n", b"OUTSIDE SECRET\n"

SWAPPER = textwrap.dedent(
    """
    import ctypes, os, signal, sys
    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": 316, "aarch64": 276}[os.uname().machine]
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
    swaps = 0
    def done(*_):
        print(swaps, flush=True)
        os._exit(0)
    signal.signal(signal.SIGTERM, done)
    print("ready", flush=True)
    while True:
        if libc.syscall(nr, fd, b"d", fd, b"l", 2) == 0:
            swaps += 1
    """
)


def median_us(fn, runs: int = RUNS) -> float:  # type: ignore[no-untyped-def]
    samples = []
    clock = time.perf_counter_ns
    for _ in range(runs):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    return statistics.median(samples) / 1000


def naive_open(root: str, path: str) -> int:
    real = os.path.realpath(path)
    if not (real == root or real.startswith(root + "/")):
        raise PermissionError(path)
    return os.open(real, os.O_RDONLY)


def main() -> None:
    base = Path(tempfile.mkdtemp(prefix="bench-path-sandbox-"))
    try:
        data = base / "data"
        workdir = data / "runtime" / "17" / "s1"
        (workdir / "a" / "b").mkdir(parents=True)
        (workdir / "a" / "b" / "f.txt").write_bytes(INSIDE)
        names = ["uploads/17", "users/17", "deps/17", "tmp/17", "skill-views/17", "userskills/17", "share", "groups/feishu/g1", "groups/feishu/g2"]
        for name in names:
            (data / name).mkdir(parents=True)
        roots = [Root(str(data / "runtime" / "17"), True, "runtime")] + [Root(str(data / n), True, n) for n in names]
        cwd = str(workdir)
        root = str(data / "runtime" / "17")
        full = str(workdir / "a" / "b" / "f.txt")

        sandboxes = {r: PathSandbox(roots, data_root=str(data), user_id=17, resolver=r) for r in ("openat2", "walk")}  # type: ignore[arg-type]
        results: dict[str, float] = {}
        for label, fn in [
            ("openat2", lambda: sandboxes["openat2"].open_file("a/b/f.txt", cwd).close()),
            ("walk", lambda: sandboxes["walk"].open_file("a/b/f.txt", cwd).close()),
            ("naive_realpath_prefix_open", lambda: os.close(naive_open(root, f"{cwd}/a/b/f.txt"))),
            ("plain_open", lambda: os.close(os.open(full, os.O_RDONLY))),
        ]:
            fn()
            results[label] = median_us(fn)
            print(f"resolve_open_median_{label}: {results[label]:.2f} us", flush=True)
        print(f"naive_over_openat2_ratio: {results['naive_realpath_prefix_open'] / results['openat2']:.2f} x")

        # The swap race.
        outside = data / "outside"
        outside.mkdir()
        (outside / "file.txt").write_bytes(OUTSIDE)
        (workdir / "d").mkdir()
        (workdir / "d" / "file.txt").write_bytes(INSIDE)
        os.symlink(outside, workdir / "l")
        swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, cwd], stdout=subprocess.PIPE, text=True)
        assert swapper.stdout is not None and swapper.stdout.readline().strip() == "ready"
        started = time.monotonic()

        def naive_read() -> bytes | None:
            try:
                fd = naive_open(root, f"{cwd}/d/file.txt")
            except OSError:
                return None
            try:
                return os.read(fd, 100)
            finally:
                os.close(fd)

        def ours(resolver: str):  # type: ignore[no-untyped-def]
            def read() -> bytes | None:
                try:
                    with sandboxes[resolver].open_file("d/file.txt", cwd) as opened:
                        return os.read(opened.fd, 100)
                except AgentToolError:
                    return None

            return read

        try:
            for label, read in [("naive", naive_read), ("openat2", ours("openat2")), ("walk", ours("walk"))]:
                escapes = refused = 0
                for _ in range(RACE_READS):
                    content = read()
                    if content == OUTSIDE:
                        escapes += 1
                    elif content is None:
                        refused += 1
                print(f"race_escapes_per_{RACE_READS}_reads_{label}: {escapes} reads", flush=True)
                print(f"race_escape_rate_{label}: {100 * escapes / RACE_READS:.2f} %")
                print(f"race_refused_{label}: {refused} reads")
        finally:
            elapsed = time.monotonic() - started
            swapper.send_signal(signal.SIGTERM)
            out, _ = swapper.communicate(timeout=10)
            print(f"race_swaps_per_second: {int(out.split()[-1]) / elapsed:.0f} swaps/s")
        for sb in sandboxes.values():
            sb.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
