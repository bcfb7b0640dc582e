"""Small servers a test runs inside a sandbox with the sandbox's own python3 (standard library
only), and a WebSocket client for the test's side."""

from __future__ import annotations

import base64
import os
import socket
import struct
from urllib.parse import urlsplit

ECHO_HEADERS_APP = r'''
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Echo(BaseHTTPRequestHandler):
    def do_GET(self):
        print("seen", self.path, dict(self.headers), flush=True)
        body = json.dumps({"path": self.path, "headers": list(self.headers.items()), "user": sys.argv[2] if len(sys.argv) > 2 else ""}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

HTTPServer(("127.0.0.1", int(sys.argv[1])), Echo).serve_forever()
'''

COOKIE_APP = r'''
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Cookies(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"cookie": self.headers.get("Cookie", ""), "user": sys.argv[2]}).encode()
        self.send_response(200)
        if self.path.startswith("/set"):  # as wide as an app can ask: the whole host, every path
            self.send_header("Set-Cookie", f"sid=user{sys.argv[2]}; Path=/; HttpOnly")
            self.send_header("Set-Cookie", f"wide=user{sys.argv[2]}; Domain=127.0.0.1; Path=/")
            self.send_header("Set-Cookie", f"deep=user{sys.argv[2]}; Path=/app/")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

HTTPServer(("127.0.0.1", int(sys.argv[1])), Cookies).serve_forever()
'''

# Answers heads that other readers split or join differently than at CRLF: a Set-Cookie after a
# bare LF, and one continued on a folded line, each trying to reach the whole host.
SMUGGLING_COOKIE_APP = r'''
import socket, sys
HEADS = {
    b"/lf": b"HTTP/1.1 200 OK\r\nX-A: 1\nSet-Cookie: lf=1; Path=/\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
    b"/fold": b"HTTP/1.1 200 OK\r\nSet-Cookie: fold=1;\r\n Path=/\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
}
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen(64)
while True:
    conn, _ = server.accept()
    head = b""
    while b"\r\n\r\n" not in head:
        piece = conn.recv(4096)
        if not piece:
            break
        head += piece
    path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"/"
    conn.sendall(HEADS.get(path, b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"))
    conn.close()
'''

STREAMING_APP = r'''
import os, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

class Stream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path.endswith("/ready"):
            self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers(); return
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        def chunk(data):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data)); self.wfile.flush()
        chunk(b"first\n")
        while not os.path.exists("go"):
            time.sleep(0.05)
        chunk(b"last\n")
        self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

HTTPServer(("127.0.0.1", int(sys.argv[1])), Stream).serve_forever()
'''

SILENT_APP = r'''
import socket, sys, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen(1024)
held = []
while True:
    conn, _ = server.accept()
    held.append(conn)  # never read, never answered
'''

WEBSOCKET_ECHO_APP = r'''
import base64, hashlib, socket, struct, sys, threading
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

def read_exact(conn, n):
    data = b""
    while len(data) < n:
        piece = conn.recv(n - len(data))
        if not piece:
            raise EOFError
        data += piece
    return data

def serve(conn):
    head = b""
    while b"\r\n\r\n" not in head:
        piece = conn.recv(4096)
        if not piece:
            return
        head += piece
    lines = head.decode("latin-1").split("\r\n")
    headers = {l.split(":", 1)[0].strip().lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
    if headers.get("upgrade", "").lower() != "websocket":
        conn.sendall(b"HTTP/1.1 426 Upgrade Required\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        conn.close()
        return
    accept = base64.b64encode(hashlib.sha1(headers["sec-websocket-key"].encode() + GUID).digest())
    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    try:
        while True:
            b0, b1 = read_exact(conn, 2)
            length = b1 & 0x7F
            if length == 126:
                length = struct.unpack("!H", read_exact(conn, 2))[0]
            elif length == 127:
                length = struct.unpack("!Q", read_exact(conn, 8))[0]
            mask = read_exact(conn, 4)
            data = bytes(c ^ mask[i % 4] for i, c in enumerate(read_exact(conn, length)))
            if b0 & 0x0F == 8:
                return
            if length < 126:
                frame = bytes([0x82, length])
            elif length < 65536:
                frame = bytes([0x82, 126]) + struct.pack("!H", length)
            else:
                frame = bytes([0x82, 127]) + struct.pack("!Q", length)
            conn.sendall(frame + data)
    except (EOFError, OSError):
        pass
    finally:
        conn.close()

server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen(64)
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
'''


def _read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        piece = sock.recv(n - len(data))
        if not piece:
            raise EOFError("the websocket closed")
        data += piece
    return data


def _frame(payload: bytes) -> bytes:
    mask = os.urandom(4)
    length = len(payload)
    if length < 126:
        head = bytes([0x82, 0x80 | length])
    elif length < 65536:
        head = bytes([0x82, 0x80 | 126]) + struct.pack("!H", length)
    else:
        head = bytes([0x82, 0x80 | 127]) + struct.pack("!Q", length)
    return head + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(payload))


def _read_frame(sock: socket.socket) -> bytes:
    _, b1 = _read_exact(sock, 2)
    length = b1 & 0x7F
    if length == 126:
        length = struct.unpack("!H", _read_exact(sock, 2))[0]
    elif length == 127:
        length = struct.unpack("!Q", _read_exact(sock, 8))[0]
    return _read_exact(sock, length)


def open_websocket(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def websocket_echo(url: str, messages: list[bytes]) -> list[bytes]:
    """Send each message on one WebSocket and return the echoes, in order."""
    with open_websocket(url) as sock:
        echoes = []
        for message in messages:
            sock.sendall(_frame(message))
            echoes.append(_read_frame(sock))
        return echoes
