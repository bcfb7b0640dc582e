"""The operator's key: a start with a wrong or missing key is refused with what to do (the
real `orchestrator serve`, exit 2 and one line, not a traceback); a rotation re-encrypts every
credential and keeps it usable under the new key alone; the secret is never in the state DB."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet, MultiFernet

from mounts.layout import DataLayout
from orchestrator.credentials.keys import CredentialsKeyRefused, load_keys, parse_keys
from orchestrator.credentials.model import validate_spec
from orchestrator.credentials.store import CredentialStore
from orchestrator.state_schema import STATE_MIGRATIONS
from orchestrator.state_store import StateStore
from tests.conftest import KEPT_ENV
from tests.live_server import free_port

SECRET = "sk-live-ROTATEME-0123456789"


def store_at(path: Path) -> StateStore:
    store = StateStore(path, STATE_MIGRATIONS)
    store.open()
    return store


def put_one(credentials: CredentialStore, user_id: int = 67, name: str = "api") -> None:
    spec = validate_spec(name, ["api.example.org"], "Authorization", "Bearer {secret}", None, SECRET)
    credentials.put(user_id, spec, SECRET, actor="admin")


def serve(data_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_") or k in KEPT_ENV}
    base.update({"ORCH_DATA_DIR": str(data_dir), "ORCH_DISK_QUOTA": "off", "ORCH_BACKEND": "process", **env})
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "serve", "--port", str(free_port())], env=base, capture_output=True, text=True, timeout=60
    )


def test_a_start_with_a_wrong_or_missing_key_is_refused_with_what_to_do(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    layout = DataLayout(data)
    layout.state_dir.mkdir()
    store = store_at(layout.state_db)
    put_one(CredentialStore(store, parse_keys(Fernet.generate_key().decode(), source="test"), grant_max_s=60))
    store.close()

    wrong = serve(data, ORCH_CREDENTIALS_KEY=Fernet.generate_key().decode())
    assert wrong.returncode == 2, wrong.stderr[-2000:]
    assert "the credentials key does not open the stored credentials" in wrong.stderr
    assert "Traceback" not in wrong.stderr

    missing = serve(data)
    assert missing.returncode == 2, missing.stderr[-2000:]
    assert "1 credential(s) are stored, but neither ORCH_CREDENTIALS_KEY nor ORCH_CREDENTIALS_KEY_FILE is set" in missing.stderr

    garbage = serve(data, ORCH_CREDENTIALS_KEY="not-a-key")
    assert garbage.returncode == 2 and "is not a Fernet key" in garbage.stderr, garbage.stderr[-2000:]


def test_a_key_file_inside_the_data_dir_or_readable_by_others_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    inside = data / "key"
    inside.write_text(Fernet.generate_key().decode())
    inside.chmod(0o600)
    with pytest.raises(CredentialsKeyRefused, match="inside the data dir"):
        load_keys("", inside, data)
    outside = tmp_path / "key"
    outside.write_text(Fernet.generate_key().decode())
    outside.chmod(0o644)
    with pytest.raises(CredentialsKeyRefused, match="chmod 600"):
        load_keys("", outside, data)
    outside.chmod(0o600)
    assert load_keys("", outside, data) is not None


def test_rotation_re_encrypts_every_credential_and_the_new_key_alone_opens_them(tmp_path: Path) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    db = tmp_path / "state.db"
    store = store_at(db)
    credentials = CredentialStore(store, parse_keys(old, source="test"), grant_max_s=60)
    put_one(credentials, 67, "api")
    put_one(credentials, 17, "deploy")
    assert credentials.rotate(parse_keys(f"{new},{old}", source="test"), actor="admin") == 2
    # In use meanwhile: the same store object keeps injecting.
    assert credentials.secret_of(credentials.get(67, "api")) == SECRET
    store.close()

    store = store_at(db)
    reopened = CredentialStore(store, parse_keys(new, source="test"), grant_max_s=60)  # the old key gone
    assert [reopened.secret_of(c) for c in (reopened.get(67, "api"), reopened.get(17, "deploy"))] == [SECRET, SECRET]
    store.close()
    with pytest.raises(CredentialsKeyRefused):
        CredentialStore(store_at(db), MultiFernet([Fernet(old.encode())]), grant_max_s=60)
    for path in tmp_path.iterdir():
        assert SECRET.encode() not in path.read_bytes(), path
