"""Credentials and grants as values, and the pure deciders over them: which name, template
and header a credential may have, what header value a template renders, and which credential
(own or delegated) applies to one connection. No I/O here.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.egress.policy import HostPattern, InvalidPattern, parse_patterns

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,39}$"
ENV_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
HEADER_PATTERN = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$"  # a header name is a token (RFC 9110)
# printable ASCII around `{secret}` or `{base64(LOGIN:secret)}` (validate_spec is the authority)
TEMPLATE_PATTERN = r"^[ -~]*\{(secret|base64\([^:(){}]*:secret\))\}[ -~]*$"
MAX_HOSTS = 20
RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive", "proxy-connection", "proxy-authorization"})
MAX_SECRET_CHARS = 8192
PLACEHOLDER_PREFIX = "cred:"


class InvalidCredential(ValueError):
    """A credential or grant the API refuses; `field` names what was wrong."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class CredentialSpec:
    """What a PUT asks for, validated (`validate_spec`)."""

    name: str
    hosts: tuple[str, ...]
    header: str
    template: str
    env: str | None


@dataclass(frozen=True)
class Credential:
    """A stored credential without its secret (the secret stays encrypted until a connection
    needs it)."""

    user_id: int
    name: str
    hosts: tuple[str, ...]
    header: str
    template: str
    env: str | None
    created_at: str
    last_used_at: str | None

    def patterns(self) -> tuple[HostPattern, ...]:
        return parse_patterns(self.hosts)

    def matches(self, host: str, port: int) -> bool:
        return any(p.matches(host, port) for p in self.patterns())


@dataclass(frozen=True)
class Grant:
    grant_id: str
    grantor_user_id: int
    credential: str
    grantee_user_id: int | None  # None: every runtime user of the session's runs
    session_id: str
    created_at: str
    expires_at: str
    revoked_at: str | None


@dataclass(frozen=True)
class Usable:
    """The credential one connection uses, and through which grant (None: the user's own)."""

    credential: Credential
    grant: Grant | None


def validate_spec(name: str, hosts: Sequence[str], header: str, template: str, env: str | None, secret: str) -> CredentialSpec:
    if not re.fullmatch(NAME_PATTERN, name):
        raise InvalidCredential(f"a credential name is {NAME_PATTERN[1:-1]}, not {name[:40]!r}", "name")
    if not hosts or len(hosts) > MAX_HOSTS:
        raise InvalidCredential(f"a credential is for 1 to {MAX_HOSTS} host patterns", "hosts")
    try:
        canonical = tuple(str(p) for p in parse_patterns(hosts))
    except InvalidPattern as exc:
        raise InvalidCredential(str(exc), "hosts") from None
    if not re.fullmatch(HEADER_PATTERN, header):
        raise InvalidCredential(f"{header[:64]!r} is not a header name", "header")
    if header.lower() in RESERVED_HEADERS:
        raise InvalidCredential(f"the {header} header cannot carry a credential (the proxy frames the request with it)", "header")
    if not ("{secret}" in template.replace("{base64(", "(") or _BASE64.search(template)) or len(template) > 200 or not _printable(template):
        raise InvalidCredential("a template holds {secret} or {base64(user:secret)}, in one printable line", "template")
    if env is not None and not re.fullmatch(ENV_PATTERN, env):
        raise InvalidCredential(f"{env[:64]!r} is not an environment variable name", "env")
    if not secret or len(secret) > MAX_SECRET_CHARS or not _printable(secret):
        raise InvalidCredential(f"a secret is 1 to {MAX_SECRET_CHARS} printable characters in one line", "secret")
    if "{base64(user:secret)}" in template and ":" not in secret:
        raise InvalidCredential("with {base64(user:secret)} the secret is `user:password`", "secret")
    return CredentialSpec(name, canonical, header, template, env)


def _printable(text: str) -> bool:
    return all(" " <= c <= "~" or c > "\x9f" for c in text)


_BASE64 = re.compile(r"\{base64\(([^:(){}]*):secret\)\}")


def render_header(template: str, secret: str) -> str:
    """The header value. `{secret}` is the secret; `{base64(LOGIN:secret)}` is Basic's
    base64 of `LOGIN:` and the secret, LOGIN taken literally (`x-access-token`), except
    `user`: then the secret is `user:password` itself and is encoded whole."""

    def encoded(match: re.Match[str]) -> str:
        login = match.group(1)
        raw = secret if login == "user" else f"{login}:{secret}"
        return base64.b64encode(raw.encode()).decode()

    return _BASE64.sub(encoded, template).replace("{secret}", secret)


def placeholder(name: str) -> str:
    return PLACEHOLDER_PREFIX + name


def grant_active(grant: Grant, now_iso: str) -> bool:
    return grant.revoked_at is None and grant.expires_at > now_iso


def grant_applies(grant: Grant, *, runtime_user_id: int, session_id: str | None, now_iso: str) -> bool:
    return (
        grant_active(grant, now_iso)
        and session_id is not None
        and grant.session_id == session_id
        and (grant.grantee_user_id is None or grant.grantee_user_id == runtime_user_id)
    )


def choose_credential(
    host: str,
    port: int,
    *,
    runtime_user_id: int,
    session_id: str | None,
    own: Iterable[Credential],
    delegated: Iterable[tuple[Grant, Credential]],
    now_iso: str,
) -> Usable | None:
    """The credential a connection of `runtime_user_id` (in `session_id`) to host:port gets:
    the user's own first (sorted by name), then a grant that applies (the earliest granted)."""
    for credential in sorted(own, key=lambda c: c.name):
        if credential.matches(host, port):
            return Usable(credential, None)
    for grant, credential in sorted(delegated, key=lambda gc: (gc[0].created_at, gc[0].grant_id)):
        if grant_applies(grant, runtime_user_id=runtime_user_id, session_id=session_id, now_iso=now_iso) and credential.matches(host, port):
            return Usable(credential, grant)
    return None


def credential_host(host: str, port: int, credentials: Iterable[Credential]) -> bool:
    """Whether any of `credentials` is for host (any port): plain http there is refused."""
    return any(p.host == host if not p.wildcard else host.endswith("." + p.host) for c in credentials for p in c.patterns())
