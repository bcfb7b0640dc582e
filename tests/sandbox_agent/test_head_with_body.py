"""sandbox_agent/head_with_body.py: a response head and its body leave in one send."""

from __future__ import annotations

import asyncio
import socket

from sandbox_agent.head_with_body import JOIN_MAX_BYTES, HeadWithBody

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"


async def _transport_pair() -> tuple[asyncio.Transport, socket.socket, list[bytes]]:
    """A real asyncio transport over one end of a socketpair, the other end to read from,
    and the list of what the transport was asked to send."""
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
    sent: list[bytes] = []
    write = transport.write

    def noted(data: bytes) -> None:
        sent.append(bytes(data))
        write(data)

    transport.write = noted  # type: ignore[method-assign]
    return transport, theirs, sent


def test_a_head_and_its_body_go_out_in_one_write() -> None:
    async def main() -> tuple[list[bytes], bytes]:
        transport, theirs, sent = await _transport_pair()
        held = HeadWithBody(transport, asyncio.get_running_loop())
        held.write(HEAD)
        held.write(b"{}")
        await asyncio.sleep(0)
        received = theirs.recv(4096)
        held.close()
        theirs.close()
        return sent, received

    sent, received = asyncio.run(main())
    assert sent == [HEAD + b"{}"]
    assert received == HEAD + b"{}"


def test_a_large_body_is_not_copied_behind_its_head() -> None:
    body = b"x" * (JOIN_MAX_BYTES + 1)

    async def main() -> list[bytes]:
        transport, theirs, sent = await _transport_pair()
        held = HeadWithBody(transport, asyncio.get_running_loop())
        held.write(HEAD)
        held.write(body)
        held.abort()
        theirs.close()
        return sent

    assert asyncio.run(main()) == [HEAD, body]


def test_a_head_nothing_follows_goes_out_on_the_next_turn() -> None:
    async def main() -> tuple[list[bytes], list[bytes]]:
        transport, theirs, sent = await _transport_pair()
        held = HeadWithBody(transport, asyncio.get_running_loop())
        held.write(HEAD)  # a HEAD answer: no body write
        before = list(sent)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        after = list(sent)
        held.write(b"next")  # not part of the head: passes through
        held.close()
        theirs.close()
        return before, after + sent[len(after):]

    before, after = asyncio.run(main())
    assert before == []
    assert after == [HEAD, b"next"]


def test_other_writes_pass_through_and_close_sends_what_is_held() -> None:
    async def main() -> tuple[list[bytes], bytes]:
        transport, theirs, sent = await _transport_pair()
        held = HeadWithBody(transport, asyncio.get_running_loop())
        held.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 3\r\n\r\nbad")  # a whole answer
        held.write(HEAD)
        held.close()  # a head, then the connection closed: the head still goes
        await asyncio.sleep(0.05)
        received = b""
        while chunk := theirs.recv(4096):
            received += chunk
        theirs.close()
        return sent, received

    sent, received = asyncio.run(main())
    assert sent == [b"HTTP/1.1 400 Bad Request\r\ncontent-length: 3\r\n\r\nbad", HEAD]
    assert received == b"HTTP/1.1 400 Bad Request\r\ncontent-length: 3\r\n\r\nbad" + HEAD
