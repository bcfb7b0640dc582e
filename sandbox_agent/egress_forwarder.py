"""The sandbox's end of controlled egress (docs/egress.md): a tiny TCP forwarder on
127.0.0.1:{port} that hands every connection it accepts to the orchestrator's proxy on the
user's Unix socket (sandbox_agent/relay.py: the proxy then relays it). It decides nothing: the proxy on the host knows the user from the
socket and applies the policy. Also the proxy settings the user's tools read: environment
variables for shells and pip's and npm's config files in HOME (no secret in any of them).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
import threading
from pathlib import Path

from sandbox_agent.relay import relay, send_connection
from sandbox_agent.unix_path import reachable
from sandbox_agent.wire import EgressConfig

log = logging.getLogger("sandbox_agent.egress")

MANAGED_MARK = "managed by the sandbox agent (egress proxy); rewritten at every agent start"


class Forwarder:
    def __init__(self, config: EgressConfig) -> None:
        self.config = config
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", config.port))
        self._sock.listen(512)
        self._sock.setblocking(False)
        self.port: int = self._sock.getsockname()[1]

    def start(self) -> None:
        threading.Thread(target=self._run, name="egress-forwarder", daemon=True).start()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception:
            log.exception("egress forwarder stopped")

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        running: set[asyncio.Task[None]] = set()  # referenced, so no relay is collected mid-way
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as exc:  # out of fds (the user's own processes): back off
                log.warning("egress forwarder accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            task = asyncio.ensure_future(self._relay(conn))
            running.add(task)
            task.add_done_callback(running.discard)

    async def _relay(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.setblocking(False)
        try:
            try:
                with reachable(self.config.socket_path) as short:
                    await loop.sock_connect(upstream, short)
            except OSError as exc:
                body = (
                    f"The egress proxy is not reachable from this sandbox ({exc.strerror}); "
                    "it comes back with the next tool call. Retry then.\n"
                ).encode()
                head = f"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
                await loop.sock_sendall(conn, head.encode() + body)
                return
            if self.config.hand_over:
                send_connection(upstream, conn)  # the proxy relays it from here on
            else:  # the proxy reads the client's bytes from the Unix connection itself
                await relay(conn, upstream)
        except OSError:
            pass
        finally:
            conn.close()
            upstream.close()


GIT_POST_BUFFER = 64 * 1024 * 1024


def proxy_environment(port: int, ca_file: str | None) -> dict[str, str]:
    """What shells get: the usual proxy variables (both cases: tools read either), and the CA
    bundle for the TLS libraries that do not read the system store."""
    url = f"http://127.0.0.1:{port}"
    env = {
        "HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
        "NO_PROXY": "localhost,127.0.0.1,::1", "no_proxy": "localhost,127.0.0.1,::1",
        "npm_config_proxy": url, "npm_config_https_proxy": url,
    }  # fmt: skip
    if ca_file is not None:
        env.update(SSL_CERT_FILE=ca_file, REQUESTS_CA_BUNDLE=ca_file, PIP_CERT=ca_file, NODE_EXTRA_CA_CERTS=ca_file,
                   npm_config_cafile=ca_file, GIT_SSL_CAINFO=ca_file)  # fmt: skip
    # The proxy forwards a request body by its Content-Length only (no re-framing of chunked
    # bodies: docs/egress.md); git sends a push with a length up to http.postBuffer, chunked past
    # it. Raised from git's 1 MiB so that pushes up to this size go through (held in the
    # sandbox's own memory while sent).
    env.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="http.postBuffer", GIT_CONFIG_VALUE_0=str(GIT_POST_BUFFER))
    return env


def tool_configs(port: int, ca_file: str | None) -> dict[str, str]:
    """pip's and npm's config files (relative to HOME), for tools started without our env."""
    url = f"http://127.0.0.1:{port}"
    pip = [f"# {MANAGED_MARK}", "[global]", f"proxy = {url}"] + ([f"cert = {ca_file}"] if ca_file else [])
    npm = [f"; {MANAGED_MARK}", f"proxy={url}", f"https-proxy={url}"] + ([f"cafile={ca_file}"] if ca_file else [])
    return {".config/pip/pip.conf": "\n".join(pip) + "\n", ".npmrc": "\n".join(npm) + "\n"}


def write_tool_configs(home: str, files: dict[str, str]) -> None:
    """As the sandbox's own uid, into its own HOME: no other user's file can be reached. A
    file the user wrote without our mark is left alone (the environment still applies), and
    so is anything that is not a plain file: the user's own shell may have put a FIFO there,
    whose open would block this agent's start for good (its pod never ready)."""
    for rel, content in files.items():
        path = Path(home) / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            existing = _own_config(path)
            if existing is not None and MANAGED_MARK not in existing:
                log.info("keeping the user's own %s", path)
                continue
            tmp = path.with_name(f".{path.name}.agent-tmp")
            tmp.unlink(missing_ok=True)  # whatever sits there, a FIFO too: a new file is made
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            with os.fdopen(fd, "w") as out:
                out.write(content)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("could not write %s: %s", path, exc)


CONFIG_READ_MAX = 4096  # of an existing config file: enough to find our mark


def _own_config(path: Path) -> str | None:
    """The head of the config file at `path`, None when there is none; something that is not
    a plain file (a FIFO, a device, a link) counts as the user's own, unread."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:  # a symlink (ELOOP), or unreadable
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, CONFIG_READ_MAX).decode("utf-8", "replace")
    finally:
        os.close(fd)


def start_egress(config: EgressConfig, home: str) -> dict[str, str]:
    """Start the forwarder; returns the environment shells get. A port someone else holds
    costs the sandbox its way out, not its agent: the tools still run, without proxy settings."""
    try:
        forwarder = Forwarder(config)
    except OSError as exc:
        log.error("egress forwarder not started on 127.0.0.1:%s: %s", config.port, exc)
        return {}
    forwarder.start()
    write_tool_configs(home, tool_configs(forwarder.port, config.ca_file))
    log.info("egress forwarder listening port=%s socket=%s", forwarder.port, config.socket_path)
    return proxy_environment(forwarder.port, config.ca_file)
