"""The egress decider, pure: which host names a runtime user may reach, and which resolved
addresses a connection may go to. Values in, verdicts out; no DNS, no sockets.

Two checks, in this order (docs/egress.md):
1. the host name (and port) against the user's allow list, before any DNS lookup, so a name
   not on the list is never even resolved;
2. every address an allowed name resolved to against the forbidden ranges. Exactly those
   ranges are refused, not "every non-global address": on some networks the public registries
   resolve to a documentation-range address that `ipaddress` calls non-global.
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

# What a sandbox must never reach through the proxy, whatever name led there.
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
FORBIDDEN: tuple[tuple[str, ipaddress.IPv4Network | ipaddress.IPv6Network], ...] = tuple(
    (reason, ipaddress.ip_network(net))
    for reason, net in (
        ("unspecified", "0.0.0.0/8"),
        ("private", "10.0.0.0/8"),
        ("cgnat", "100.64.0.0/10"),
        ("link_local", "169.254.0.0/16"),  # includes the 169.254.169.254 metadata service
        ("private", "172.16.0.0/12"),  # includes docker's default bridges
        ("private", "192.168.0.0/16"),
        ("multicast", "224.0.0.0/4"),
        ("reserved", "240.0.0.0/4"),  # includes the broadcast address
        ("unspecified", "::/128"),
        ("ula", "fc00::/7"),  # includes fd00:ec2::254, a metadata address
        ("link_local", "fe80::/10"),
        ("multicast", "ff00::/8"),
    )
)


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


def forbidden_range(address: IpAddress, *, allow_loopback: bool) -> str | None:
    """The name of the forbidden range `address` is in, or None when it may be reached."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:10.0.0.1 is 10.0.0.1
    if any(address in net for net in LOOPBACK if net.version == address.version):
        return None if allow_loopback else "loopback"
    for reason, net in FORBIDDEN:
        if net.version == address.version and address in net:
            return reason
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
    has_port = "]:" in authority if authority.startswith("[") else ":" in authority
    if not has_port:
        return normalize_host(authority), 80, path
    host, port = parse_authority(authority)
    return host, port, path
