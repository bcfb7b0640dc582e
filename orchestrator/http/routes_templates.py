"""Sandbox templates (docs/templates.md): admins define, inspect, list and delete them, mark
them requestable by bots, and set a user's and a group's template. A PUT answers 202 at once; the image builds in the background."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from mounts.layout import GroupRef
from orchestrator.errors import InvalidInput
from orchestrator.http.models import TemplateChoiceOut
from orchestrator.http.auth import Caller, require_admin
from orchestrator.http.params import chat_id_param, group_channel_param, user_id_param
from orchestrator.http.parts import templates_of
from orchestrator.templates.recipe import MAX_FILES, MAX_ITEMS, RecipeInvalid, recipe_of
from orchestrator.templates.repository import TemplateRecord
from orchestrator.templates.service import TemplateService

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
    requestable: bool | None = Field(
        None, description="Whether a bot may ask for it when it starts a run (not part of the recipe); omitted: unchanged."
    )


class TemplateOut(BaseModel):
    name: str
    status: str  # building | ready | failed
    recipe_hash: str | None
    image: str | None  # the image that serves (the last one that built)
    error: str | None = None
    recipe: dict[str, object]
    requestable: bool = False  # a bot may ask for it when it starts a run


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


class GroupTemplateOut(BaseModel):
    channel: str
    chat_id: str
    template: str  # the group's template (`default` when none is set)


def _out(record: TemplateRecord, requestable: set[str]) -> TemplateOut:
    return TemplateOut(
        name=record.name, status=record.status, recipe_hash=record.recipe_hash, image=record.image,
        error=record.error, recipe=record.recipe.as_json(), requestable=record.name in requestable,
    )  # fmt: skip


@router.put("/v1/admin/templates/{name}", response_model=TemplateOut, status_code=202, tags=["templates"])
def put_template(
    body: TemplateIn,
    name: str = TemplateName,
    templates: TemplateService = Depends(templates_of),
    _: Caller = Depends(require_admin),
) -> TemplateOut:
    try:
        recipe = recipe_of(name=name, parent=body.parent, apt=body.apt, pip=body.pip, npm=body.npm,
                           files=body.files, env=body.env)  # fmt: skip
    except RecipeInvalid as exc:
        raise InvalidInput(str(exc), field=exc.field) from None
    record = templates.put(name, recipe)
    if body.requestable is not None:
        templates.set_requestable(name, body.requestable)
    return _out(record, templates.requestable())


@router.get("/v1/admin/templates/{name}", response_model=TemplateDetailOut, tags=["templates"])
def get_template(
    name: str = TemplateName,
    templates: TemplateService = Depends(templates_of),
    _: Caller = Depends(require_admin),
) -> TemplateDetailOut:
    record = templates.get(name)
    return TemplateDetailOut(**_out(record, templates.requestable()).model_dump(), log=record.log)


@router.get("/v1/admin/templates", response_model=TemplateListOut, tags=["templates"])
def list_templates(
    templates: TemplateService = Depends(templates_of), _: Caller = Depends(require_admin)
) -> TemplateListOut:
    requestable = templates.requestable()
    return TemplateListOut(templates=[_out(r, requestable) for r in templates.repo.all()])


@router.delete("/v1/admin/templates/{name}", status_code=204, tags=["templates"],
               responses={409: {"description": "template_in_use"}})  # fmt: skip
def delete_template(
    name: str = TemplateName,
    templates: TemplateService = Depends(templates_of),
    _: Caller = Depends(require_admin),
) -> Response:
    templates.delete(name)
    return Response(status_code=204)


@router.put("/v1/admin/users/{user_id}/template", response_model=UserTemplateOut, tags=["templates"])
def put_user_template(
    body: UserTemplateIn,
    user_id: int = Depends(user_id_param),
    templates: TemplateService = Depends(templates_of),
    _: Caller = Depends(require_admin),
) -> UserTemplateOut:
    """From the user's next call on, an idle sandbox is recreated from the template's image
    (files kept); one with calls under way finishes them first."""
    templates.assign_user(user_id, body.template)
    choice = templates.effective(user_id)
    return UserTemplateOut(user_id=user_id, template=TemplateChoiceOut.model_validate(choice, from_attributes=True))


@router.put("/v1/admin/groups/{channel}/{chat_id}/template", response_model=GroupTemplateOut, tags=["templates"])
def put_group_template(
    body: UserTemplateIn,
    channel: str = Depends(group_channel_param),
    chat_id: str = Depends(chat_id_param),
    templates: TemplateService = Depends(templates_of),
    _: Caller = Depends(require_admin),
) -> GroupTemplateOut:
    """The template of the group's members' sandboxes in the group's sessions (a member's own
    template, set for the user, still comes first: docs/templates.md)."""
    group = GroupRef(channel, chat_id)
    templates.assign_group(group, body.template)
    return GroupTemplateOut(channel=channel, chat_id=chat_id, template=templates.group_template(group))


@router.get("/v1/admin/groups/{channel}/{chat_id}/template", response_model=GroupTemplateOut, tags=["templates"])
def get_group_template(
    channel: str = Depends(group_channel_param),
    chat_id: str = Depends(chat_id_param),
    templates: TemplateService = Depends(templates_of),
    _: Caller = Depends(require_admin),
) -> GroupTemplateOut:
    group = GroupRef(channel, chat_id)
    return GroupTemplateOut(channel=channel, chat_id=chat_id, template=templates.group_template(group))
