"""What a sandbox's shell runs to use its way out: a raw HTTP client of the in-sandbox
forwarder on 127.0.0.1:$port (taken from HTTP_PROXY, as tools do). Raw on purpose: urllib
would skip the proxy for 127.0.0.1 (NO_PROXY), and the test must see the proxy's answer."""

from __future__ import annotations

import shlex

SCRIPT = r"""
import collections, json, os, socket, sys, time
proxy = os.environ["HTTP_PROXY"].rsplit(":", 1)
mode, target = sys.argv[1], sys.argv[2]

def forwarder():
    return socket.create_connection((proxy[0].split("//")[1], int(proxy[1])), timeout=30)

def read_head(s):
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            break
        head += chunk
    return head, int(head.split(b" ")[1]) if head else 0

if mode == "flood":  # argv[4] (200) CONNECTs at once to target.format(i), held open for argv[3] seconds
    socks, statuses, bodies, slowest = [], collections.Counter(), set(), collections.defaultdict(float)
    started = time.monotonic()
    for i in range(int(sys.argv[4]) if len(sys.argv) > 4 else 200):
        s = forwarder()
        s.sendall(f"CONNECT {target.format(i)} HTTP/1.1\r\nHost: {target.format(i)}\r\n\r\n".encode())
        socks.append(s)
    for s in socks:
        _, status = read_head(s)
        statuses[status] += 1
        slowest[status] = max(slowest[status], time.monotonic() - started)
        if status != 200:
            bodies.add(s.recv(4096).decode(errors="replace").strip())
    time.sleep(float(sys.argv[3]))
    print(json.dumps({"statuses": statuses, "bodies": sorted(bodies), "slowest_s": slowest}))
    sys.exit(0)
s = forwarder()
if mode == "connect":
    host, _, path = target.partition("/")
    s.sendall(f"CONNECT {host} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    head, status = read_head(s)
    if status != 200:
        body = s.recv(65536)
        print(json.dumps({"status": status, "body": body.decode(errors="replace"), "head": head.decode(errors="replace")}))
        sys.exit(0)
    s.sendall(f"GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
elif mode == "raw":  # argv[2] is the request bytes, base64: sent as they are
    import base64
    s.sendall(base64.b64decode(target))
else:
    s.sendall(f"GET http://{target} HTTP/1.1\r\nHost: {target.partition('/')[0]}\r\n\r\n".encode())
data = b""
while True:
    try:
        chunk = s.recv(1 << 16)
    except OSError:
        break
    if not chunk:
        break
    data += chunk
head, _, body = data.partition(b"\r\n\r\n")
status = int(head.split(b" ")[1]) if head else 0
print(json.dumps({"status": status, "body": body[:2000].decode(errors="replace"), "length": len(body), "head": head.decode(errors="replace")}))
"""


def command(mode: str, target: str, *more: str) -> str:
    """`mode`: "get" (plain-HTTP proxy request), "connect" (a tunnel, then a GET inside it),
    "raw" (`target` is the base64 of bytes sent as they are) or "flood" (`more[1]`, default 200,
    tunnels at once to `target.format(i)`, held open for `more[0]` seconds)."""
    return " ".join(["python3", "-c", shlex.quote(SCRIPT), mode, shlex.quote(target), *map(shlex.quote, more)])
