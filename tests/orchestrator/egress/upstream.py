"""A test upstream on 127.0.0.1 (the only address egress tests ever contact besides the
package registries): `/hello` answers a short body, `/big?n=N` N bytes, `/hold?s=S` waits."""

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
