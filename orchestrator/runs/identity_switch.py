"""The runtime identity switch: read at start, flipped without a restart.

Sources, latest change wins: the configured value (environment or settings file), an admin
PUT (persisted, so an emergency rollback survives a restart), and edits of the watched
settings file (an edit supersedes an earlier admin override). Every change is audited.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from dotenv import dotenv_values

from orchestrator import audit
from orchestrator.clock import now_iso
from orchestrator.log import kv
from orchestrator.identity import IdentityMode, parse_identity_mode
from orchestrator.settings import Settings
from orchestrator.state_store import StateStore

log = logging.getLogger(__name__)

ENV_KEY = "ORCH_RUNTIME_IDENTITY"
OVERRIDE_KEY = "runtime_identity"


@dataclass(frozen=True)
class IdentityModeState:
    mode: IdentityMode
    source: str  # default | environment | settings_file | admin
    changed_at: str
    invalid_value: str | None


def read_settings_file_value(path: Path) -> str | None:
    if not path.is_file():
        return None
    return dotenv_values(path).get(ENV_KEY)


class RuntimeIdentitySwitch:
    def __init__(self, store: StateStore, settings: Settings) -> None:
        self._store = store
        self._settings_file = settings.settings_file
        self._lock = threading.Lock()
        self._file_value = read_settings_file_value(self._settings_file) if self._settings_file else None
        mode, invalid = settings.identity_mode
        source = "default"
        if ENV_KEY in os.environ:
            source = "environment"
        elif self._file_value is not None:
            source = "settings_file"
        if invalid is not None:
            log.warning(
                "invalid runtime identity mode, falling back to the default %s",
                kv(invalid_value=invalid, mode=mode.value, source=source),
            )
        self._state = IdentityModeState(mode=mode, source=source, changed_at=now_iso(), invalid_value=invalid)
        override = self._load_override()
        if override is not None:
            self._state = override
            log.warning(
                "runtime identity mode set by an earlier admin change %s",
                kv(mode=override.mode.value, changed_at=override.changed_at, configured=mode.value),
            )
        log.info("runtime identity mode %s", kv(mode=self._state.mode.value, source=self._state.source))

    def _load_override(self) -> IdentityModeState | None:
        with self._store.read() as tx:
            row = tx.one("SELECT * FROM runtime_overrides WHERE key = ?", (OVERRIDE_KEY,))
        if row is None:
            return None
        mode, invalid = parse_identity_mode(row["value"])
        if invalid is not None:
            return None
        return IdentityModeState(mode=mode, source="admin", changed_at=row["changed_at"], invalid_value=None)

    def state(self) -> IdentityModeState:
        return self._state

    def mode(self) -> IdentityMode:
        return self._state.mode

    def set_by_admin(self, mode: IdentityMode, *, actor: str) -> IdentityModeState:
        with self._lock:
            previous = self._state
            now = now_iso()
            with self._store.write() as tx:
                tx.execute(
                    "INSERT INTO runtime_overrides (key, value, actor, changed_at) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (key) DO UPDATE SET value = excluded.value, actor = excluded.actor,"
                    " changed_at = excluded.changed_at",
                    (OVERRIDE_KEY, mode.value, actor, now),
                )
                audit.record(
                    tx,
                    actor=actor,
                    action="runtime_identity.change",
                    source="admin",
                    **{"from": previous.mode.value, "to": mode.value},
                )
            self._state = IdentityModeState(mode=mode, source="admin", changed_at=now, invalid_value=None)
        log.warning(
            "runtime identity mode changed %s",
            kv(actor=actor, source="admin", from_mode=previous.mode.value, to_mode=mode.value),
        )
        return self._state

    def reload_settings_file(self) -> IdentityModeState:
        """Apply an edit of the settings file; a file whose value did not change is ignored."""
        if self._settings_file is None:
            return self._state
        value = read_settings_file_value(self._settings_file)
        with self._lock:
            if value == self._file_value:
                return self._state
            self._file_value = value
            mode, invalid = parse_identity_mode(value)
            if invalid is not None:
                log.warning(
                    "invalid runtime identity mode in the settings file, using the default %s",
                    kv(invalid_value=invalid, mode=mode.value, file=self._settings_file),
                )
            previous = self._state
            now = now_iso()
            with self._store.write() as tx:
                # A file edit is the newer decision: it supersedes an admin override.
                tx.execute("DELETE FROM runtime_overrides WHERE key = ?", (OVERRIDE_KEY,))
                audit.record(
                    tx,
                    actor="settings_file",
                    action="runtime_identity.change",
                    source="settings_file",
                    file=str(self._settings_file),
                    invalid_value=invalid,
                    **{"from": previous.mode.value, "to": mode.value},
                )
            self._state = IdentityModeState(
                mode=mode, source="settings_file", changed_at=now, invalid_value=invalid
            )
        log.warning(
            "runtime identity mode changed %s",
            kv(actor="settings_file", from_mode=previous.mode.value, to_mode=mode.value),
        )
        return self._state
