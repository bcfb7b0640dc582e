"""The ring spool of a background process and its UTF-8 decoding (sandbox_agent/process_spool.py)."""

from __future__ import annotations

import os
import random
from pathlib import Path

from sandbox_agent.process_spool import MAX_RUNS, Ring, decode_run


def test_decoding_never_splits_a_character_and_counts_what_it_replaced() -> None:
    text = "añ€😀"
    data = text.encode()
    for cut in range(len(data) + 1):
        head = decode_run(data[:cut], final=False)
        tail = decode_run(data[head.used :], final=True)
        assert head.text + tail.text == text and head.replaced == tail.replaced == 0, cut
    bad = decode_run(b"ok\xff\xfe!", final=False)
    assert bad.text == "ok\ufffd\ufffd!" and bad.replaced == 2 and bad.used == 5
    # A real U+FFFD in the output is not counted as a replacement.
    assert decode_run("\ufffd".encode(), final=True).replaced == 0
    # A lone lead byte at the very end of the output is replaced once nothing more can come.
    assert decode_run(b"x\xe2", final=False).used == 1
    assert decode_run(b"x\xe2", final=True).replaced == 1


def _ring(tmp_path: Path, cap: int) -> Ring:
    return Ring(os.open(tmp_path / "spool", os.O_RDWR | os.O_CREAT, 0o600), cap)


def test_the_ring_keeps_its_cap_and_its_cursors_never_skip_or_repeat(tmp_path: Path) -> None:
    ring = _ring(tmp_path, 1000)
    rng = random.Random(7)
    written = bytearray()
    streams = []
    for _ in range(400):
        stream = rng.choice(["stdout", "stderr"])
        data = bytes(rng.randrange(97, 123) for _ in range(rng.randrange(1, 40)))
        ring.append(stream, data)
        written += data
        streams += [stream] * len(data)
    assert os.path.getsize(tmp_path / "spool") <= 1000
    piece = ring.read(0, 10_000)
    assert piece.total == len(written) and piece.dropped == piece.start == len(written) - 1000
    position = piece.start
    for chunk in piece.chunks:
        assert chunk.cursor == position
        assert chunk.data == bytes(written[position : position + len(chunk.data)])
        assert set(streams[position : position + len(chunk.data)]) == {chunk.stream}
        position += len(chunk.data)
    assert position == len(written)
    # Reading on from a cursor inside the ring gives exactly the rest.
    middle = ring.read(len(written) - 10, 4)
    assert middle.dropped == 0 and b"".join(c.data for c in middle.chunks) == bytes(written[-10:-6])


def test_more_runs_than_the_index_holds_are_dropped_like_old_bytes(tmp_path: Path) -> None:
    ring = _ring(tmp_path, 1 << 20)
    for index in range(MAX_RUNS + 10):
        ring.append("stdout" if index % 2 else "stderr", b"x")
    piece = ring.read(0, 1 << 20)
    assert piece.dropped == 10 and len(piece.chunks) == MAX_RUNS


def test_one_write_larger_than_the_ring_keeps_its_end(tmp_path: Path) -> None:
    ring = _ring(tmp_path, 100)
    ring.append("stdout", bytes(range(250)))
    piece = ring.read(0, 1000)
    assert piece.start == 150 and b"".join(c.data for c in piece.chunks) == bytes(range(150, 250))


def test_two_writers_at_once_never_overwrite_each_other(tmp_path: Path) -> None:
    """stdout and stderr have a reader thread each: appends race. Every byte written must be
    read back at its cursor, in its stream."""
    import threading

    ring = _ring(tmp_path, 1 << 22)

    def write(stream: str, byte: bytes) -> None:
        for _ in range(3000):
            ring.append(stream, byte * 7)

    threads = [threading.Thread(target=write, args=(name, b)) for name, b in (("stdout", b"o"), ("stderr", b"e"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    piece = ring.read(0, 1 << 22)
    assert piece.total == 2 * 3000 * 7 and piece.dropped == 0
    for chunk in piece.chunks:
        assert chunk.data == (b"o" if chunk.stream == "stdout" else b"e") * len(chunk.data)
    assert sum(len(c.data) for c in piece.chunks if c.stream == "stdout") == 3000 * 7
