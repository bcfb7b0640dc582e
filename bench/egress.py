"""Egress proxy figures (docs/egress.md): a large download from a loopback upstream through
the whole way out (in-sandbox forwarder on TCP -> the user's Unix socket -> the proxy -> the
upstream) against the same download directly, in one run, and the latency a CONNECT adds;
then (`--part dns`) another user's CONNECT latency while one user floods slowly resolving
names, with lookups in a shared thread pool (as before) and on c-ares with the lookup caps.

usage: .venv/bin/python bench/egress.py [--part all|throughput|dns] [--mib 256] [--connects 300]
Prints `name: value unit` lines. Only 127.0.0.1 is contacted (names: a DNS server of ours).
"""

from __future__ import annotations

import argparse
import os
import asyncio
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.egress.caps import CapLimits, LookupGate, UserCaps  # noqa: E402
from orchestrator.egress.policy import parse_patterns  # noqa: E402
from orchestrator.egress.proxy import EgressProxy, ProxyTimeouts, Resolver, serve_unix  # noqa: E402
from orchestrator.egress.resolver import AresResolver  # noqa: E402
from tests.orchestrator.egress.dns_server import loopback_dns  # noqa: E402

BLOCK = b"x" * (1 << 20)


FORWARDER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from sandbox_agent.egress_forwarder import Forwarder
from sandbox_agent.wire import EgressConfig
f = Forwarder(EgressConfig(socket_path=sys.argv[2], port=0))
f.start()
print(f.port, flush=True)
time.sleep(3600)
"""

UPSTREAM = """
import sys
sys.path.insert(0, sys.argv[1])
from bench.egress import upstream_server
import time
print(upstream_server(), flush=True)
time.sleep(3600)
"""


PROXY = """
import sys, time
sys.path.insert(0, sys.argv[1])
from bench.egress import start_proxy
start_proxy(sys.argv[2], int(sys.argv[3]))
print(0, flush=True)
time.sleep(3600)
"""


def in_process_of_its_own(code: str, *args: str) -> tuple[subprocess.Popen, int]:
    """The forwarder runs in the sandbox's agent and the upstream somewhere else: processes of
    their own here too, so the figures are not one interpreter's lock contention."""
    root = str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen([sys.executable, "-c", code, root, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def read_head(sock: socket.socket) -> bytes:
    """A request or response head, byte by byte (nothing after it is taken), or what came
    before the peer closed."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        if not byte:
            break
        head += byte
    return head


def upstream_server() -> int:
    """A raw HTTP upstream: `GET /N` answers N bytes as fast as the kernel takes them."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(512)

    def serve(conn: socket.socket) -> None:
        with conn:
            head = read_head(conn)
            if not head.endswith(b"\r\n\r\n"):
                return
            target = head.split(b" ")[1].lstrip(b"/").decode()
            size, _, rate = target.partition("@")  # /N or /N@MiB-per-second (a paced upstream)
            n = int(size or 0)
            pace = 1 / int(rate) if rate else 0.0
            conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n".encode())
            start, sent = time.perf_counter(), 0
            while n > 0:
                conn.sendall(BLOCK[: min(n, len(BLOCK))])
                n -= len(BLOCK)
                sent += 1
                if pace:
                    time.sleep(max(0.0, start + sent * pace - time.perf_counter()))

    def accept() -> None:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return server.getsockname()[1]


def start_proxy(socket_path: str, upstream: int) -> None:
    """The real proxy code on a loop of its own, as the orchestrator runs it."""
    limits = CapLimits(max_connections=10_000, bytes_per_connection=1 << 40, bytes_per_day=1 << 50)
    caps = UserCaps(limits)
    proxy = EgressProxy(
        allow_for=lambda _uid: parse_patterns([f"127.0.0.1:{upstream}"]),
        caps_for=lambda _uid: caps,
        report=lambda _record: None,
        allow_loopback=True,
        resolver=AresResolver(),  # never asked: the target is an address
        lookups=LookupGate(per_user=16, total=256),
    )
    ready = threading.Event()

    def run() -> None:
        async def main() -> None:
            listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listening.bind(socket_path)
            listening.listen(512)
            ready.set()
            await serve_unix(listening, lambda conn: proxy.handle(1, conn))

        asyncio.run(main())

    threading.Thread(target=run, daemon=True).start()
    ready.wait(10)


def read_response(sock: socket.socket) -> int:
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    head = read_head(sock)
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    got = 0
    while got < length:
        n = sock.recv_into(view)
        if n == 0:
            break
        got += n
    return got


def tunnel(port: int, upstream: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"CONNECT 127.0.0.1:{upstream} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = read_head(sock)
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def download_mib_s(sock: socket.socket, size: int, rate: int | None = None) -> tuple[float, float]:
    """(MiB/s, CPU seconds of the client)."""
    cpu = time.process_time()
    start = time.perf_counter()
    target = f"{size}@{rate}" if rate else str(size)
    sock.sendall(f"GET /{target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    got = read_response(sock)
    seconds = time.perf_counter() - start
    assert got == size, (got, size)
    sock.close()
    return size / (1 << 20) / seconds, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=("all", "throughput", "dns"), default="all")
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--connects", type=int, default=300)
    parser.add_argument("--dns-seconds", type=float, default=8.0, help="how long user B connects during the flood")
    args = parser.parse_args()
    if args.part in ("all", "throughput"):
        measure_throughput(args)
    if args.part in ("all", "dns"):
        measure_dns_flood(args)


# --- one user's slow lookups against another user's CONNECT ---------------------------------

DNS_TIMEOUT_S = 3.0
FLOOD = 64  # user A's CONNECTs to slow names kept in flight


def pool_resolver(dns_port: int) -> Resolver:
    """How lookups ran before: a blocking lookup (here a stub asking our DNS server, as
    getaddrinfo asks the host's) in the loop's default executor, shared by every user."""
    import ipaddress
    import struct

    def lookup(host: str) -> list:
        question = b"".join(bytes([len(label)]) + label.encode() for label in host.split(".")) + b"\0"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.settimeout(DNS_TIMEOUT_S)
            udp.sendto(struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + question + struct.pack("!HH", 1, 1), ("127.0.0.1", dns_port))
            try:
                reply = udp.recv(512)
            except TimeoutError:
                raise OSError("Temporary failure in name resolution") from None
        return [ipaddress.ip_address(reply[-4:])]

    async def resolve(host: str, port: int) -> list:
        return await asyncio.get_running_loop().run_in_executor(None, lookup, host)

    return resolve


def proxy_for_two_users(tmp: str, name: str, upstream: int, resolver: Resolver, lookups: LookupGate) -> dict[int, str]:
    """The real proxy on a loop of its own, one Unix socket per user (1: the flood, 2: the other)."""
    limits = CapLimits(max_connections=10_000, bytes_per_connection=1 << 40, bytes_per_day=1 << 50)
    caps = {1: UserCaps(limits), 2: UserCaps(limits)}
    proxy = EgressProxy(
        allow_for=lambda _uid: parse_patterns(["*.pythonhosted.org", f"fast.example.test:{upstream}"]),
        caps_for=caps.__getitem__,
        report=lambda _record: None,
        allow_loopback=True,
        timeouts=ProxyTimeouts(resolve_s=DNS_TIMEOUT_S),
        resolver=resolver,
        lookups=lookups,
    )
    paths = {uid: f"{tmp}/{name}-{uid}.sock" for uid in caps}
    ready = threading.Event()

    def run() -> None:
        async def main() -> None:
            tasks = []
            for uid, path in paths.items():
                listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listening.bind(path)
                listening.listen(512)
                tasks.append(serve_unix(listening, lambda conn, uid=uid: proxy.handle(uid, conn)))
            ready.set()
            await asyncio.gather(*tasks)

        asyncio.run(main())

    threading.Thread(target=run, daemon=True).start()
    ready.wait(10)
    return paths


def connect_status(path: str, target: str, timeout_s: float = 30.0) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(path)
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = read_head(sock)
        return int(head.split(b" ")[1]) if head else 0


def other_users_connects(paths: dict[int, str], upstream: int, seconds: float) -> tuple[list[float], list[int], int]:
    """User 1 keeps FLOOD CONNECTs to never-answering names in flight; meanwhile user 2
    connects to a name that answers at once, one after another: (latencies, statuses, flood)."""
    stop = threading.Event()
    flooded = [0]

    def flood(worker: int) -> None:
        i = 0
        while not stop.is_set():
            connect_status(paths[1], f"slow-{worker}-{i}.pythonhosted.org:443")
            flooded[0] += 1
            i += 1

    workers = [threading.Thread(target=flood, args=(w,), daemon=True) for w in range(FLOOD)]
    for worker in workers:
        worker.start()
    time.sleep(0.5)  # the flood's lookups are in flight
    latencies, statuses = [], []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        start = time.perf_counter()
        statuses.append(connect_status(paths[2], f"fast.example.test:{upstream}"))
        latencies.append(time.perf_counter() - start)
    stop.set()
    for worker in workers:
        worker.join(DNS_TIMEOUT_S * 3)
    return latencies, statuses, flooded[0]


def measure_dns_flood(args: argparse.Namespace) -> None:
    upstream = upstream_server()
    slow = lambda name: name.startswith("slow-")  # noqa: E731
    with loopback_dns({"fast.example.test": "127.0.0.1"}, slow, None) as dns, tempfile.TemporaryDirectory() as tmp:
        setups = {
            "before_thread_pool": (pool_resolver(dns.port), LookupGate(per_user=1 << 30, total=1 << 31)),
            "after_c_ares": (AresResolver([f"127.0.0.1:{dns.port}"], timeout_s=DNS_TIMEOUT_S), LookupGate(per_user=16, total=256)),
        }
        for name, (resolver, lookups) in setups.items():
            paths = proxy_for_two_users(tmp, name, upstream, resolver, lookups)
            quiet = []
            for _ in range(20):
                start = time.perf_counter()
                assert connect_status(paths[2], f"fast.example.test:{upstream}") == 200
                quiet.append(time.perf_counter() - start)
            latencies, statuses, flooded = other_users_connects(paths, upstream, args.dns_seconds)
            ok = statuses.count(200)
            print(f"dns_{name}_other_user_connect_quiet_median: {statistics.median(quiet) * 1000:.1f} ms")
            print(f"dns_{name}_other_user_connect_during_flood_median: {statistics.median(latencies) * 1000:.1f} ms")
            print(f"dns_{name}_other_user_connect_during_flood_max: {max(latencies) * 1000:.1f} ms")
            print(f"dns_{name}_other_user_connects_ok: {ok}/{len(statuses)} count")
            print(f"dns_{name}_flood_connects_answered: {flooded} count")


def measure_throughput(args: argparse.Namespace) -> None:
    size = args.mib << 20
    upstream_proc, upstream = in_process_of_its_own(UPSTREAM)
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/egress.sock"
        proxy_proc, _ = in_process_of_its_own(PROXY, path, str(upstream))
        forwarder_proc, forwarder_port = in_process_of_its_own(FORWARDER, path)
        try:
            measure(args, size, upstream, forwarder_port, psutil.Process(proxy_proc.pid))
        finally:
            for proc in (forwarder_proc, proxy_proc, upstream_proc):
                proc.kill()
                proc.wait()


def measure(args: argparse.Namespace, size: int, upstream: int, forwarder_port: int, proxy: psutil.Process) -> None:
    if True:
        direct, proxied = [], []
        proxy_cpu = 0.0
        for _ in range(5):  # interleaved: both see the same machine load
            direct.append(download_mib_s(socket.create_connection(("127.0.0.1", upstream)), size))
            before = sum(proxy.cpu_times()[:2])
            proxied.append(download_mib_s(tunnel(forwarder_port, upstream), size))
            proxy_cpu += sum(proxy.cpu_times()[:2]) - before
        d, p = statistics.median(r for r, _ in direct), statistics.median(r for r, _ in proxied)
        print(f"download_{args.mib}mib_direct: {d:.0f} MiB/s")
        print(f"download_{args.mib}mib_through_proxy: {p:.0f} MiB/s")
        print(f"download_throughput_ratio: {p / d:.2f} x")
        best_d, best_p = max(r for r, _ in direct), max(r for r, _ in proxied)
        print(f"download_throughput_ratio_best_of_5: {best_p / best_d:.2f} x ({best_p:.0f} / {best_d:.0f} MiB/s)")
        print(f"proxy_cpu_per_gib: {proxy_cpu / (5 * size / (1 << 30)) * 1000:.0f} ms")
        print(f"load_average_1min: {os.getloadavg()[0]:.1f} (on {os.cpu_count()} cores)")

        # A registry download is paced by the network, not by loopback: the same downloads from
        # an upstream paced at a few rates, up to ten times a fast registry download.
        for rate in (100, 400, 1000):
            paced = min(64 << 20, rate << 20)
            slow_direct = statistics.median(
                download_mib_s(socket.create_connection(("127.0.0.1", upstream)), paced, rate)[0] for _ in range(2)
            )
            slow_proxied = statistics.median(download_mib_s(tunnel(forwarder_port, upstream), paced, rate)[0] for _ in range(2))
            print(f"download_paced_{rate}mibs_direct: {slow_direct:.0f} MiB/s")
            print(f"download_paced_{rate}mibs_through_proxy: {slow_proxied:.0f} MiB/s")
            print(f"download_paced_{rate}mibs_throughput_ratio: {slow_proxied / slow_direct:.2f} x")

        connect_direct, connect_proxied = [], []
        for _ in range(args.connects):
            start = time.perf_counter()
            socket.create_connection(("127.0.0.1", upstream)).close()
            connect_direct.append(time.perf_counter() - start)
            start = time.perf_counter()
            tunnel(forwarder_port, upstream).close()
            connect_proxied.append(time.perf_counter() - start)
        added = sorted(p - d for p, d in zip(sorted(connect_proxied), sorted(connect_direct)))
        q = statistics.quantiles(connect_proxied, n=100)
        print(f"connect_direct_median: {statistics.median(connect_direct) * 1000:.3f} ms")
        print(f"connect_through_proxy_median: {statistics.median(connect_proxied) * 1000:.3f} ms")
        print(f"connect_through_proxy_p99: {q[98] * 1000:.3f} ms")
        print(f"connect_added_median: {statistics.median(added) * 1000:.3f} ms")


if __name__ == "__main__":
    main()
