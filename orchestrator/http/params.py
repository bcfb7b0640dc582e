"""Validated path parameters: an id that fails validation is a 422 before anything else runs."""

from __future__ import annotations

from fastapi import Path

from mounts import ids


async def session_id_param(session_id: str = Path(..., max_length=200)) -> str:
    return ids.session_id(session_id, "session_id")


async def run_id_param(run_id: str = Path(..., max_length=200)) -> str:
    return ids.session_id(run_id, "run_id")


async def user_id_param(user_id: int = Path(...)) -> int:
    return ids.user_id(user_id, "user_id")


async def project_id_param(project_id: str = Path(..., max_length=200)) -> str:
    return ids.project_id(project_id, "project_id")


def skill_name_param(name: str = Path(..., max_length=200)) -> str:
    return ids.name(name, "name")


async def group_channel_param(channel: str = Path(..., max_length=200)) -> str:
    return ids.name(channel, "channel")


async def chat_id_param(chat_id: str = Path(..., max_length=200)) -> str:
    return ids.chat_id(chat_id, "chat_id")
