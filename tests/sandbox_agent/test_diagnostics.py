"""Identity diagnostics are a pure decision: exact codes and messages."""

from __future__ import annotations

from sandbox_agent.diagnostics import classify_foreign_path, diagnose

DATA = "/srv/data"


def test_another_users_runtime_dir() -> None:
    d = classify_foreign_path("/srv/data/runtime/67/s1/x.txt", DATA, 17)
    assert d.code == "foreign_runtime_path"
    assert d.message == (
        "This path belongs to another user's session runtime directory (current runtime identity 17); "
        "it is not accessible here: /srv/data/runtime/67/s1/x.txt"
    )


def test_another_members_upload_has_no_url_inside_the_sandbox() -> None:
    d = classify_foreign_path("/srv/data/uploads/17/x.png", DATA, 67)
    assert d.code == "foreign_upload_path"
    assert d.message == (
        "This file belongs to another member's artifacts directory (current runtime identity 67); it is not "
        "accessible here. To forward it, ask that member to do it, or use its public URL: /srv/data/uploads/17/x.png"
    )
    assert "http" not in d.message


def test_everything_else_is_a_path_escape() -> None:
    for path in ["/etc/passwd", "/srv/data/state/orchestrator.sqlite3", "/srv/data/runtime", "/srv/data/runtime/abc/x",
                 "/srv/data/users/18/.ssh/id_rsa", "/srv/dataX/runtime/18/x", "/srv/data/runtime/17/x"]:
        d = classify_foreign_path(path, DATA, 17)
        assert d.code == "path_escape", path
        assert d.message == f"Path escape attempt: {path}"


def test_classification_is_lexical_and_component_wise() -> None:
    assert classify_foreign_path("/srv/data/runtime/17/../18/x", DATA, 17).code == "foreign_runtime_path"
    assert classify_foreign_path("/srv/data/uploads/1/x", DATA, 10).code == "foreign_upload_path"
    assert classify_foreign_path("/srv/data/uploads/10/x", DATA, 10).code == "path_escape"


def test_the_escape_point_decides_when_the_requested_path_looks_harmless() -> None:
    # A link inside the user's own runtime dir that points into another user's runtime dir.
    d = diagnose("/srv/data/runtime/17/s/link/x", "/srv/data/runtime/18/s/x", DATA, 17)
    assert d.code == "foreign_runtime_path"
    assert d.message.endswith(": /srv/data/runtime/17/s/link/x")
    assert diagnose("/srv/data/runtime/17/s/l", None, DATA, 17).code == "path_escape"
