"""A credential checked end to end, for the smoke and the tests: an HTTPS echo upstream on
127.0.0.1 with a certificate from a CA made on the spot (never the host's), and the script a
sandbox's shell runs to make one HTTPS request through its way out (a CONNECT to the
in-sandbox forwarder from HTTPS_PROXY, then TLS verified against the sandbox's own bundle,
SSL_CERT_FILE, or not verified: `insecure`, to look at the chain of a plain tunnel). Raw on
purpose: urllib skips the proxy for 127.0.0.1 (NO_PROXY).

The upstream answers `/echo` with the request's headers as JSON, and `/stream?s=S` with its
head and one line, then holds the connection S seconds (an open connection to cut).
"""

from __future__ import annotations

import json
import shlex
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from orchestrator.credentials.ca import key_pem, make_ca, mint_host, pem

UPSTREAM_CA_NAME = "credentials probe upstream CA"


class _Echo(BaseHTTPRequestHandler):
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


def make_upstream_ca(ca_file: Path, common: str = UPSTREAM_CA_NAME) -> bytes:
    """Write a new CA's certificate to `ca_file`; the PEM chain (key and a leaf for
    127.0.0.1) an upstream presents."""
    key, cert = make_ca(common)
    leaf_key, leaf = mint_host(key, cert, "127.0.0.1")
    ca_file.write_bytes(pem(cert))
    return key_pem(leaf_key) + pem(leaf)


@contextmanager
def echo_upstream(chain: bytes, handler: type[BaseHTTPRequestHandler] = _Echo) -> Iterator[int]:
    """The HTTPS echo upstream on 127.0.0.1 presenting `chain` (answering with `handler`, the
    echo unless told); yields its port."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.NamedTemporaryFile(suffix=".pem") as chain_file:  # ssl loads a chain from a file only
        chain_file.write(chain)
        chain_file.flush()
        context.load_cert_chain(chain_file.name)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="credentials-probe-upstream", daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


HTTPS_SCRIPT = r"""
import json, os, socket, ssl, sys
proxy = os.environ["HTTPS_PROXY"].rsplit(":", 1)
target, insecure, extra = sys.argv[1], sys.argv[2] == "insecure", sys.argv[3:]
authority, _, path = target.partition("/")
host = authority.rsplit(":", 1)[0]
s = socket.create_connection((proxy[0].split("//")[1], int(proxy[1])), timeout=30)
s.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    chunk = s.recv(1)
    if not chunk:
        break
    head += chunk
status = int(head.split(b" ")[1]) if head else 0
if status != 200:
    print(json.dumps({"connect": status, "body": s.recv(65536).decode(errors="replace")}))
    sys.exit(0)
if insecure:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
else:
    context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
t = context.wrap_socket(s, server_hostname=host)
peer = ssl.DER_cert_to_PEM_cert(t.getpeercert(binary_form=True))
lines = "".join(f"{h}\r\n" for h in extra)
t.sendall(f"GET /{path} HTTP/1.1\r\nHost: {authority}\r\n{lines}Connection: close\r\n\r\n".encode())
data = b""
while True:
    try:
        chunk = t.recv(1 << 16)
    except (OSError, ssl.SSLError):
        break
    if not chunk:
        break
    data += chunk
head, _, body = data.partition(b"\r\n\r\n")
print(json.dumps({"connect": 200, "status": int(head.split(b" ")[1]) if head else 0, "head": head.decode(errors="replace"),
                  "body": body.decode(errors="replace"), "peer_cert": peer}))
"""


def https_command(target: str, *headers: str, insecure: bool = False) -> str:
    """The shell command for one GET of `target` (`host:port/path`) with `headers` added."""
    return " ".join(["python3", "-c", shlex.quote(HTTPS_SCRIPT), shlex.quote(target), "insecure" if insecure else "verify",
                     *map(shlex.quote, headers)])  # fmt: skip


def echoed_headers(answer: dict[str, object], name: str) -> list[str]:
    """The values of header `name` the echo upstream saw, from the script's answer."""
    body = json.loads(str(answer["body"]))
    return [v for k, v in body["headers"] if k.lower() == name.lower()]
