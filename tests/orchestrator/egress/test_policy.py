"""The pure egress decider, as a function: every range a sandbox must never reach is tested
here and never live (a bug would put a packet on the network)."""

from __future__ import annotations

import ipaddress

import pytest

from orchestrator.egress.caps import CapExceeded, CapLimits, ConnectionMeter, UserCaps
from orchestrator.egress.policy import (
    DEFAULT_ALLOW,
    HostPattern,
    InvalidPattern,
    InvalidTarget,
    UserRules,
    Verdict,
    decide_addresses,
    decide_host,
    effective_allow,
    forbidden_range,
    normalize_host,
    parse_absolute_url,
    parse_authority,
    parse_patterns,
    refusal_message,
)

DEFAULTS = parse_patterns(DEFAULT_ALLOW)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.17.0.1", "private"),  # docker's default bridge
        ("172.31.255.254", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link_local"),  # the cloud metadata service
        ("169.254.0.1", "link_local"),
        ("100.64.0.1", "cgnat"),
        ("100.127.255.254", "cgnat"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("255.255.255.255", "reserved"),
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fd00:ec2::254", "ula"),  # a metadata address
        ("fc00::1", "ula"),
        ("fe80::1", "link_local"),
        ("ff02::1", "multicast"),
        ("::ffff:10.0.0.1", "private"),  # v4-mapped: the v4 address decides
        ("::ffff:169.254.169.254", "link_local"),
        ("::ffff:127.0.0.1", "loopback"),
        # The red team's list: each was allowed before the registries were written out whole.
        ("::7f00:1", "loopback"),  # IPv4-compatible 127.0.0.1
        ("::a9fe:a9fe", "link_local"),  # IPv4-compatible 169.254.169.254
        ("64:ff9b::a9fe:a9fe", "link_local"),  # NAT64 of the metadata address
        ("64:ff9b::a00:1", "private"),  # NAT64 of 10.0.0.1
        ("64:ff9b:1::1", "nat64_local"),
        ("64:ff9b:1:ffff::9765:df", "nat64_local"),
        ("2002:a9fe:a9fe::", "link_local"),  # 6to4 of the metadata address
        ("2002:9765:df::1", "6to4"),  # 6to4 of a public address: the relay is never trusted
        ("2001::1", "unspecified"),  # Teredo whose server is 0.0.0.0
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "teredo"),  # a real-looking Teredo address
        ("2001:0:a9fe:a9fe::1", "link_local"),  # Teredo whose server is the metadata address
        ("2001:0:4136:e378::f5ff:fffe", "private"),  # Teredo whose (obfuscated) client is 10.0.0.1
        ("::ffff:0:a00:1", "private"),  # IPv4-translated 10.0.0.1
        ("::ffff:0:9765:df", "ipv4_translated"),
        ("::9765:df", "ipv4_compatible"),
        ("fec0::1", "site_local"),
        ("feff::1", "site_local"),
        ("192.0.0.1", "ietf_protocol"),
        ("192.0.0.9", "ietf_protocol"),  # globally reachable anycast, but in the refused block
        ("192.0.0.170", "ietf_protocol"),
        ("198.18.0.1", "benchmarking"),
        ("198.19.255.254", "benchmarking"),
        ("192.88.99.1", "6to4_relay"),
        ("0.1.2.3", "unspecified"),
        ("100::1", "discard"),
        ("100:0:0:1::1", "dummy_prefix"),
        ("2001:2::1", "ietf_protocol"),  # benchmarking, inside 2001::/23
        ("2001:10::1", "ietf_protocol"),  # ORCHID
        ("2001:1::1", "ietf_protocol"),
        ("5f00::1", "segment_routing"),
        ("4000::1", "reserved"),  # not global unicast (2000::/3)
        ("::2", "unspecified"),  # IPv4-compatible 0.0.0.2
        ("::ffff:ffff:ffff", "reserved"),  # ::ffff:255.255.255.255
        ("8000::1", "reserved"),
        ("64:ff9b::7f00:1", "loopback"),  # NAT64 of 127.0.0.1
    ],
)
def test_forbidden_ranges_are_refused(address: str, reason: str) -> None:
    ip = ipaddress.ip_address(address)
    assert forbidden_range(ip, allow_loopback=False) == reason
    usable, decision = decide_addresses([ip], allow_loopback=False)
    assert usable == () and decision.verdict is Verdict.ADDRESS_FORBIDDEN and decision.reason == reason


