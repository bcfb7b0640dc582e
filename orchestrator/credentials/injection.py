"""What the egress proxy asks about credentials, on its own loop: which credential a
connection gets (`choose`), whether plain http to a host is refused (`is_credential_host`),
the header to inject (`header_for`, checked again before each request), and the TLS contexts
(the deployment CA's certificate for the host; the upstream's verification).

The session a connection belongs to: the egress socket is the runtime user's, not a run's,
so the session is the one the user's tool calls in flight are for; with calls of two or more
sessions in flight it is none (no delegated credential applies), and with none in flight it
is the session of the user's latest call (a background process it started).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.credentials.ca import DeploymentCA
from orchestrator.credentials.model import Usable, render_header
from orchestrator.credentials.store import CredentialStore
from orchestrator.egress.intercept import upstream_context
from orchestrator.errors import NotFound


# New host certificates a user's connections may have minted: a burst, then a steady rate.
# Minting (a key, a signature) runs on the proxy's loop that every user shares, and each new
# host pushes an older one out of the shared cache: a wildcard credential must not make it
# unbounded. A host already cached costs nothing and is never refused.
HOST_MINTS_BURST = 32
HOST_MINTS_PER_S = 0.5


@dataclass
class MintBucket:
    """Pure: a token bucket of host certificate mints (`now`: monotonic seconds)."""

    tokens: float
    at: float

    def take(self, now: float) -> bool:
        self.tokens = min(float(HOST_MINTS_BURST), self.tokens + (now - self.at) * HOST_MINTS_PER_S)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def connection_session(in_flight: set[str], latest: str | None) -> str | None:
    """Pure: the session a user's egress connection is taken to belong to (module doc)."""
    if len(in_flight) == 1:
        return next(iter(in_flight))
    if in_flight:
        return None
    return latest


class CredentialInjection:
    def __init__(
        self, store: CredentialStore, ca: DeploymentCA, upstream_ca_bundle: Path,
        sessions_in_flight: Callable[[int], set[str]] = lambda user_id: set(),
    ) -> None:  # fmt: skip
        self.store = store
        self.ca = ca
        self.sessions_in_flight = sessions_in_flight
        self._bundle = upstream_ca_bundle
        self._bundle_seen: tuple[int, int] | None = None
        self._client_context = upstream_context(None)
        self._mints: dict[int, MintBucket] = {}  # the proxy's loop alone

    @property
    def client_context(self) -> ssl.SSLContext:
        """What upstreams are verified against: the upstream CA bundle, loaded again when the
        file changed (a rotated CA needs no restart); one stat per intercepted connection."""
        try:
            st = os.stat(self._bundle)
            seen: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            seen = None
        if seen != self._bundle_seen:
            self._client_context = upstream_context(str(self._bundle) if seen is not None else None)
            self._bundle_seen = seen
        return self._client_context

    def session_of(self, user_id: int, latest: str | None) -> str | None:
        return connection_session(self.sessions_in_flight(user_id), latest)

    def choose(self, host: str, port: int, *, runtime_user_id: int, session_id: str | None) -> Usable | None:
        return self.store.choose(host, port, runtime_user_id=runtime_user_id, session_id=session_id)

    def is_credential_host(self, host: str, *, runtime_user_id: int, session_id: str | None) -> bool:
        return self.store.is_credential_host(host, runtime_user_id=runtime_user_id, session_id=session_id)

    def header_for(self, usable: Usable, host: str, port: int) -> tuple[str, str] | None:
        """The header for a request to host:port, None when the credential chosen at the
        CONNECT no longer applies: revoked, expired, deleted, or replaced by one for other
        hosts (its new value is never sent to a host it is not for)."""
        if not self.store.still_usable(usable):
            return None
        try:  # deleted in between: as revoked
            credential = self.store.get(usable.credential.user_id, usable.credential.name)
            if not credential.matches(host, port):
                return None
            return credential.header, render_header(credential.template, self.store.secret_of(credential))
        except NotFound:
            return None

    def admit_host(self, user_id: int, host: str, now: float) -> bool:
        """Whether a connection of `user_id` to `host` may be intercepted now: the host's
        certificate is cached, or the user's bucket of new ones is not empty."""
        if self.ca.is_cached(host):
            return True
        bucket = self._mints.setdefault(user_id, MintBucket(float(HOST_MINTS_BURST), now))
        return bucket.take(now)

    def server_context(self, host: str) -> ssl.SSLContext:
        return self.ca.context_for(host)
