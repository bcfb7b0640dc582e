from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.identity import IdentityMode, parse_identity_mode
from orchestrator.settings import load_settings


@pytest.mark.parametrize(
    "raw,mode,invalid",
    [
        (None, IdentityMode.EXECUTION, None),
        ("", IdentityMode.EXECUTION, None),
        ("execution", IdentityMode.EXECUTION, None),
        ("owner", IdentityMode.OWNER, None),
        (" Owner ", IdentityMode.OWNER, None),
        ("bogus", IdentityMode.EXECUTION, "bogus"),
    ],
)
def test_parse_identity_mode(raw, mode, invalid) -> None:
    assert parse_identity_mode(raw) == (mode, invalid)


def test_environment_and_settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "orchestrator.env"
    file.write_text("ORCH_RUNTIME_IDENTITY=owner\nORCH_IDLE_TIMEOUT_S=30\n")
    monkeypatch.setenv("ORCH_SETTINGS_FILE", str(file))
    monkeypatch.setenv("ORCH_DATA_DIR", str(tmp_path / "d"))
    settings = load_settings()
    assert settings.identity_mode == (IdentityMode.OWNER, None)
    assert settings.idle_timeout_s == 30
    assert settings.layout.root == (tmp_path / "d")
    # the environment wins over the file
    monkeypatch.setenv("ORCH_RUNTIME_IDENTITY", "execution")
    assert load_settings().identity_mode == (IdentityMode.EXECUTION, None)


def test_invalid_backend_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_BACKEND", "nomad")
    with pytest.raises(ValueError):
        load_settings()
