"""Credential injection figures (docs/credentials.md, docs/performance.md): one small HTTPS
GET through the egress proxy when it injects a credential (TLS terminated with the deployment
CA's host certificate, a second TLS session to the upstream) against the same GET through a
plain tunnel to the same loopback upstream; and the same injected GET right after the host
certificate cache was emptied (a certificate minted in the handshake) against a cached one.

usage: .venv/bin/python bench/credentials.py [--requests 200]
Prints `name: value unit` lines. Only 127.0.0.1 is contacted; the upstream runs in a process
of its own, the proxy on a loop and thread of its own as the orchestrator runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measure import bench_dir, pct  # noqa: E402
from orchestrator.credentials.ca import DeploymentCA  # noqa: E402
from orchestrator.credentials.injection import CredentialInjection  # noqa: E402
from orchestrator.credentials.keys import new_key, parse_keys  # noqa: E402
from orchestrator.credentials.model import validate_spec  # noqa: E402
from orchestrator.credentials.probe import make_upstream_ca  # noqa: E402
from orchestrator.credentials.store import CredentialStore  # noqa: E402
from orchestrator.egress.caps import CapLimits, LookupGate, UserCaps  # noqa: E402
from orchestrator.egress.policy import parse_patterns  # noqa: E402
from orchestrator.egress.proxy import EgressProxy, serve_unix  # noqa: E402
from orchestrator.egress.resolver import AresResolver  # noqa: E402
from orchestrator.state_schema import STATE_MIGRATIONS
from orchestrator.state_store import StateStore  # noqa: E402

INJECTED, TUNNELLED = 1, 2  # user 1 has a credential for the upstream, user 2 none

UPSTREAM = """
import sys, time
sys.path.insert(0, sys.argv[1])
from orchestrator.credentials.probe import echo_upstream
with echo_upstream(open(sys.argv[2], "rb").read()) as port:
    print(port, flush=True)
    time.sleep(3600)
"""


def start_proxy(socket_dir: Path, upstream: int, injection: CredentialInjection) -> dict[int, str]:
    limits = CapLimits(max_connections=10_000, bytes_per_connection=1 << 40, bytes_per_day=1 << 50)
    caps = UserCaps(limits)
    proxy = EgressProxy(
        allow_for=lambda _uid: parse_patterns([f"127.0.0.1:{upstream}"]), caps_for=lambda _uid: caps,
        report=lambda _record: None, allow_loopback=True, resolver=AresResolver(),
        lookups=LookupGate(per_user=16, total=256), credentials=injection,
    )  # fmt: skip
    paths = {user: str(socket_dir / f"{user}.sock") for user in (INJECTED, TUNNELLED)}
    ready = threading.Event()

    def run() -> None:
        async def main() -> None:
            servers = []
            for user, path in paths.items():
                listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listening.bind(path)
                listening.listen(512)
                servers.append(serve_unix(listening, lambda conn, user=user: proxy.handle(user, conn)))
            ready.set()
            await asyncio.gather(*servers)

        asyncio.run(main())

    threading.Thread(target=run, daemon=True).start()
    ready.wait(10)
    return paths


def https_get(socket_path: str, upstream: int, context: ssl.SSLContext) -> float:
    started = time.perf_counter()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.connect(socket_path)
        raw.sendall(f"CONNECT 127.0.0.1:{upstream} HTTP/1.1\r\nHost: 127.0.0.1:{upstream}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += raw.recv(1)
        assert head.startswith(b"HTTP/1.1 200"), head
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(f"GET /echo HTTP/1.1\r\nHost: 127.0.0.1:{upstream}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    return time.perf_counter() - started


def report(name: str, samples: list[float]) -> None:
    print(f"{name}_median: {statistics.median(samples) * 1000:.2f} ms")
    print(f"{name}_p99: {pct(samples, 0.99) * 1000:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    base = bench_dir("credentials-")
    upstream_process = None
    try:
        upstream_ca = base / "upstream-ca.pem"
        chain_file = base / "chain.pem"
        chain_file.write_bytes(make_upstream_ca(upstream_ca))
        upstream_process = subprocess.Popen(
            [sys.executable, "-c", UPSTREAM, str(Path(__file__).resolve().parents[1]), str(chain_file)], stdout=subprocess.PIPE, text=True
        )
        assert upstream_process.stdout is not None
        upstream = int(upstream_process.stdout.readline())
        store = StateStore(base / "state.db", STATE_MIGRATIONS)
        store.open()
        credentials = CredentialStore(store, parse_keys(new_key(), source="bench"), grant_max_s=3600)
        secret = "bench-secret-0123456789"
        spec = validate_spec("bench", [f"127.0.0.1:{upstream}"], "Authorization", "Bearer {secret}", None, secret)
        credentials.put(INJECTED, spec, secret, actor="bench")
        ca = DeploymentCA(base / "ca-private", base / "sandbox-bundle.pem", Path("/nonexistent"))
        injection = CredentialInjection(credentials, ca, upstream_ca)
        paths = start_proxy(base, upstream, injection)
        trusts_ours = ssl.create_default_context(cafile=str(base / "sandbox-bundle.pem"))
        trusts_upstream = ssl.create_default_context(cafile=str(upstream_ca))
        for _ in range(20):  # warm both paths (and the host certificate)
            https_get(paths[INJECTED], upstream, trusts_ours)
            https_get(paths[TUNNELLED], upstream, trusts_upstream)
        injected, tunnelled, minted, cached = [], [], [], []
        for _ in range(args.requests):  # interleaved: both see the same load of the machine
            injected.append(https_get(paths[INJECTED], upstream, trusts_ours))
            tunnelled.append(https_get(paths[TUNNELLED], upstream, trusts_upstream))
        for _ in range(min(args.requests, 100)):
            ca._cache.clear()  # the next handshake mints the host certificate
            injection._mints.clear()  # and the user's bucket of new ones never runs dry here
            minted.append(https_get(paths[INJECTED], upstream, trusts_ours))
            cached.append(https_get(paths[INJECTED], upstream, trusts_ours))
        mint_only = []
        for i in range(100):
            t0 = time.perf_counter()
            ca.context_for(f"h{i}.bench.invalid")
            mint_only.append(time.perf_counter() - t0)
        report("https_get_injected", injected)
        report("https_get_plain_tunnel", tunnelled)
        print(f"injection_overhead_median: {(statistics.median(injected) - statistics.median(tunnelled)) * 1000:.2f} ms")
        report("https_get_host_cert_first", minted)
        report("https_get_host_cert_cached", cached)
        print(f"host_cert_mint_median: {statistics.median(mint_only) * 1000:.2f} ms")
        store.close()
    finally:
        if upstream_process is not None:
            upstream_process.kill()
            upstream_process.wait()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
