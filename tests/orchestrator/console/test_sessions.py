"""Console logins: validity over time, the CSRF comparison, the cookie, a bounded store."""

from __future__ import annotations

from orchestrator.console import sessions as module
from orchestrator.console.sessions import ConsoleSessions, Validity, cookie_header, csrf_matches, session_ids


def test_a_session_is_valid_until_it_expires_and_then_forgotten() -> None:
    now = [100.0]
    store = ConsoleSessions(60, clock=lambda: now[0])
    session = store.open()
    assert store.find(session.session_id) == (Validity.VALID, session)
    assert store.find("made-up") == (Validity.MISSING, None) and store.find(None) == (Validity.MISSING, None)
    now[0] += 60
    assert store.find(session.session_id) == (Validity.EXPIRED, None)
    now[0] -= 30
    assert store.find(session.session_id) == (Validity.MISSING, None)  # gone, not revived


def test_csrf_tokens_must_match_exactly() -> None:
    session = ConsoleSessions(60).open()
    assert csrf_matches(session, session.csrf_token)
    assert not csrf_matches(session, None) and not csrf_matches(session, "") and not csrf_matches(session, session.csrf_token + "x")


def test_the_cookie_is_httponly_and_strict_and_secure_only_over_https() -> None:
    assert cookie_header("v", secure=False, max_age=5) == "orch_console=v; Path=/admin; HttpOnly; SameSite=Strict; Max-Age=5"
    assert cookie_header("v", secure=True, max_age=5).endswith("; Secure")


def test_a_flood_of_logins_keeps_a_bounded_store(monkeypatch) -> None:
    monkeypatch.setattr(module, "MAX_SESSIONS", 3)
    store = ConsoleSessions(60)
    first = store.open()
    for _ in range(3):
        store.open()
    assert store.find(first.session_id)[0] is Validity.MISSING and len(store._sessions) == 3


def test_every_value_of_the_console_cookie_is_a_candidate_and_a_live_one_wins() -> None:
    assert session_ids(["a=1; orch_console=real; orch_console=planted", "orch_console=more"]) == ["real", "planted", "more"]
    assert session_ids(["orch_consolex=1; orch_console=; x=orch_console=2"]) == []
    assert len(session_ids(["; ".join(f"orch_console={n}" for n in range(100))])) == module.MAX_COOKIE_VALUES
    now = [100.0]
    store = ConsoleSessions(60, clock=lambda: now[0])
    old = store.open()
    now[0] += 30
    live = store.open()
    now[0] += 40  # `old` expired, `live` not
    assert store.find_any(["planted", old.session_id, live.session_id]) == (Validity.VALID, live)
    assert store.find_any(["planted"]) == (Validity.MISSING, None)
    assert store.find_any(["planted", old.session_id]) == (Validity.MISSING, None)  # forgotten above
    assert store.find_any([]) == (Validity.MISSING, None)


def test_a_notice_is_its_sessions_own_shown_once_and_bounded() -> None:
    store = ConsoleSessions(60)
    mine, other = store.open(), store.open()
    store.notify(mine, "sandbox stopped")
    assert store.take_notice(other) is None
    assert store.take_notice(mine) == "sandbox stopped" and store.take_notice(mine) is None
    store.notify(mine, "x" * 10_000)
    assert len(store.take_notice(mine) or "") == module.MAX_NOTICE_CHARS
    store.notify(mine, "kept?")
    store.close(mine.session_id)
    store.notify(mine, "after the logout")
    assert store.take_notice(mine) is None
