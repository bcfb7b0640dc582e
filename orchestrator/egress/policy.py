"""The egress decider, pure: which host names a runtime user may reach, and which resolved
addresses a connection may go to. Values in, verdicts out; no DNS, no sockets.

Two checks, in this order (docs/egress.md):
1. the host name (and port) against the user's allow list, before any DNS lookup, so a name
   not on the list is never even resolved;
2. every address an allowed name resolved to against the IANA special-purpose registries
   (written out below as data), an IPv6 form carrying an IPv4 address judged as that IPv4
   address too. Not "every non-global address" of `ipaddress`: it misses some (fec0::/10,
   IPv4-compatible forms) and refuses the documentation ranges, where on some networks the
   public registries resolve.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

DEFAULT_PORTS = (443,)  # a pattern without a port allows HTTPS only
DEFAULT_ALLOW = ("pypi.org", "*.pythonhosted.org", "registry.npmjs.org")
MAX_HOST_CHARS = 253
MAX_PATTERNS = 200

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


def _registry(entries: Sequence[tuple[str, str | None]]) -> tuple[tuple[IpNetwork, str | None], ...]:
    return tuple((ipaddress.ip_network(net), reason) for net, reason in entries)


# The IANA special-purpose address registries, whole (v4 and v6), plus the multicast and
# reserved blocks of the address-space registries. Each entry: the block and the reason a
# connection there is refused, or None for a block that stays reachable. A block the
# registry calls not globally reachable is refused whole, even where a few anycast services
# inside it are marked reachable (PCP, TURN, AMT): none of them is a package registry. The
# documentation ranges stay reachable on purpose: they route nowhere on the public internet,
# and on some networks (this project's test hosts among them) the registries resolve there.
SPECIAL_PURPOSE_V4 = _registry(
    [
        ("0.0.0.0/8", "unspecified"),  # "this network", RFC 791 / RFC 1122
        ("10.0.0.0/8", "private"),  # RFC 1918
        ("100.64.0.0/10", "cgnat"),  # shared address space, RFC 6598
        ("127.0.0.0/8", "loopback"),  # RFC 1122
        ("169.254.0.0/16", "link_local"),  # RFC 3927; holds the 169.254.169.254 metadata service
        ("172.16.0.0/12", "private"),  # RFC 1918; holds docker's default bridges
        ("192.0.0.0/24", "ietf_protocol"),  # IETF protocol assignments, RFC 6890 (DS-Lite RFC 7335,
        #                                    dummy RFC 7600, PCP RFC 7723, TURN RFC 8155, NAT64 discovery RFC 8880)
        ("192.0.2.0/24", None),  # TEST-NET-1, documentation, RFC 5737
        ("192.31.196.0/24", None),  # AS112-v4, RFC 7535: globally reachable
        ("192.52.193.0/24", None),  # AMT, RFC 7450: globally reachable
        ("192.88.99.0/24", "6to4_relay"),  # deprecated 6to4 relay anycast, RFC 7526
        ("192.168.0.0/16", "private"),  # RFC 1918
        ("192.175.48.0/24", None),  # direct delegation AS112 service, RFC 7534: globally reachable
        ("198.18.0.0/15", "benchmarking"),  # RFC 2544
        ("198.51.100.0/24", None),  # TEST-NET-2, documentation, RFC 5737
        ("203.0.113.0/24", None),  # TEST-NET-3, documentation, RFC 5737
        ("224.0.0.0/4", "multicast"),  # RFC 5771
        ("240.0.0.0/4", "reserved"),  # RFC 1112; holds 255.255.255.255, limited broadcast (RFC 919, RFC 8190)
    ]
)
SPECIAL_PURPOSE_V6 = _registry(
    [
        ("::/128", "unspecified"),  # RFC 4291
        ("::1/128", "loopback"),  # RFC 4291
        ("::ffff:0:0/96", None),  # IPv4-mapped, RFC 4291: judged as its IPv4 address
        ("::ffff:0:0:0/96", "ipv4_translated"),  # SIIT, RFC 2765: its IPv4 address may refuse first
        ("::/96", "ipv4_compatible"),  # deprecated, RFC 4291: its IPv4 address may refuse first
        ("64:ff9b::/96", None),  # NAT64 well-known prefix, RFC 6052: judged as its IPv4 address
        ("64:ff9b:1::/48", "nat64_local"),  # local-use IPv4/IPv6 translation, RFC 8215
        ("100::/64", "discard"),  # discard-only, RFC 6666
        ("100:0:0:1::/64", "dummy_prefix"),  # dummy IPv6 prefix, RFC 9780
        ("2001::/32", "teredo"),  # RFC 4380, RFC 8190: its IPv4 addresses may refuse first
        ("2001::/23", "ietf_protocol"),  # IETF protocol assignments, RFC 2928 (benchmarking RFC 5180,
        #                                  ORCHID RFC 4843 / RFC 7343, AMT RFC 7450, AS112 RFC 7535, drone ID RFC 9374)
        ("2001:db8::/32", None),  # documentation, RFC 3849
        ("2002::/16", "6to4"),  # RFC 3056: its IPv4 address may refuse first
        ("2620:4f:8000::/48", None),  # direct delegation AS112 service, RFC 7534: globally reachable
        ("3fff::/20", None),  # documentation, RFC 9637
        ("5f00::/16", "segment_routing"),  # SRv6 SIDs, RFC 9602
        ("fc00::/7", "ula"),  # unique local, RFC 4193; holds fd00:ec2::254, a metadata address
        ("fe80::/10", "link_local"),  # RFC 4291
        ("fec0::/10", "site_local"),  # deprecated site-local, RFC 3879
        ("ff00::/8", "multicast"),  # RFC 4291
    ]
)
SPECIAL_PURPOSE = SPECIAL_PURPOSE_V4 + SPECIAL_PURPOSE_V6
# Only 2000::/3 is allocated as global unicast (IANA IPv6 address space, RFC 4291); anything
# else the tables above do not name is refused as reserved.
GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")
IPV4_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
SIX_TO_FOUR = ipaddress.ip_network("2002::/16")
TEREDO = ipaddress.ip_network("2001::/32")


class InvalidPattern(ValueError):
    """An allow-list entry that is not `host`, `*.domain` or either with `:port`."""


class InvalidTarget(ValueError):
    """A request target that names no valid host and port."""


def normalize_host(raw: str) -> str:
    """Lower-case host name without a trailing dot, or an IP literal in its canonical form.
    Raises InvalidTarget for anything else (no wildcard, no empty label, no odd characters)."""
    host = raw.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    host = host.removesuffix(".")
    if not host or len(host) > MAX_HOST_CHARS or not all(_LABEL.match(label) for label in host.split(".")):
        raise InvalidTarget(f"{raw[:80]!r} is not a valid host name")
    return host


def literal_address(host: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


@dataclass(frozen=True)
class HostPattern:
    """`pypi.org` (that name), `*.pythonhosted.org` (any name below it, not the domain
    itself), optionally `:port` or `:*`; no port means 443."""

    host: str  # without the "*." of a wildcard
    wildcard: bool
    ports: tuple[int, ...] | None  # None: any port

    @classmethod
    def parse(cls, text: str) -> HostPattern:
        raw = text.strip()
        host_part, ports = raw, DEFAULT_PORTS
        if raw.startswith("["):  # [v6]:port
            end = raw.find("]")
            if end < 0:
                raise InvalidPattern(f"{text!r}: unclosed '['")
            host_part, rest = raw[: end + 1], raw[end + 1 :]
            ports = _ports(text, rest[1:]) if rest.startswith(":") else DEFAULT_PORTS
            if rest and not rest.startswith(":"):
                raise InvalidPattern(f"{text!r}: unexpected text after ']'")
        elif raw.count(":") == 1:
            host_part, port_text = raw.split(":")
            ports = _ports(text, port_text)
        wildcard = host_part.startswith("*.")
        try:
            host = normalize_host(host_part[2:] if wildcard else host_part)
        except InvalidTarget:
            raise InvalidPattern(f"{text!r} is not a host name, '*.domain' or an IP address, with an optional :port") from None
        if wildcard and literal_address(host) is not None:
            raise InvalidPattern(f"{text!r}: a wildcard needs a domain name")
        return cls(host, wildcard, ports)

    def matches(self, host: str, port: int) -> bool:
        if self.ports is not None and port not in self.ports:
            return False
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host

    def __str__(self) -> str:
        name = f"*.{self.host}" if self.wildcard else (f"[{self.host}]" if ":" in self.host else self.host)
        if self.ports == DEFAULT_PORTS:
            return name
        return f"{name}:*" if self.ports is None else f"{name}:{self.ports[0]}"


def _ports(text: str, port_text: str) -> tuple[int, ...] | None:
    if port_text == "*":
        return None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidPattern(f"{text!r}: the port must be 1-65535 or '*'")
    return (int(port_text),)


def split_allow_setting(text: str) -> list[str]:
    """ORCH_EGRESS_ALLOW: patterns separated by commas and/or whitespace."""
    return [part for part in text.replace(",", " ").split() if part]


def parse_patterns(texts: Iterable[str]) -> tuple[HostPattern, ...]:
    patterns = tuple(HostPattern.parse(t) for t in texts if t.strip())
    if len(patterns) > MAX_PATTERNS:
        raise InvalidPattern(f"at most {MAX_PATTERNS} patterns")
    return patterns


@dataclass(frozen=True)
class UserRules:
    """An admin's changes to the default list for one user: extra patterns, and default
    patterns taken away (by their exact text)."""

    allow: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()


def effective_allow(defaults: Sequence[HostPattern], rules: UserRules) -> tuple[HostPattern, ...]:
    removed = {str(HostPattern.parse(r)) for r in rules.remove}
    kept = [p for p in defaults if str(p) not in removed]
    extra = [p for p in parse_patterns(rules.allow) if p not in kept]
    return (*kept, *extra)


class Verdict(str, Enum):
    ALLOWED = "allowed"
    HOST_NOT_ALLOWED = "host_not_allowed"
    ADDRESS_FORBIDDEN = "address_forbidden"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str  # machine-readable detail: the range's name, "not_on_list", "ok"

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.ALLOWED


def decide_host(host: str, port: int, allow: Sequence[HostPattern]) -> Decision:
    """Step 1, before any lookup. `host` is normalized (normalize_host)."""
    if any(p.matches(host, port) for p in allow):
        return Decision(Verdict.ALLOWED, "ok")
    return Decision(Verdict.HOST_NOT_ALLOWED, "not_on_list")


def _registry_reason(address: IpAddress) -> tuple[bool, str | None]:
    """(listed, reason) of the first registry block holding `address`."""
    for net, reason in SPECIAL_PURPOSE:
        if net.version == address.version and address in net:
            return True, reason
    return False, None


def embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 translation or tunnel form carries (IPv4-mapped,
    IPv4-translated, IPv4-compatible, NAT64, 6to4, Teredo's server and client), or ()."""
    value = int(address)
    low = ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if address in IPV4_MAPPED or address in IPV4_TRANSLATED or address in NAT64_WELL_KNOWN:
        return (low,)
    if address in IPV4_COMPATIBLE and value > 1:  # :: and ::1 are themselves
        return (low,)
    if address in SIX_TO_FOUR:
        return (ipaddress.IPv4Address((value >> 80) & 0xFFFFFFFF),)
    if address in TEREDO:  # server in bits 32-63, client obfuscated (inverted) in the last 32
        return (ipaddress.IPv4Address((value >> 64) & 0xFFFFFFFF), ipaddress.IPv4Address(~value & 0xFFFFFFFF))
    return ()


