"""The skills API (docs/skills.md): system skills with the admin token, a user's personal
skills with the bot token. PUT installs or replaces a whole skill atomically."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from orchestrator.http.acting import require_self
from orchestrator.http.auth import Caller, acting_user, require_admin, require_bot
from orchestrator.http.params import skill_name_param, user_id_param
from orchestrator.http.parts import skill_admin_of
from orchestrator.http.skill_models import (
    SkillDetailOut,
    SkillInstalledOut,
    SkillListOut,
    SkillPut,
    SkillRemovedOut,
    installed_out,
)
from orchestrator.skills.admin import SkillAdmin

router = APIRouter()


def _put(
    skill_admin: SkillAdmin, user_id: int | None, name: str, body: SkillPut, caller: Caller, response: Response
) -> SkillInstalledOut:
    report = skill_admin.install(user_id, name, body.package_files(), actor=caller.actor)
    response.status_code = 201 if report.created else 200
    return installed_out(report)


def _delete(skill_admin: SkillAdmin, user_id: int | None, name: str, caller: Caller) -> SkillRemovedOut:
    previous = skill_admin.remove(user_id, name, actor=caller.actor)
    kind = "system" if user_id is None else "personal"
    return SkillRemovedOut(name=name, kind=kind, user_id=user_id, removed=True, previous_fingerprint=previous)


# system skills (admin) ------------------------------------------------------------------------
@router.get("/v1/admin/skills", response_model=SkillListOut, tags=["skills"])
def list_system_skills(
    skill_admin: SkillAdmin = Depends(skill_admin_of), _: Caller = Depends(require_admin)
) -> SkillListOut:
    return SkillListOut.model_validate(skill_admin.list())


@router.get("/v1/admin/skills/{name}", response_model=SkillDetailOut, tags=["skills"])
def get_system_skill(
    name: str = Depends(skill_name_param),
    skill_admin: SkillAdmin = Depends(skill_admin_of),
    _: Caller = Depends(require_admin),
) -> SkillDetailOut:
    return SkillDetailOut.model_validate(skill_admin.get(None, name))


@router.put(
    "/v1/admin/skills/{name}",
    response_model=SkillInstalledOut,
    tags=["skills"],
    responses={201: {"model": SkillInstalledOut, "description": "created"}},
)
def put_system_skill(
    body: SkillPut,
    response: Response,
    name: str = Depends(skill_name_param),
    skill_admin: SkillAdmin = Depends(skill_admin_of),
    caller: Caller = Depends(require_admin),
) -> SkillInstalledOut:
    return _put(skill_admin, None, name, body, caller, response)


@router.delete("/v1/admin/skills/{name}", response_model=SkillRemovedOut, tags=["skills"])
def delete_system_skill(
    name: str = Depends(skill_name_param),
    skill_admin: SkillAdmin = Depends(skill_admin_of),
    caller: Caller = Depends(require_admin),
) -> SkillRemovedOut:
    return _delete(skill_admin, None, name, caller)


# a user's personal skills (bot) ----------------------------------------------------------------
@router.get("/v1/users/{user_id}/skills", response_model=SkillListOut, tags=["skills"])
def list_personal_skills(
    user_id: int = Depends(user_id_param),
    acting: int | None = Depends(acting_user),
    skill_admin: SkillAdmin = Depends(skill_admin_of),
    _: Caller = Depends(require_bot),
) -> SkillListOut:
    require_self(acting, user_id)
    return SkillListOut.model_validate(skill_admin.list(user_id))


@router.get("/v1/users/{user_id}/skills/{name}", response_model=SkillDetailOut, tags=["skills"])
def get_personal_skill(
    user_id: int = Depends(user_id_param),
    acting: int | None = Depends(acting_user),
    name: str = Depends(skill_name_param),
    skill_admin: SkillAdmin = Depends(skill_admin_of),
    _: Caller = Depends(require_bot),
) -> SkillDetailOut:
    require_self(acting, user_id)
    return SkillDetailOut.model_validate(skill_admin.get(user_id, name))


@router.put(
    "/v1/users/{user_id}/skills/{name}",
    response_model=SkillInstalledOut,
    tags=["skills"],
    responses={201: {"model": SkillInstalledOut, "description": "created"}},
)
def put_personal_skill(
    body: SkillPut,
    response: Response,
    user_id: int = Depends(user_id_param),
    acting: int | None = Depends(acting_user),
    name: str = Depends(skill_name_param),
    skill_admin: SkillAdmin = Depends(skill_admin_of),
    caller: Caller = Depends(require_bot),
) -> SkillInstalledOut:
    require_self(acting, user_id)
    return _put(skill_admin, user_id, name, body, caller, response)


@router.delete("/v1/users/{user_id}/skills/{name}", response_model=SkillRemovedOut, tags=["skills"])
def delete_personal_skill(
    user_id: int = Depends(user_id_param),
    acting: int | None = Depends(acting_user),
    name: str = Depends(skill_name_param),
    skill_admin: SkillAdmin = Depends(skill_admin_of),
    caller: Caller = Depends(require_bot),
) -> SkillRemovedOut:
    require_self(acting, user_id)
    return _delete(skill_admin, user_id, name, caller)
