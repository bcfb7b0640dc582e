"""A test upstream on 127.0.0.1 (the only address egress tests ever contact besides the
package registries): `/hello` answers a short body, `/big?n=N` N bytes, `/hold?s=S` waits, `/host` the Host header
it would route by (Python's parser, like many, also ends a header line at a bare LF)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

HELLO = b"hello from the loopback upstream\n"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        url = urlparse(self.path)
        query = parse_qs(url.query)
        if url.path == "/big":
            n = int(query.get("n", ["1048576"])[0])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            block = b"x" * (256 * 1024)
            while n > 0:
                chunk = block[: min(n, len(block))]
                self.wfile.write(chunk)
                n -= len(chunk)
            return
        if url.path == "/host":  # as a virtual-hosting server routes: by the (first) Host header
            body = (self.headers.get("Host") or "").encode("latin-1", "replace")
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if url.path == "/hold":
            time.sleep(float(query.get("s", ["1"])[0]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(HELLO)))
        self.end_headers()
        self.wfile.write(HELLO)


@contextmanager
def loopback_upstream() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.request_queue_size = 512
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


class RequestCounter:
    """What a request-counting upstream saw: every request line and its Host header, across
    all connections, read as raw bytes (so a request the proxy let through after the first is
    counted even when the upstream would not have answered it)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []  # (request line, Host header)
        self._lock = threading.Lock()

    def add(self, line: str, host: str) -> None:
        with self._lock:
            self.requests.append((line, host))


def _count_requests(data: bytes, counter: RequestCounter) -> None:
    for block in data.split(b"\r\n\r\n"):
        lines = block.split(b"\r\n")
        if not lines[0].split(b" ")[-1].startswith(b"HTTP/1."):
            continue
        host = next((h.split(b":", 1)[1].strip() for h in lines[1:] if h.lower().startswith(b"host:")), b"")
        counter.add(lines[0].decode(errors="replace"), host.decode(errors="replace"))


@contextmanager
def counting_upstream(linger_s: float = 0.5) -> Iterator[tuple[int, RequestCounter]]:
    """An upstream on 127.0.0.1 that answers the first request of a connection with HELLO and
    then keeps reading for `linger_s` (as a lenient server that pipelines regardless of
    `Connection: close` would), counting every request head that arrives."""
    import socket

    counter = RequestCounter()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(linger_s)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(HELLO), HELLO))
            try:
                while chunk := conn.recv(65536):
                    data += chunk
            except OSError:
                pass
            _count_requests(data, counter)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], counter
    finally:
        stop.set()
        thread.join(2)
        server.close()