REACHABLE = [
    "203.0.113.80", "198.51.100.7", "192.0.2.1",  # documentation ranges, kept on purpose
    "2001:db8::1", "3fff::1",
    "151.101.0.223", "2a04:4e42::223", "2606:4700::1111", "8.8.8.8", "1.1.1.1", "100.128.0.1",
    "172.32.0.1", "192.0.1.255", "192.0.3.0", "198.20.0.1", "223.255.255.254", "2001:200::1",
    "64:ff9b::9765:df",  # NAT64 of 151.101.0.223: where a DNS64 network puts public names
    "::ffff:151.101.0.223",
]


@pytest.mark.parametrize("address", REACHABLE)
def test_public_and_documentation_addresses_stay_reachable(address: str) -> None:
    # 203.0.113.x is where the registries resolve on this machine: non-global for `ipaddress`,
    # but not one of the forbidden ranges.
    ip = ipaddress.ip_address(address)
    assert forbidden_range(ip, allow_loopback=False) is None
    assert decide_addresses([ip], allow_loopback=False)[1].allowed


def test_allow_loopback_opens_loopback_only() -> None:
    assert forbidden_range(ipaddress.ip_address("127.0.0.1"), allow_loopback=True) is None
    assert forbidden_range(ipaddress.ip_address("::1"), allow_loopback=True) is None
    assert forbidden_range(ipaddress.ip_address("10.0.0.1"), allow_loopback=True) == "private"
    assert forbidden_range(ipaddress.ip_address("169.254.169.254"), allow_loopback=True) == "link_local"
    # Loopback through a translation or tunnel form is never the proxy's own loopback.
    for tunnelled in ("::7f00:1", "64:ff9b::7f00:1", "2002:7f00:1::"):
        assert forbidden_range(ipaddress.ip_address(tunnelled), allow_loopback=True) is not None, tunnelled


def test_the_registries_refuse_whatever_python_calls_non_global() -> None:
    # A cross-check, not the source: every address `ipaddress` calls non-global is refused,
    # except the documentation ranges this proxy keeps on purpose (docs/egress.md).
    from orchestrator.egress.policy import SPECIAL_PURPOSE

    documentation = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32", "3fff::/20")]
    samples = [net.network_address for net, _reason in SPECIAL_PURPOSE]
    samples += [net.broadcast_address for net, _reason in SPECIAL_PURPOSE]
    for ip in samples:
        if ip.is_global or any(ip in net for net in documentation if net.version == ip.version):
            continue
        assert forbidden_range(ip, allow_loopback=False) is not None, ip
    for address in REACHABLE:
        assert forbidden_range(ipaddress.ip_address(address), allow_loopback=False) is None, address


def test_only_the_checked_addresses_are_handed_on() -> None:
    mixed = [ipaddress.ip_address(a) for a in ("10.0.0.5", "203.0.113.80", "169.254.169.254")]
    usable, decision = decide_addresses(mixed, allow_loopback=False)
    assert decision.allowed and usable == (ipaddress.ip_address("203.0.113.80"),)


def test_host_patterns() -> None:
    assert decide_host("pypi.org", 443, DEFAULTS).allowed
    assert decide_host("files.pythonhosted.org", 443, DEFAULTS).allowed
    assert not decide_host("pythonhosted.org", 443, DEFAULTS).allowed  # the wildcard is for names below
    assert not decide_host("evilpythonhosted.org", 443, DEFAULTS).allowed
    assert not decide_host("pypi.org", 80, DEFAULTS).allowed  # no port: HTTPS only
    assert not decide_host("pypi.org.evil.example", 443, DEFAULTS).allowed
    assert decide_host("registry.npmjs.org", 443, DEFAULTS).allowed
    any_port = HostPattern.parse("mirror.example:*")
    assert any_port.matches("mirror.example", 8080) and str(any_port) == "mirror.example:*"
    assert HostPattern.parse("[::1]:8080").matches("::1", 8080)
    assert str(HostPattern.parse("Example.COM.:8443")) == "example.com:8443"
    for bad in ("*.", "exa mple.com", "*.10.0.0.1", "host:0", "host:99999", "-bad.com", "a..b", "[::1", "http://x"):
        with pytest.raises(InvalidPattern):
            HostPattern.parse(bad)


def test_user_rules_add_and_remove() -> None:
    rules = UserRules(allow=("127.0.0.1:9000", "pypi.org"), remove=("registry.npmjs.org",))
    effective = [str(p) for p in effective_allow(DEFAULTS, rules)]
    assert effective == ["pypi.org", "*.pythonhosted.org", "127.0.0.1:9000"]


