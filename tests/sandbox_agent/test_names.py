"""sandbox_agent/names.py: names that are not UTF-8 leave escaped and come back (pure)."""

from __future__ import annotations

import os

import pytest

from sandbox_agent.names import escape_names, escape_text, unescape_path


@pytest.mark.parametrize(
    "raw",
    [b"x\xff\xfe.txt", b"a\\\xff", b"a\\xff\xfe", b"\\\\\xc3", b"caf\xe9/sub\x80dir/f", b"\xc3\xa9\xff"],
)
def test_every_name_that_is_not_utf8_round_trips(raw: bytes) -> None:
    name = os.fsdecode(raw)
    shown = escape_text(name)
    assert shown.isprintable() and shown.encode("utf-8")  # any JSON reader can carry it
    back = unescape_path(shown)
    assert back is not None and os.fsencode(back) == raw


def test_plain_paths_have_no_alternative() -> None:
    assert unescape_path("notes.txt") is None
    assert unescape_path("C:\\\\dir\\x41") is None  # no \xNN of a non-ASCII byte: nothing to undo


def test_answers_are_escaped_and_flagged_only_where_needed() -> None:
    odd = os.fsdecode(b"x\xff.txt")
    answer = {"path": "/w", "entries": [{"name": odd, "type": "file"}, {"name": "a\\b", "type": "file"}], "matches": ["/w/a", f"/w/{odd}"]}
    assert escape_names(answer) == {
        "path": "/w",
        "entries": [{"name": "x\\xff.txt", "name_encoding": "escaped", "type": "file"}, {"name": "a\\b", "type": "file"}],
        "matches": ["/w/a", "/w/x\\xff.txt"],
        "matches_encoding": "escaped",
    }


def test_other_lone_surrogates_from_a_request_are_shown_not_fatal() -> None:
    echoed = escape_names({"pattern": "a\ud800b\udcff"})
    assert echoed == {"pattern": "a\\ud800b\\xff", "pattern_encoding": "escaped"}
    assert echoed["pattern"].encode("utf-8")
