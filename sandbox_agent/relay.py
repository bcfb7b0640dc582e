"""Relaying bytes between two connected stream sockets on an asyncio loop, zero-copy:
`splice(2)` through a pipe moves the data inside the kernel, so a relay costs one wake-up per
up-to-1-MiB chunk instead of two copies through Python. Used by the in-sandbox egress
forwarder and by the orchestrator's egress proxy (the agent cannot import the orchestrator,
so the one copy lives here).

Half-close is kept: when one side ends its sending, the other side's write end is shut down
and the other direction goes on until it ends too.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import socket
from collections.abc import Callable

CHUNK = 1 << 20
SOCKET_BUFFER = 4 << 20
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)

OnBytes = Callable[[int, bool], None]  # (n, from_a) -> None; raising stops the relay


class RelayIdle(Exception):
    """Nothing moved either way for the idle time."""


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool) -> None:
    future = loop.create_future()
    add, remove = (loop.add_writer, loop.remove_writer) if write else (loop.add_reader, loop.remove_reader)
    add(fd, lambda: future.done() or future.set_result(None))
    try:
        await future
    finally:
        remove(fd)


async def _splice_one_way(src: socket.socket, dst: socket.socket, on_bytes: OnBytes, from_a: bool) -> None:
    loop = asyncio.get_running_loop()
    pipe_r, pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        try:
            fcntl.fcntl(pipe_w, _F_SETPIPE_SZ, CHUNK)
        except OSError:
            pass  # the default 64 KiB pipe works too, a little slower
        src_fd, dst_fd = src.fileno(), dst.fileno()
        pending = 0
        while True:
            if pending == 0:
                try:
                    moved = os.splice(src_fd, pipe_w, CHUNK, flags=_SPLICE_FLAGS)
                except BlockingIOError:
                    await _ready(loop, src_fd, write=False)
                    continue
                if moved == 0:  # the sender is done: pass the half-close on
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    return
                pending = moved
                on_bytes(moved, from_a)
            try:
                pending -= os.splice(pipe_r, dst_fd, pending, flags=_SPLICE_FLAGS)
            except BlockingIOError:
                await _ready(loop, dst_fd, write=True)
    finally:
        os.close(pipe_r)
        os.close(pipe_w)


async def _copy_one_way(src: socket.socket, dst: socket.socket, on_bytes: OnBytes, from_a: bool) -> None:
    """Where splice is refused (EINVAL on an odd socket type): plain copies."""
    loop = asyncio.get_running_loop()
    while True:
        data = await loop.sock_recv(src, CHUNK)
        if not data:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            return
        on_bytes(len(data), from_a)
        await loop.sock_sendall(dst, data)


async def _one_way(src: socket.socket, dst: socket.socket, on_bytes: OnBytes, from_a: bool) -> None:
    try:
        await _splice_one_way(src, dst, on_bytes, from_a)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        await _copy_one_way(src, dst, on_bytes, from_a)


async def _watch_idle(last: list[float], idle_s: float) -> None:
    loop = asyncio.get_running_loop()
    while True:
        left = last[0] + idle_s - loop.time()
        if left <= 0:
            raise RelayIdle(f"nothing moved either way for {idle_s:g} s")
        await asyncio.sleep(left)


async def relay(a: socket.socket, b: socket.socket, *, on_bytes: OnBytes | None = None,
                idle_s: float | None = None, until_one_ends: bool = False) -> BaseException | None:  # fmt: skip
    """Copy a->b and b->a until both directions ended (`until_one_ends`: as soon as one
    did, its bytes all passed on, as for one HTTP exchange: the answer's end, or a visitor that
    hung up, ends it, whatever the other side still holds open). Returns the
    exception that stopped it early (an error, RelayIdle, or whatever `on_bytes` raised),
    None after a clean end. The caller closes both sockets."""
    loop = asyncio.get_running_loop()
    for sock in (a, b):
        sock.setblocking(False)
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            try:  # more bytes per wake-up: fewer, larger splices (the kernel caps the size)
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
            except OSError:
                pass
    last = [loop.time()]

    def moved(n: int, from_a: bool) -> None:
        last[0] = loop.time()
        if on_bytes is not None:
            on_bytes(n, from_a)

    tasks = [asyncio.ensure_future(_one_way(a, b, moved, True)), asyncio.ensure_future(_one_way(b, a, moved, False))]
    watchdog = asyncio.ensure_future(_watch_idle(last, idle_s)) if idle_s is not None else None
    try:
        pending: set[asyncio.Future[None]] = set(tasks) | ({watchdog} if watchdog is not None else set())
        while pending - {watchdog}:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = task.exception()
                if error is not None:
                    return error
                if until_one_ends and task in tasks:
                    return None
        return None
    finally:
        everything = [*tasks, *([watchdog] if watchdog is not None else [])]
        for task in everything:
            if not task.done():
                task.cancel()
        await asyncio.gather(*everything, return_exceptions=True)


# --- handing a connection over instead of relaying it ---------------------------------------
# The in-sandbox forwarder does not copy a byte: it passes each accepted TCP connection to the
# host's proxy over the Unix socket (SCM_RIGHTS), marked by one HANDOFF byte, and the proxy
# relays between that connection and the upstream itself. One relay hop instead of two (the
# forwarder's copy halved the download throughput on a two-core host, docs/egress.md). A
# client that speaks HTTP on the Unix socket directly works too: its first bytes are no marker.

HANDOFF = b"\x00"


def send_connection(unix: socket.socket, conn: socket.socket) -> None:
    socket.send_fds(unix, [HANDOFF], [conn.fileno()])


async def receive_connection(unix: socket.socket) -> tuple[socket.socket, bytes]:
    """(the client connection, bytes of it already read). A handed-over connection must be a
    stream socket (anything else the sandbox could pass is refused with ValueError); without a
    handoff the Unix connection itself is the client."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(unix, 4096, 1)
            break
        except BlockingIOError:
            await _ready(loop, unix.fileno(), write=False)
    if not fds:
        return unix, data
    for extra in fds[1:]:
        os.close(extra)
    if data != HANDOFF:
        os.close(fds[0])
        raise ValueError("a handed-over connection must come alone, with the handoff marker")
    try:
        passed = socket.socket(fileno=fds[0])
    except OSError:
        os.close(fds[0])
        raise ValueError("the handed-over descriptor is not a socket") from None
    if passed.type != socket.SOCK_STREAM or passed.family not in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX):
        passed.close()
        raise ValueError("the handed-over socket is not a stream socket")
    passed.setblocking(False)
    unix.close()
    return passed, b""
