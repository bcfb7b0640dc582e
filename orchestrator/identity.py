"""Runtime identity: the whole entry-point table in one place (docs/bots.md explains it).

owner_user_id     = session.owner                      lists, permissions, audit
execution_user_id = who triggered this (or none)       approvals, billing
runtime_user_id   = mode == owner ? owner : execution ?? owner
                    sandbox, files, skills, deps, credentials, memory

The mode is the only fork: no other code asks which mode is on. Everything here is pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class IdentityMode(str, Enum):
    EXECUTION = "execution"
    OWNER = "owner"


DEFAULT_IDENTITY_MODE = IdentityMode.EXECUTION


def parse_identity_mode(raw: str | None) -> tuple[IdentityMode, str | None]:
    """Return the mode and, when `raw` was not a valid mode, the rejected value (a rejected value is logged and the default applies)."""
    if raw is None or raw.strip() == "":
        return DEFAULT_IDENTITY_MODE, None
    try:
        return IdentityMode(raw.strip().lower()), None
    except ValueError:
        return DEFAULT_IDENTITY_MODE, raw


class Trigger(str, Enum):
    GROUP_MESSAGE = "group_message"
    PRIVATE_MESSAGE = "private_message"
    RETRY = "retry"
    CRASH_RECOVERY = "crash_recovery"
    SUBAGENT = "subagent"
    WEB = "web"
    SCHEDULED = "scheduled"
    OPENAPI = "openapi"
    MANUAL_COMPACTION = "manual_compaction"
    SIDE_TASK = "side_task"
    WECHAT = "wechat"


# Who the execution user is, per entry point.
SPEAKER_TRIGGERS = frozenset({Trigger.GROUP_MESSAGE, Trigger.PRIVATE_MESSAGE})
PERSISTED_IDENTITY_TRIGGERS = frozenset({Trigger.RETRY, Trigger.CRASH_RECOVERY})
OWNER_TRIGGERS = frozenset(
    {
        Trigger.WEB,
        Trigger.SCHEDULED,
        Trigger.OPENAPI,
        Trigger.MANUAL_COMPACTION,
        Trigger.SIDE_TASK,
        Trigger.WECHAT,
    }
)


class IdentityInputError(ValueError):
    """The trigger cannot be resolved with what the caller gave (e.g. no speaker)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class ParentIdentity:
    owner_user_id: int
    last_runtime_user_id: int | None


@dataclass(frozen=True)
class RunIdentity:
    mode: IdentityMode
    owner_user_id: int
    execution_user_id: int | None
    runtime_user_id: int

    @property
    def runtime_is_owner(self) -> bool:
        return self.runtime_user_id == self.owner_user_id


def inherited_runtime_user(parent: ParentIdentity) -> int:
    """What a subagent session records as its last runtime user at spawn and at every
    follow-up, so it works as whoever its parent last worked as."""
    return parent.last_runtime_user_id if parent.last_runtime_user_id is not None else parent.owner_user_id


def execution_user_for(
    trigger: Trigger,
    *,
    speaker_user_id: int | None,
    session_last_runtime_user_id: int | None,
    parent: ParentIdentity | None,
) -> int | None:
    if trigger in SPEAKER_TRIGGERS:
        if speaker_user_id is None:
            raise IdentityInputError(
                "speaker_user_id", f"trigger {trigger.value} needs speaker_user_id (who spoke)"
            )
        return speaker_user_id
    if trigger in PERSISTED_IDENTITY_TRIGGERS:
        return session_last_runtime_user_id  # may be None: then the owner
    if trigger is Trigger.SUBAGENT:
        if parent is None:
            raise IdentityInputError(
                "trigger", "trigger subagent needs a session created with parent_session_id"
            )
        if session_last_runtime_user_id is not None:
            return session_last_runtime_user_id
        return inherited_runtime_user(parent)
    if trigger in OWNER_TRIGGERS:
        return None
    raise AssertionError(f"unhandled trigger {trigger!r}")  # every Trigger is in one set above


def resolve_run_identity(
    mode: IdentityMode,
    trigger: Trigger,
    *,
    owner_user_id: int,
    speaker_user_id: int | None = None,
    session_last_runtime_user_id: int | None = None,
    parent: ParentIdentity | None = None,
) -> RunIdentity:
    execution = execution_user_for(
        trigger,
        speaker_user_id=speaker_user_id,
        session_last_runtime_user_id=session_last_runtime_user_id,
        parent=parent,
    )
    if mode is IdentityMode.OWNER:
        runtime = owner_user_id  # the only place the mode changes anything
    else:
        runtime = execution if execution is not None else owner_user_id
    return RunIdentity(
        mode=mode, owner_user_id=owner_user_id, execution_user_id=execution, runtime_user_id=runtime
    )