def test_targets_are_parsed_strictly() -> None:
    assert parse_authority("PyPI.org:443") == ("pypi.org", 443)
    assert parse_authority("[::1]:8080") == ("::1", 8080)
    assert parse_absolute_url("http://example.com/a?b") == ("example.com", 80, "/a?b")
    assert parse_absolute_url("http://example.com:8080") == ("example.com", 8080, "/")
    assert parse_absolute_url("http://[::1]/x") == ("::1", 80, "/x")
    for bad in ("example.com", "example.com:http", "exa_mple.com:443", ":443", "[::1]443"):
        with pytest.raises(InvalidTarget):
            parse_authority(bad)
    for bad in ("https://example.com/", "/relative", "http://user:pw@example.com/", "http://exa mple/"):
        with pytest.raises(InvalidTarget):
            parse_absolute_url(bad)
    # Not an IP literal for the allow list (so no pattern "127.0.0.1" matches it); were it ever
    # allowed, the resolver's answer (127.0.0.1) meets the address check.
    assert normalize_host("0x7f.1") == "0x7f.1"
    with pytest.raises(InvalidTarget):
        normalize_host("a" * 300)


def test_the_refusal_says_what_to_do() -> None:
    decision = decide_host("evil.example.invalid", 443, DEFAULTS)
    text = refusal_message("evil.example.invalid", 443, 67, DEFAULTS, decision)
    assert text == (
        "Egress to evil.example.invalid:443 is not allowed for runtime identity 67; allowed here: "
        "pypi.org, *.pythonhosted.org, registry.npmjs.org; ask an admin to allow it."
    )


def test_caps_refuse_and_cut() -> None:
    now = [86400.0 * 10]
    caps = UserCaps(CapLimits(max_connections=2, bytes_per_connection=100, bytes_per_day=150), clock=lambda: now[0])
    caps.admit()
    caps.admit()
    with pytest.raises(CapExceeded) as too_many:
        caps.admit()
    assert too_many.value.code == "too_many_connections"
    caps.release()
    meter = ConnectionMeter(caps)
    meter.charge(60, upstream=False)
    with pytest.raises(CapExceeded) as cut:
        meter.charge(60, upstream=False)
    assert cut.value.code == "connection_bytes_exceeded" and meter.cut is cut.value
    second = ConnectionMeter(caps)
    second.charge(20, upstream=True)
    with pytest.raises(CapExceeded) as daily:
        second.charge(20, upstream=False)
    assert daily.value.code == "daily_bytes_exceeded"
    caps.release()
    caps.release()
    with pytest.raises(CapExceeded):
        caps.admit()  # the day's allowance is used up
    now[0] += 86400
    caps.admit()  # a new UTC day


def test_a_taken_forwarder_port_costs_the_way_out_not_the_agent(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket

    from sandbox_agent.egress_forwarder import start_egress
    from sandbox_agent.wire import EgressConfig

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        env = start_egress(EgressConfig(socket_path=str(tmp_path / "egress.sock"), port=port), str(tmp_path))
    assert env == {}
    env = start_egress(EgressConfig(socket_path=str(tmp_path / "egress.sock"), port=0, ca_file="/ca.pem"), str(tmp_path))
    assert env["HTTPS_PROXY"].startswith("http://127.0.0.1:") and env["PIP_CERT"] == "/ca.pem"
    assert "proxy = " + env["HTTPS_PROXY"] in (tmp_path / ".config/pip/pip.conf").read_text()
    (tmp_path / ".npmrc").write_text("registry=https://mirror.example/\n")  # the user's own: kept
    start_egress(EgressConfig(socket_path=str(tmp_path / "egress.sock"), port=0), str(tmp_path))
    assert (tmp_path / ".npmrc").read_text() == "registry=https://mirror.example/\n"


def test_a_bad_allow_setting_is_one_clear_line() -> None:
    from pydantic import ValidationError

    from orchestrator.settings import Settings, settings_error_lines

    assert Settings(egress_allow="pypi.org, *.example.com:8443 [::1]:9000").egress_allow
    with pytest.raises(ValidationError) as bad:
        Settings(egress_allow="pypi.org, exa mple.com:99999")
    (line,) = settings_error_lines(bad.value)
    assert line.startswith("invalid setting ORCH_EGRESS_ALLOW=") and "port must be 1-65535" in line, line
