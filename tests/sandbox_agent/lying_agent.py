"""A hostile "agent": a real Unix-socket server that answers every request with what a
sandbox lying on its socket could send. Run as a script (so a test can start it as another
uid): `python lying_agent.py SOCKET MODE`.

Modes: `huge` announces and streams a 300 MiB JSON answer; `unannounced` streams one without
a Content-Length until the client hangs up; `overcap` answers a valid shell result whose
stdout is 1 MiB (within the answer bound, over the output cap); `health` answers /health;
`streamflood` answers a streamed shell with output events without end; `streamforged` with
an output event of a stream that does not exist; `trickle` answers a byte every 0.2 s (a header
line without end), never long silent; `forgedfailures` answers every call with a tool failure of
a new code each time, a `path` that is not a string and details of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HUGE = 300 * 1024 * 1024
_forged = iter(range(10**9))
CHUNK = b"A" * (1024 * 1024)


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            return
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)


def _stream(conn: socket.socket, head: bytes, total: int | None) -> None:
    prefix = b'{"ok": true, "result": {"exit_code": 0, "stderr": "", "timed_out": false, "truncated": false, "stdout": "'
    conn.sendall(head + prefix)
    left = None if total is None else total - len(prefix) - 3  # exactly `total`: valid JSON
    while left is None or left > 0:
        chunk = CHUNK if left is None else CHUNK[:left]
        conn.sendall(chunk)
        if left is not None:
            left -= len(chunk)
    conn.sendall(b'"}}')


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _stream_events(conn: socket.socket, mode: str) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n")
    if mode == "streamforged":
        conn.sendall(_chunk(b'{"event": "output", "stream": "../etc/passwd", "text": "x"}\n'))
        return
    line = json.dumps({"event": "output", "stream": "stdout", "text": "A" * 60000}).encode() + b"\n"
    while True:
        conn.sendall(_chunk(line))


def _serve(conn: socket.socket, mode: str) -> None:
    try:
        while True:
            _read_request(conn)
            if mode == "huge":
                _stream(conn, f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {HUGE}\r\n\r\n".encode(), HUGE)
            elif mode == "unannounced":
                _stream(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n", None)
            elif mode == "trickle":
                for byte in b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 60000:
                    conn.sendall(bytes([byte]))
                    time.sleep(0.2)
            elif mode in ("streamflood", "streamforged"):
                _stream_events(conn, mode)
            elif mode == "forgedfailures":
                n = next(_forged)
                error = {"code": f"forged_{n}", "message": "lies", "path": {"nested": [n]}, "note": "x" * 100}
                body = json.dumps({"ok": False, "error": error}).encode()
                conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            elif mode == "overcap":
                result = {"exit_code": 0, "stdout": "B" * (1024 * 1024), "stderr": "", "timed_out": False, "truncated": False}
                body = json.dumps({"ok": True, "result": result}).encode()
                conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            else:
                body = json.dumps({"build": "x", "uptime_s": 1.0, "busy": 0, "pid": os.getpid()}).encode()
                conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    except OSError:
        pass  # the client hung up: what a refusing client does
    finally:
        conn.close()


def main(path: str, mode: str) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen(16)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_serve, args=(conn, mode), daemon=True).start()


@contextmanager
def lying_agent(base: Path, mode: str, uid: int | None = None) -> Iterator[str]:
    """The lying agent on a socket in `base` (0711), as `uid` when given (root only)."""
    script = base / "lying_agent.py"
    shutil.copy(__file__, script)
    os.chmod(script, 0o644)
    where = base / f"listener-{uid}"
    where.mkdir()
    if uid is not None:
        os.chown(where, uid, uid)
    path = where / f"{mode}.sock"
    identity = {"user": uid, "group": uid} if uid is not None else {}
    python = "/usr/bin/python3" if uid is not None else sys.executable
    proc = subprocess.Popen([python, str(script), str(path), mode], **identity)  # type: ignore[arg-type]
    try:
        deadline = time.monotonic() + 10
        while not listening(path):
            assert proc.poll() is None and time.monotonic() < deadline, "the lying agent did not start"
            time.sleep(0.02)
        yield str(path)
    finally:
        proc.kill()
        proc.wait()


def listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
            return True
        except OSError:
            return False



if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])


def raw_read_bytes_answer(*, announced: int, length: int, body: bytes) -> bytes:
    """A raw read_bytes answer whose result header says `announced` bytes and whose
    Content-Length says `length`, with `body` (which may be shorter) after it."""
    header = json.dumps({"path": "/x", "size": announced, "media_type": "application/octet-stream"})
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {length}\r\n"
        f"X-Tool-Result: {header}\r\n\r\n"
    )
    return head.encode() + body


def answer_once(path: str, answer: bytes, *, tail: int = 0, tail_after_s: float = 0.0) -> threading.Thread:
    """A socket at `path` (in this process) that answers one request with `answer` and hangs
    up: what a sandbox that replaced its agent could send. With `tail`, its last `tail` bytes
    come `tail_after_s` later, as a read of their own (an agent sends in pieces as it likes)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            _read_request(conn)
            try:
                conn.sendall(answer[: len(answer) - tail])
                if tail:
                    time.sleep(tail_after_s)
                    conn.sendall(answer[len(answer) - tail :])
            except BrokenPipeError:  # the client refused the answer before its end
                pass
        server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread
