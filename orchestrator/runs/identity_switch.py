"""The runtime identity switch: read at start, flipped without a restart.

The configured value is `ORCH_RUNTIME_IDENTITY` from the environment, else from the settings
file, else the default. Between it and an admin PUT the newest change wins
(docs/operations.md, "Which identity mode applies"):

- an admin PUT is persisted, so an emergency switch survives a restart, and stays in force
  until the configured value changes: a start that finds another configured mode than the
  previous start recorded, or an edit of the watched settings file, is the newer decision and
  clears the admin's;
- `PUT {"mode": null}` clears the admin's change at once (back to the configured value).

Every change is audited. The decision at start is the pure `decide_at_start`.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from dotenv import dotenv_values

from orchestrator import audit, runtime_overrides
from orchestrator.clock import now_iso
from orchestrator.log import kv
from orchestrator.identity import IdentityMode, parse_identity_mode
from orchestrator.settings import IdentitySettings
from orchestrator.state_store import StateStore, Transaction

log = logging.getLogger(__name__)

ENV_KEY = "ORCH_RUNTIME_IDENTITY"
OVERRIDE_KEY = "runtime_identity"
# The configured mode the last start (or settings-file edit) saw: a different one at the next
# start is a change made after any admin PUT still stored.
CONFIGURED_KEY = "runtime_identity.configured"


@dataclass(frozen=True)
class IdentityModeState:
    mode: IdentityMode
    source: str  # default | environment | settings_file | admin
    changed_at: str
    invalid_value: str | None
    configured_mode: IdentityMode  # what applies without (or after clearing) an admin change
    configured_source: str  # default | environment | settings_file


@dataclass(frozen=True)
class StartDecision:
    state: IdentityModeState
    clears_override: bool  # the configured value changed since the admin's change: it wins
    record_configured: bool  # the configured mode differs from the one recorded last time


def decide_at_start(
    configured: IdentityModeState, recorded_configured: str | None, override: IdentityModeState | None
) -> StartDecision:
    """Pure: which mode applies at start. `recorded_configured` is the configured mode the
    previous start saw (None: never recorded, e.g. the first start of this version, when a
    stored admin change is kept: it is the latest decision known)."""
    changed = recorded_configured is not None and recorded_configured != configured.mode.value
    record = recorded_configured != configured.mode.value
    if override is None or changed:
        return StartDecision(configured, clears_override=override is not None, record_configured=record)
    return StartDecision(override, clears_override=False, record_configured=record)


def read_settings_file_value(path: Path) -> str | None:
    if not path.is_file():
        return None
    return dotenv_values(path).get(ENV_KEY)


def configured_source(settings: IdentitySettings, file_value: str | None) -> str:
    if not settings.runtime_identity_set:
        return "default"
    if ENV_KEY not in os.environ and file_value is not None:
        return "settings_file"
    return "environment"  # the environment (or, in tests, the Settings constructor)


class RuntimeIdentitySwitch:
    def __init__(self, store: StateStore, settings: IdentitySettings) -> None:
        self._store = store
        self._settings_file = settings.settings_file
        self._lock = threading.Lock()
        self._file_value = read_settings_file_value(self._settings_file) if self._settings_file else None
        mode, invalid = parse_identity_mode(settings.runtime_identity)
        source = configured_source(settings, self._file_value)
        if invalid is not None:
            log.warning(
                "invalid runtime identity mode, falling back to the default %s",
                kv(invalid_value=invalid, mode=mode.value, source=source),
            )
        now = now_iso()
        configured = IdentityModeState(mode, source, now, invalid, mode, source)
        with self._store.write() as tx:
            override = self._load_override(tx, configured)
            recorded = runtime_overrides.get(tx, CONFIGURED_KEY)
            decision = decide_at_start(configured, recorded["value"] if recorded else None, override)
            if decision.clears_override:
                assert override is not None
                runtime_overrides.delete(tx, OVERRIDE_KEY)
                audit.record(
                    tx,
                    actor=source,
                    action="runtime_identity.change",
                    source=source,
                    reason="the configured mode changed after the admin's change",
                    **{"from": override.mode.value, "to": mode.value},
                )
            if decision.record_configured:
                runtime_overrides.put(tx, CONFIGURED_KEY, mode.value, actor=source, at=now)
        self._state = decision.state
        if decision.clears_override:
            assert override is not None
            log.warning(
                "runtime identity mode: the configured value changed since the admin's change, which no longer "
                "applies %s",
                kv(mode=mode.value, source=source, admin_mode=override.mode.value, admin_changed_at=override.changed_at),
            )
        elif override is not None:
            log.warning(
                "runtime identity mode set by an earlier admin change %s",
                kv(mode=override.mode.value, changed_at=override.changed_at, configured=mode.value),
            )
        log.info("runtime identity mode %s", kv(mode=self._state.mode.value, source=self._state.source))

    @staticmethod
    def _load_override(tx: Transaction, configured: IdentityModeState) -> IdentityModeState | None:
        row = runtime_overrides.get(tx, OVERRIDE_KEY)
        if row is None:
            return None
        mode, invalid = parse_identity_mode(row["value"])
        if invalid is not None:
            return None
        return replace(configured, mode=mode, source="admin", changed_at=row["changed_at"], invalid_value=None)

    def state(self) -> IdentityModeState:
        return self._state

    def mode(self) -> IdentityMode:
        return self._state.mode

    def set_by_admin(self, mode: IdentityMode | None, *, actor: str) -> IdentityModeState:
        """`mode` None: drop the admin's change, the configured value applies again."""
        with self._lock:
            previous = self._state
            now = now_iso()
            with self._store.write() as tx:
                if mode is None:
                    runtime_overrides.delete(tx, OVERRIDE_KEY)
                    state = replace(
                        previous, mode=previous.configured_mode, source=previous.configured_source, changed_at=now
                    )
                else:
                    runtime_overrides.put(tx, OVERRIDE_KEY, mode.value, actor=actor, at=now)
                    state = replace(previous, mode=mode, source="admin", changed_at=now, invalid_value=None)
                audit.record(
                    tx,
                    actor=actor,
                    action="runtime_identity.change",
                    source="admin",
                    reset=mode is None,
                    **{"from": previous.mode.value, "to": state.mode.value},
                )
            self._state = state
        log.warning(
            "runtime identity mode changed %s",
            kv(actor=actor, source=state.source, from_mode=previous.mode.value, to_mode=state.mode.value, reset=mode is None),
        )
        return state

    def reload_settings_file(self) -> IdentityModeState:
        """Apply an edit of the settings file; a file whose value did not change is ignored, and
        so is any edit while the environment sets the mode (the environment wins over the file)."""
        if self._settings_file is None:
            return self._state
        value = read_settings_file_value(self._settings_file)
        with self._lock:
            if value == self._file_value:
                return self._state
            self._file_value = value
            if ENV_KEY in os.environ:
                log.warning(
                    "settings file edit of the runtime identity mode ignored: the environment sets it %s",
                    kv(file=self._settings_file, file_value=value, environment=os.environ[ENV_KEY]),
                )
                return self._state
            mode, invalid = parse_identity_mode(value)
            source = "default" if value is None else "settings_file"
            if invalid is not None:
                log.warning(
                    "invalid runtime identity mode in the settings file, using the default %s",
                    kv(invalid_value=invalid, mode=mode.value, file=self._settings_file),
                )
            previous = self._state
            now = now_iso()
            with self._store.write() as tx:
                # A file edit is the newer decision: it supersedes an admin override.
                runtime_overrides.delete(tx, OVERRIDE_KEY)
                runtime_overrides.put(tx, CONFIGURED_KEY, mode.value, actor=source, at=now)
                audit.record(
                    tx,
                    actor="settings_file",
                    action="runtime_identity.change",
                    source="settings_file",
                    file=str(self._settings_file),
                    invalid_value=invalid,
                    **{"from": previous.mode.value, "to": mode.value},
                )
            self._state = IdentityModeState(mode, source, now, invalid, mode, source)
        log.warning(
            "runtime identity mode changed %s",
            kv(actor="settings_file", from_mode=previous.mode.value, to_mode=mode.value),
        )
        return self._state

