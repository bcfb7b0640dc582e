"""The proxy's resolver (c-ares) against a DNS server of ours on 127.0.0.1: no other name
server is ever asked. Slow names hold no thread and delay no other lookup."""

from __future__ import annotations

import asyncio
import ipaddress
import time

import pytest

from orchestrator.egress.caps import CapExceeded, LookupGate
from orchestrator.egress.resolver import AresResolver, LookupFailed, parse_dns_servers
from tests.orchestrator.egress.dns_server import loopback_dns


def test_fast_names_answer_while_many_slow_ones_hang() -> None:
    with loopback_dns({"fast.example.test": "127.0.0.1"}, lambda name: name.startswith("slow-"), None) as dns:
        resolver = AresResolver([f"127.0.0.1:{dns.port}"], timeout_s=2.0)

        async def scenario() -> tuple[float, list[object]]:
            slow = [asyncio.ensure_future(resolver(f"slow-{i}.example.test", 443)) for i in range(200)]
            await asyncio.sleep(0.2)
            started = time.monotonic()
            fast = await asyncio.wait_for(resolver("fast.example.test", 443), 1.0)
            took = time.monotonic() - started
            assert list(fast) == [ipaddress.ip_address("127.0.0.1")]
            with pytest.raises(LookupFailed):
                await resolver("nowhere.example.test", 443)  # NXDOMAIN
            local = await resolver("localhost", 443)  # /etc/hosts: no question sent
            assert ipaddress.ip_address("127.0.0.1") in local
            return took, await asyncio.gather(*slow, return_exceptions=True)

        try:
            took, slow = asyncio.run(scenario())
        finally:
            resolver.close()
        assert took < 0.5, took
        assert all(isinstance(r, LookupFailed) for r in slow), slow[:3]  # c-ares gave up at its timeout
        assert "localhost" not in dns.questions


def test_the_lookup_gate_caps_each_user_and_all() -> None:
    gate = LookupGate(per_user=2, total=3)
    gate.admit(1)
    gate.admit(1)
    with pytest.raises(CapExceeded) as mine:
        gate.admit(1)
    assert mine.value.code == "dns_lookups_per_user" and "at most 2" in str(mine.value)
    gate.admit(2)
    with pytest.raises(CapExceeded) as everyone:
        gate.admit(3)
    assert everyone.value.code == "dns_lookups_busy"
    gate.release(1)
    gate.admit(3)
    for user_id in (1, 2, 3):
        gate.release(user_id)
    assert gate.in_flight == {} and gate.in_flight_total == 0


def test_dns_server_settings() -> None:
    from pydantic import ValidationError

    from orchestrator.settings import Settings

    assert parse_dns_servers("127.0.0.1:5353, [::1]:53 10.0.0.2") == ("127.0.0.1:5353", "[::1]:53", "10.0.0.2")
    for bad in ("dns.example", "127.0.0.1:0", "[::1]:x"):
        with pytest.raises(ValueError):
            parse_dns_servers(bad)
    with pytest.raises(ValidationError, match="must be above ORCH_EGRESS_DNS_LOOKUPS_PER_USER"):
        Settings(egress_dns_lookups=8, egress_dns_lookups_per_user=8)
