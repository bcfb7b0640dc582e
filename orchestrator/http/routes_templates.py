"""Sandbox templates (docs/templates.md): admins define, inspect, list and delete them, and set
a user's template. A PUT answers 202 at once; the image builds in the background."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.errors import InvalidInput
from orchestrator.http.models import TemplateChoiceOut
from orchestrator.http.routes_core import template_choice_out
from orchestrator.http.auth import Caller, require_admin, service_of
from orchestrator.http.params import user_id_param
from orchestrator.service import OrchestratorService
from orchestrator.templates.recipe import MAX_FILES, MAX_ITEMS, RecipeInvalid, recipe_of
from orchestrator.templates.repository import TemplateRecord

router = APIRouter()

TemplateName = Path(..., min_length=1, max_length=40, description="[a-z0-9][a-z0-9-]{0,39}; `default` is reserved.")


class TemplateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    parent: str | None = Field(None, max_length=40, description="The template built upon; default: `default`.")
    apt: list[str] = Field(default_factory=list, max_length=MAX_ITEMS, description="Debian packages to add.")
    pip: list[str] = Field(default_factory=list, max_length=MAX_ITEMS, description="pip packages (`name[==version]`).")
    npm: list[str] = Field(default_factory=list, max_length=MAX_ITEMS, description="npm packages (`name[@version]`).")
    files: dict[str, str] = Field(default_factory=dict, max_length=MAX_FILES, description="Absolute path -> text.")
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ITEMS, description="Variables of the shells.")


class TemplateOut(BaseModel):
    name: str
    status: str  # building | ready | failed
    recipe_hash: str | None
    image: str | None  # the image that serves (the last one that built)
    error: str | None = None
    recipe: dict[str, object]


class TemplateDetailOut(TemplateOut):
    log: str  # the tail of the latest build's log


class TemplateListOut(BaseModel):
    templates: list[TemplateOut]


class UserTemplateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    template: str | None = Field(..., max_length=40, description="A template's name; null: back to the default.")


class UserTemplateOut(BaseModel):
    user_id: int
    template: TemplateChoiceOut


def _out(record: TemplateRecord) -> TemplateOut:
    return TemplateOut(
        name=record.name, status=record.status, recipe_hash=record.recipe_hash, image=record.image,
        error=record.error, recipe=record.recipe.as_json(),
    )  # fmt: skip


@router.put("/v1/admin/templates/{name}", response_model=TemplateOut, status_code=202, tags=["templates"])
def put_template(
    body: TemplateIn,
    name: str = TemplateName,
    service: OrchestratorService = Depends(service_of),
    _: Caller = Depends(require_admin),
) -> TemplateOut:
    try:
        recipe = recipe_of(name=name, parent=body.parent, apt=body.apt, pip=body.pip, npm=body.npm,
                           files=body.files, env=body.env)  # fmt: skip
    except RecipeInvalid as exc:
        raise InvalidInput(str(exc), field=exc.field) from None
    return _out(service.templates.put(name, recipe))


@router.get("/v1/admin/templates/{name}", response_model=TemplateDetailOut, tags=["templates"])
def get_template(
    name: str = TemplateName,
    service: OrchestratorService = Depends(service_of),
    _: Caller = Depends(require_admin),
) -> TemplateDetailOut:
    record = service.templates.get(name)
    return TemplateDetailOut(**_out(record).model_dump(), log=record.log)


@router.get("/v1/admin/templates", response_model=TemplateListOut, tags=["templates"])
def list_templates(
    service: OrchestratorService = Depends(service_of), _: Caller = Depends(require_admin)
) -> TemplateListOut:
    return TemplateListOut(templates=[_out(r) for r in service.templates.repo.all()])


@router.delete("/v1/admin/templates/{name}", status_code=204, tags=["templates"],
               responses={409: {"description": "template_in_use"}})  # fmt: skip
def delete_template(
    name: str = TemplateName,
    service: OrchestratorService = Depends(service_of),
    _: Caller = Depends(require_admin),
) -> Response:
    service.templates.delete(name)
    return Response(status_code=204)


@router.put("/v1/admin/users/{user_id}/template", response_model=UserTemplateOut, tags=["templates"])
def put_user_template(
    body: UserTemplateIn,
    user_id: int = Depends(user_id_param),
    service: OrchestratorService = Depends(service_of),
    _: Caller = Depends(require_admin),
) -> UserTemplateOut:
    """From the user's next call on, an idle sandbox is recreated from the template's image
    (files kept); one with calls under way finishes them first."""
    service.templates.assign_user(user_id, body.template)
    return UserTemplateOut(user_id=user_id, template=template_choice_out(service, user_id))