def forbidden_range(address: IpAddress, *, allow_loopback: bool) -> str | None:
    """The reason `address` may not be reached (the name of its registry block, or of the
    IPv4 address it carries), or None when it may."""
    if isinstance(address, ipaddress.IPv6Address):
        if address in IPV4_MAPPED:
            return forbidden_range(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF), allow_loopback=allow_loopback)
        for carried in embedded_ipv4(address):  # judged as IPv4, loopback never allowed through a form
            reason = forbidden_range(carried, allow_loopback=False)
            if reason is not None:
                return reason
    if allow_loopback and any(address in net for net in LOOPBACK if net.version == address.version):
        return None
    listed, reason = _registry_reason(address)
    if listed:
        return reason
    if isinstance(address, ipaddress.IPv6Address) and address not in GLOBAL_UNICAST_V6:
        return "reserved"
    return None


def decide_addresses(
    addresses: Sequence[IpAddress], *, allow_loopback: bool
) -> tuple[tuple[IpAddress, ...], Decision]:
    """Step 2: the resolved addresses a connection may use (in resolver order) and the verdict.
    Refused when none is left; the reason names the first forbidden range met."""
    usable, first_reason = [], None
    for address in addresses:
        reason = forbidden_range(address, allow_loopback=allow_loopback)
        if reason is None:
            usable.append(address)
        elif first_reason is None:
            first_reason = reason
    if usable:
        return tuple(usable), Decision(Verdict.ALLOWED, "ok")
    return (), Decision(Verdict.ADDRESS_FORBIDDEN, first_reason or "no_address")


