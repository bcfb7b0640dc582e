"""What a sandbox's shell runs for an HTTPS request through its way out: a CONNECT to the
in-sandbox forwarder (taken from HTTPS_PROXY), then TLS verified against the sandbox's own CA
bundle (SSL_CERT_FILE), or not verified at all (`--insecure`, to look at the chain a plain
tunnel carries). Raw on purpose: urllib skips the proxy for 127.0.0.1 (NO_PROXY)."""

from __future__ import annotations

import shlex

SCRIPT = r"""
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
issuer = t.getpeercert(binary_form=True)
from_der = ssl.DER_cert_to_PEM_cert(issuer)
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
                  "body": body.decode(errors="replace"), "peer_cert": from_der}))
"""


def https_command(target: str, *headers: str, insecure: bool = False) -> str:
    """`target` is `host:port/path`; `headers` are extra request header lines."""
    return " ".join(["python3", "-c", shlex.quote(SCRIPT), shlex.quote(target), "insecure" if insecure else "verify",
                     *map(shlex.quote, headers)])  # fmt: skip
