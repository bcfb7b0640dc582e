"""A real HTTP server on a loopback port, in a thread of the test process: for tests that
need real sockets (raw request paths, URL fetches, the client SDK, the smoke command)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def live_server(app, port: int | None = None) -> Iterator[str]:
    """Serve `app` (an ASGI app) on 127.0.0.1; yields its base URL."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name=f"live-server-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the live server on port {port} did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def raw_get(base_url: str, target: str, method: str = "GET") -> tuple[int, bytes]:
    """Send exactly `target` as the request target (no client-side normalization)."""
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    response = b"".join(chunks)
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, body


@contextmanager
def serve_process(
    data_dir: str, port: int, extra_env: dict[str, str] | None = None, timeout: float = 60, *, nofile: int | None = None
) -> Iterator[str]:
    """`orchestrator serve` as a real subprocess (as `make run` starts it); yields its URL.
    `nofile`: the process starts with RLIMIT_NOFILE at this figure, soft and hard (a host whose
    descriptor limit is small)."""
    import os
    import resource
    import subprocess
    import sys

    def limit_descriptors() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    from tests.conftest import KEPT_ENV

    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_") or k in KEPT_ENV}
    # Disk quotas off unless a test asks (loop images cost an mkfs and a loop device each).
    env.update({"ORCH_DATA_DIR": data_dir, "ORCH_DISK_QUOTA": "off", **(extra_env or {})})
    log_path = f"{data_dir}.serve.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "serve", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=limit_descriptors if nofile is not None else None,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(process, url, log_path, timeout, "orchestrator serve")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_health(process, url: str, log_path, timeout: float, what: str) -> None:
    """Until `url`/healthz answers; a RuntimeError with the log's tail when `process` exits
    first or `timeout` passes."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited early:\n{open(log_path).read()[-3000:]}")
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not answer:\n{open(log_path).read()[-3000:]}") from None
            time.sleep(0.1)
