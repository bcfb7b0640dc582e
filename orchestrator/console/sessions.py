"""The admin console's logins: the admin token is exchanged once for a random session id kept
in an HttpOnly, SameSite=Strict cookie (Secure over https), so the token never sits in the
browser; each session has its own CSRF token and expires after ORCH_CONSOLE_SESSION_TTL_S.
Kept in memory: a restart logs every admin out."""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

COOKIE_NAME = "orch_console"
COOKIE_PATH = "/admin"
MAX_SESSIONS = 1000  # the oldest go first: a flood of logins cannot grow memory
MAX_NOTICE_CHARS = 500
MAX_COOKIE_VALUES = 8  # of one name in a request: the admin's own and a few planted ones


@dataclass(frozen=True)
class ConsoleSession:
    session_id: str
    csrf_token: str
    expires_at: float  # monotonic


class Validity(Enum):
    VALID = "valid"
    MISSING = "missing"  # no cookie, or one we never issued (or forgot at a restart)
    EXPIRED = "expired"


def validity(session: ConsoleSession | None, now: float) -> Validity:
    """Pure: whether a session lets its holder in now."""
    if session is None:
        return Validity.MISSING
    return Validity.VALID if now < session.expires_at else Validity.EXPIRED


def session_ids(cookie_headers: list[str]) -> list[str]:
    """Pure: every value the browser sent under the console cookie's name, in its order. A
    page on another port of the same host (cookies ignore ports) can plant one for the whole
    host; the browser then sends both, and taking only one would let it log the admin out."""
    values = []
    for header in cookie_headers:
        for pair in header.split(";"):
            name, sep, value = pair.strip().partition("=")
            if sep and name == COOKIE_NAME and value:
                values.append(value)
    return values[:MAX_COOKIE_VALUES]


def csrf_matches(session: ConsoleSession, sent: str | None) -> bool:
    """Pure: whether a change carries its session's CSRF token (compared in constant time)."""
    return bool(sent) and hmac.compare_digest(session.csrf_token.encode(), str(sent).encode())


def cookie_header(value: str, *, secure: bool, max_age: int) -> str:
    """Pure: the Set-Cookie value of a session (an empty value with max_age 0 clears it)."""
    parts = [f"{COOKIE_NAME}={value}", f"Path={COOKIE_PATH}", "HttpOnly", "SameSite=Strict", f"Max-Age={max_age}"]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


class ConsoleSessions:
    def __init__(self, ttl_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, ConsoleSession] = {}
        self._notices: dict[str, str] = {}  # by session id: what its last change did, shown once

    def open(self) -> ConsoleSession:
        session = ConsoleSession(secrets.token_urlsafe(32), secrets.token_urlsafe(32), self.clock() + self.ttl_s)
        with self._lock:
            while len(self._sessions) >= MAX_SESSIONS:
                self._notices.pop(self._sessions.pop(next(iter(self._sessions))).session_id, None)
            self._sessions[session.session_id] = session
        return session

    def find(self, session_id: str | None) -> tuple[Validity, ConsoleSession | None]:
        with self._lock:
            session = self._sessions.get(session_id) if session_id else None
        found = validity(session, self.clock())
        if found is Validity.EXPIRED:
            self.close(session_id)
        return found, session if found is Validity.VALID else None

    def find_any(self, session_ids: list[str]) -> tuple[Validity, ConsoleSession | None]:
        """The first of several candidate ids that is a live session; else EXPIRED if one of
        them expired, else MISSING."""
        found = Validity.MISSING
        for session_id in session_ids:
            validity_of, session = self.find(session_id)
            if session is not None:
                return validity_of, session
            if validity_of is Validity.EXPIRED:
                found = Validity.EXPIRED
        return found, None

    def close(self, session_id: str | None) -> None:
        with self._lock:
            if session_id:
                self._sessions.pop(session_id, None)
                self._notices.pop(session_id, None)

    def notify(self, session: ConsoleSession, notice: str) -> None:
        """What a change did, for the next page this session sees (never taken from a URL: a
        link could put its own words in the console's mouth)."""
        with self._lock:
            if session.session_id in self._sessions:
                self._notices[session.session_id] = notice[:MAX_NOTICE_CHARS]

    def take_notice(self, session: ConsoleSession) -> str | None:
        with self._lock:
            return self._notices.pop(session.session_id, None)
