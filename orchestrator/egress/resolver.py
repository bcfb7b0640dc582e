"""Name lookups for the egress proxy without a thread pool: c-ares (pycares) answers on the
proxy's loop, so a lookup that hangs holds no thread, and one user's slow names cannot queue
another user's lookups behind them (the loop's default executor, which `getaddrinfo` used,
has a handful of threads shared by everyone). How many lookups may be in flight is bounded
per user and in total by `caps.LookupGate`, and a lookup past its timeout gives its slot
back at once (c-ares stops asking at the same timeout).

The name servers are the host's (/etc/resolv.conf, /etc/hosts first) unless
ORCH_EGRESS_DNS_SERVERS names others; tests point it at a DNS server of their own on
loopback.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence

import pycares

from orchestrator.egress.policy import IpAddress


class LookupFailed(OSError):
    """The name has no address, or the servers did not answer in time."""


def parse_dns_servers(text: str) -> tuple[str, ...]:
    """ORCH_EGRESS_DNS_SERVERS: `ip` or `ip:port` (`[v6]:port`), separated by commas or spaces."""
    servers = []
    for part in text.replace(",", " ").split():
        host, port = part, ""
        if part.startswith("["):
            host, _, rest = part[1:].partition("]")
            port = rest.removeprefix(":")
        elif part.count(":") == 1:
            host, port = part.split(":")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"{part!r} is not an IP address with an optional :port") from None
        if port and (not port.isdigit() or not 0 < int(port) < 65536):
            raise ValueError(f"{part!r}: the port must be 1-65535")
        servers.append(part)
    return tuple(servers)


class AresResolver:
    """`await resolver(host, port)` -> the addresses of `host`, in the resolver's order."""

    def __init__(self, servers: Sequence[str] = (), *, timeout_s: float = 10.0) -> None:
        # c-ares's own event thread waits on its sockets: one thread for every lookup, never
        # one per lookup. No search domains: the proxy resolves exactly the name it checked.
        self._channel: pycares.Channel | None = pycares.Channel(
            servers=list(servers) or None, timeout=timeout_s, tries=1, flags=pycares.ARES_FLAG_NOSEARCH
        )

    async def __call__(self, host: str, port: int) -> Sequence[IpAddress]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Sequence[IpAddress]] = loop.create_future()

        def settle(result: object, error: int | None) -> None:  # on c-ares's thread
            loop.call_soon_threadsafe(_settle, future, result, error)

        if self._channel is None:
            raise LookupFailed("the resolver is closed")
        self._channel.getaddrinfo(host, port, type=socket.SOCK_STREAM, callback=settle)
        return await future

    def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()


def _settle(future: asyncio.Future[Sequence[IpAddress]], result: object, error: int | None) -> None:
    if future.done():  # timed out and given up already
        return
    if error:
        future.set_exception(LookupFailed(f"{pycares.errno.strerror(error)}"))
        return
    seen: list[IpAddress] = []
    for node in getattr(result, "nodes", ()):
        address = ipaddress.ip_address(node.addr[0].decode())
        if address not in seen:
            seen.append(address)
    future.set_result(seen)
