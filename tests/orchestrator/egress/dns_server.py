"""A tiny DNS server of our own on 127.0.0.1 (UDP), the only name server egress tests ever
ask: names in `fast` answer at once with their address, names matching `slow` answer after
`delay_s` (or never, with None), anything else is NXDOMAIN. It counts the questions it got."""

from __future__ import annotations

import ipaddress
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

TYPE_A, TYPE_AAAA, CLASS_IN = 1, 28, 1


@dataclass
class DnsServer:
    port: int
    fast: dict[str, str]  # name -> IPv4 address
    slow: Callable[[str], bool]
    delay_s: float | None
    questions: Counter[str] = field(default_factory=Counter)


def _question(packet: bytes) -> tuple[str, int, int]:
    """(name, qtype, end of the question) of a query."""
    labels, at = [], 12
    while packet[at]:
        length = packet[at]
        labels.append(packet[at + 1 : at + 1 + length].decode("ascii").lower())
        at += 1 + length
    qtype = struct.unpack("!H", packet[at + 1 : at + 3])[0]
    return ".".join(labels), qtype, at + 5


def _answer(packet: bytes, name: str, qtype: int, end: int, address: str | None) -> bytes:
    query_id = packet[:2]
    if address is None:  # NXDOMAIN
        return query_id + struct.pack("!HHHHH", 0x8183, 1, 0, 0, 0) + packet[12:end]
    if qtype != TYPE_A:  # the name has an A record only: NOERROR, no answer
        return query_id + struct.pack("!HHHHH", 0x8180, 1, 0, 0, 0) + packet[12:end]
    record = struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, 5, 4) + ipaddress.IPv4Address(address).packed
    return query_id + struct.pack("!HHHHH", 0x8180, 1, 1, 0, 0) + packet[12:end] + record


@contextmanager
def loopback_dns(fast: dict[str, str], slow: Callable[[str], bool], delay_s: float | None) -> Iterator[DnsServer]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    server = DnsServer(sock.getsockname()[1], {k.lower(): v for k, v in fast.items()}, slow, delay_s)
    stop = threading.Event()
    timers: list[threading.Timer] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                packet, peer = sock.recvfrom(4096)
            except OSError:
                continue
            try:
                name, qtype, end = _question(packet)
            except (IndexError, UnicodeDecodeError, struct.error):
                continue
            server.questions[name] += 1
            if server.slow(name):
                if server.delay_s is None:
                    continue
                reply = _answer(packet, name, qtype, end, "127.0.0.1")
                timer = threading.Timer(server.delay_s, lambda r=reply, p=peer: sock.sendto(r, p))
                timer.daemon = True
                timers.append(timer)
                timer.start()
                continue
            sock.sendto(_answer(packet, name, qtype, end, server.fast.get(name)), peer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        for timer in timers:
            timer.cancel()
        thread.join(2)
        sock.close()
