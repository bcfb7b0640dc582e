"""A TLS upstream on 127.0.0.1 with a CA the test makes (`cryptography`), never trusted by the
host: `/echo` answers the request's headers as JSON, `/stream?s=S` sends its head and one
line, then holds the connection S seconds (an open tunnel to cut)."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from orchestrator.credentials.ca import key_pem, make_ca, mint_host, pem


@dataclass(frozen=True)
class UpstreamCA:
    cert_file: Path  # the test CA's certificate: what the proxy verifies the upstream against
    subject_cn: str


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        url = urlparse(self.path)
        if url.path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"first line\n")
            self.wfile.flush()
            time.sleep(float(parse_qs(url.query).get("s", ["5"])[0]))
            return
        body = json.dumps({"path": self.path, "headers": [[k, v] for k, v in self.headers.items()]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def make_test_ca(directory: Path, common: str = "credentials test upstream CA") -> tuple[UpstreamCA, bytes]:
    """The CA's certificate file, and a PEM chain (key + leaf for 127.0.0.1) it signed."""
    key, cert = make_ca(common)
    leaf_key, leaf = mint_host(key, cert, "127.0.0.1")
    cert_file = directory / "test-upstream-ca.pem"
    cert_file.write_bytes(pem(cert))
    return UpstreamCA(cert_file, common), key_pem(leaf_key) + pem(leaf)


@contextmanager
def tls_upstream(directory: Path, chain: bytes) -> Iterator[int]:
    chain_file = directory / f"upstream-chain-{threading.get_ident()}-{time.monotonic_ns()}.pem"
    chain_file.write_bytes(chain)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain_file)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
