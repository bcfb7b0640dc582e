"""`python -m sandbox_agent --probe --config FILE`: a pod's readiness and liveness check (an
exec probe: a pod may have no IP an httpGet probe could dial). Standard library only, so a
probe costs the sandbox a small process, not an import of the agent's server."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path

from sandbox_agent.unix_path import reachable

CONFIG_MAX_BYTES = 1024 * 1024
ANSWER_MAX_BYTES = 64 * 1024


def probe(config_path: str, timeout_s: float = 2.0) -> bool:
    """Whether the agent of this config answers /health as this config's user, where it
    listens (its loopback port, else its Unix socket)."""
    try:
        with Path(config_path).open("rb") as file:
            config = json.loads(file.read(CONFIG_MAX_BYTES))
        port, user_id = config.get("listen_port"), config["user_id"]
        if port is not None:
            conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=timeout_s)
        else:
            conn = _UnixHTTPConnection(str(config["socket_path"]), timeout_s)
        try:
            conn.request("GET", "/health")
            answer = conn.getresponse()
            health = json.loads(answer.read(ANSWER_MAX_BYTES)) if answer.status == 200 else {}
        finally:
            conn.close()
    except (OSError, ValueError, KeyError, TypeError, http.client.HTTPException):
        return False
    return isinstance(health, dict) and "build" in health and health.get("user_id") in (None, user_id)


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout_s: float) -> None:
        super().__init__("sandbox-agent", timeout=timeout_s)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            with reachable(self._path) as short:
                sock.connect(short)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
