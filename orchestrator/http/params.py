"""Validated path parameters: an id that fails validation is a 422 before anything else runs.
The declared pattern and length put the rule into the OpenAPI document (the pattern only there:
the schema validator's regex engine has no look-ahead); the ids validators stay the authority and
name the field."""

from __future__ import annotations

from fastapi import Path

from mounts import ids

# The largest integer SQLite stores: a cursor or count above it cannot name a row, and binding it
# raises OverflowError (a 500) instead of a clear 422.
SQLITE_INT_MAX = 2**63 - 1


async def session_id_param(session_id: str = Path(..., max_length=128, json_schema_extra={"pattern": ids.SESSION_ID_PATTERN})) -> str:
    return ids.session_id(session_id, "session_id")


async def run_id_param(run_id: str = Path(..., max_length=128, json_schema_extra={"pattern": ids.SESSION_ID_PATTERN})) -> str:
    return ids.session_id(run_id, "run_id")


async def user_id_param(user_id: int = Path(..., gt=0, le=ids.MAX_USER_ID)) -> int:
    return ids.user_id(user_id, "user_id")


async def project_id_param(project_id: str = Path(..., max_length=64, json_schema_extra={"pattern": ids.PROJECT_ID_PATTERN})) -> str:
    return ids.project_id(project_id, "project_id")


def skill_name_param(name: str = Path(..., max_length=64, json_schema_extra={"pattern": ids.NAME_PATTERN})) -> str:
    return ids.name(name, "name")


async def group_channel_param(channel: str = Path(..., max_length=64, json_schema_extra={"pattern": ids.NAME_PATTERN})) -> str:
    return ids.name(channel, "channel")


async def chat_id_param(chat_id: str = Path(..., max_length=128, json_schema_extra={"pattern": ids.CHAT_ID_PATTERN})) -> str:
    return ids.chat_id(chat_id, "chat_id")