def refusal_message(host: str, port: int, user_id: int, allow: Sequence[HostPattern], decision: Decision) -> str:
    """What the client (often a model) reads: what was refused, why, and what to do."""
    shown = ", ".join(str(p) for p in allow) or "nothing"
    why = ""
    if decision.verdict is Verdict.ADDRESS_FORBIDDEN:
        why = f" ({host} resolves to a {decision.reason.replace('_', '-')} address, which sandboxes may never reach)"
    return (
        f"Egress to {host}:{port} is not allowed for runtime identity {user_id}{why}; "
        f"allowed here: {shown}; ask an admin to allow it."
    )


def parse_authority(authority: str) -> tuple[str, int]:
    """`host:port` of a CONNECT request (IPv6 in brackets) -> (normalized host, port)."""
    text = authority.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise InvalidTarget(f"{authority[:80]!r} is not [address]:port")
        host, port_text = text[: end + 1], text[end + 2 :]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise InvalidTarget(f"{authority[:80]!r} has no port")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidTarget(f"{authority[:80]!r} has no valid port")
    return normalize_host(host), int(port_text)


def parse_absolute_url(url: str) -> tuple[str, int, str]:
    """`http://host[:port]/path?q` of a plain-HTTP proxy request -> (host, port, origin-form).
    Only http: an https URL goes through CONNECT."""
    if not url[:7].lower() == "http://":
        raise InvalidTarget("a plain proxy request needs an absolute http:// URL (use CONNECT for https)")
    rest = url[7:]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:] or "/"
    if "@" in authority:
        raise InvalidTarget("credentials in the URL are not forwarded")
    if path.startswith("?"):
        path = "/" + path
    host, port = parse_http_authority(authority)
    return host, port, path


def parse_http_authority(authority: str, default_port: int = 80) -> tuple[str, int]:
    """`host[:port]` of an http URL or a Host header -> (normalized host, port; `default_port`
    when none: 80 for http, 443 for the Host of a request inside TLS)."""
    text = authority.strip()
    has_port = "]:" in text if text.startswith("[") else ":" in text
    if not has_port:
        return normalize_host(text), default_port
    return parse_authority(text)
