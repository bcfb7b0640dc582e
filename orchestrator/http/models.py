"""Request and response bodies of the HTTP API. Unknown fields are refused (422)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AliasPath, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from mounts import ids
from mounts.layout import GroupRef
from orchestrator.collaboration.coordinator import DELIVERY_ID
from orchestrator.identity import Trigger
from orchestrator.runs.records import RunStatus
from orchestrator.identity import IdentityMode
from orchestrator.users.identities import PlatformIdentity


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FromRecord(BaseModel):
    """An answer read off a record (`Out.model_validate(record)`): fields are taken from the
    record's attributes by name, nested records become their own `FromRecord` models."""

    model_config = ConfigDict(from_attributes=True)


def _check(validator, value, field):
    try:
        return validator(value, field)
    except ids.InvalidIdentifier as exc:
        raise ValueError(exc.message) from None


def _json_integer(value: object) -> object:
    """JSON has one number type: 17.0 is the integer 17 (JSON Schema says so too), while
    true, "17" and 17.5 stay refused by the strict check after this."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


JsonInt = Annotated[int, BeforeValidator(_json_integer)]
# The bounds sit inside the type, so they stay in the schema of an optional field too.
UserIdInt = Annotated[int, Field(gt=0, le=ids.MAX_USER_ID, strict=True), BeforeValidator(_json_integer)]
UserIdField = Field(..., gt=0, le=ids.MAX_USER_ID, strict=True)


class GroupIn(Body):
    channel: str = Field(..., max_length=64, json_schema_extra={"pattern": ids.NAME_PATTERN})
    chat_id: str = Field(..., max_length=128, json_schema_extra={"pattern": ids.CHAT_ID_PATTERN})

    @field_validator("channel")
    @classmethod
    def _channel(cls, v: str) -> str:
        return _check(ids.name, v, "channel")

    @field_validator("chat_id")
    @classmethod
    def _chat(cls, v: str) -> str:
        return _check(ids.chat_id, v, "chat_id")

    def ref(self) -> GroupRef:
        return GroupRef(self.channel, self.chat_id)


class GroupOut(FromRecord):
    channel: str
    chat_id: str


class PersonIn(Body):
    """A person as their chat platform names them (`{"platform": "slack", "id": "U024BE7LH"}`)."""

    platform: str = Field(..., max_length=32, json_schema_extra={"pattern": ids.PLATFORM_PATTERN})
    id: str = Field(..., min_length=1, max_length=ids.MAX_EXTERNAL_ID_CHARS, json_schema_extra={"pattern": ids.EXTERNAL_ID_PATTERN})

    @field_validator("platform")
    @classmethod
    def _platform(cls, v: str) -> str:
        return _check(ids.platform, v, "platform")

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        return _check(ids.external_id, v, "id")

    def identity(self) -> PlatformIdentity:
        return PlatformIdentity(self.platform, self.id)


class PersonOut(BaseModel):
    platform: str
    id: str


def _channel_name(v: str) -> str:
    return _check(ids.platform, v, "channel")


ChannelName = Annotated[
    str,
    Field(max_length=32, json_schema_extra={"pattern": ids.PLATFORM_PATTERN}, description="any platform name; `*_group`: a group chat's"),
    BeforeValidator(lambda v: _channel_name(v) if isinstance(v, str) else v),
]


class UserIn(Body):
    display_name: str | None = Field(None, max_length=200)
    backend: Literal["auto", "docker", "process", "kubernetes"] | None = None


class TemplateChoiceOut(BaseModel):
    name: str
    source: str  # user | group | skill | run | default


class LackingTemplateOut(BaseModel):
    skill: str
    template: str  # the template the skill declares
    why: str  # why this sandbox does not run it


class RunTemplateOut(BaseModel):
    """The template of a run's calls, why, and the skills whose template the sandbox lacks."""

    name: str
    source: str
    lacking: list[LackingTemplateOut]


class UserOut(BaseModel):
    user_id: int
    display_name: str | None
    backend: str | None
    groups: list[GroupOut]
    identities: list[PersonOut] = []  # the platform identities that name this user
    template: TemplateChoiceOut | None = None  # the template the user's sandbox runs, and why


class IdentityIn(Body):
    display_name: str | None = Field(None, max_length=200)


class IdentityOut(BaseModel):
    user_id: int
    platform: str
    external_id: str
    display_name: str | None


class IdentityLinkIn(Body):
    user_id: UserIdInt


class IdentityListOut(BaseModel):
    identities: list[IdentityOut]
    next_after: str | None  # pass as `after` for the next page; null: no more


class MemberRemovedOut(BaseModel):
    channel: str
    chat_id: str
    user_id: int
    removed: bool  # False: it was not a member


class ProjectSettingsIn(Body):
    cross_session_read: bool | None = Field(None, strict=True)
    cross_project_collaboration: bool | None = Field(None, strict=True)


class ProjectSettingsOut(FromRecord):
    project_id: str
    cross_session_read: bool
    cross_project_collaboration: bool


class SessionCreate(Body):
    session_id: str | None = Field(None, max_length=128, json_schema_extra={"pattern": ids.SESSION_ID_PATTERN})
    owner_user_id: UserIdInt | None = Field(None, description="our user id; or `owner` instead")
    owner: PersonIn | None = Field(None, description="the owner by platform identity, in place of `owner_user_id`")
    project_id: str | None = Field(None, max_length=64, json_schema_extra={"pattern": ids.PROJECT_ID_PATTERN})
    channel: ChannelName
    group: GroupIn | None = None
    parent_session_id: str | None = Field(
        None, max_length=128, json_schema_extra={"pattern": ids.SESSION_ID_PATTERN}
    )
    title: str | None = Field(None, max_length=500)
    if_exists: Literal["conflict", "return"] = Field(
        "conflict",
        description="`return`: a live session with this `session_id` and the same owner, channel, group, "
        "project and parent is returned (200) instead of 409, so a bot may create a chat's session per message",
    )

    @field_validator("session_id", "parent_session_id")
    @classmethod
    def _sid(cls, v: str | None, info) -> str | None:
        return None if v is None else _check(ids.session_id, v, info.field_name)

    @field_validator("project_id")
    @classmethod
    def _pid(cls, v: str | None) -> str | None:
        return None if v is None else _check(ids.project_id, v, "project_id")


class SessionPatch(Body):
    """Only the fields sent change. `title: null` clears the title; a flag is true or false,
    never null (an omitted flag stays as it is), so a null flag is a 422, not a 500 from the
    store's NOT NULL column. The flags are typed `bool` with an unvalidated default of None, so
    "not sent" stays distinguishable from "sent"."""

    title: str | None = Field(None, max_length=500)
    archived: bool = Field(None, strict=True)  # type: ignore[assignment]
    pinned: bool = Field(None, strict=True)  # type: ignore[assignment]
    allow_cross_read: bool = Field(None, strict=True)  # type: ignore[assignment]
    cross_private: bool = Field(None, strict=True)  # type: ignore[assignment]


class SessionOut(FromRecord):
    session_id: str
    owner_user_id: int
    owner_identity: PersonOut | None = None  # the owner's platform identity, when one is known
    project_id: str | None
    channel: str
    group: GroupOut | None
    parent_session_id: str | None
    title: str | None
    last_runtime_user_id: int | None
    allow_cross_read: bool
    cross_private: bool
    archived: bool
    pinned: bool
    created_at: str
    updated_at: str


class RunStart(Body):
    trigger: Trigger
    speaker_user_id: UserIdInt | None = None
    speaker: PersonIn | None = Field(None, description="the speaker by platform identity, in place of `speaker_user_id`")
    agent_id: str = Field("default", max_length=64, json_schema_extra={"pattern": ids.NAME_PATTERN})
    delivery_id: str | None = Field(None, max_length=128, json_schema_extra={"pattern": f"^{DELIVERY_ID.pattern}$"})
    template: str | None = Field(
        None, max_length=40,
        description="A sandbox template for this run's calls: `default` or one an admin marked requestable "
        "(else 403 `template_not_requestable`, nothing started).",
    )  # fmt: skip

    @field_validator("agent_id")
    @classmethod
    def _agent(cls, v: str) -> str:
        return _check(ids.name, v, "agent_id")


class SkillCatalogOut(FromRecord):
    name: str
    path: str
    kind: str


class SkillsOut(FromRecord):
    available: list[str]
    failed: list[str]
    catalog: list[SkillCatalogOut]


def _of_run(name: str) -> Any:
    return Field(validation_alias=AliasPath("run", name))


class DelegatedCredentialOut(FromRecord):
    credential: str
    owner_user_id: int
    hosts: list[str]
    expires_at: str
    grant_id: str


class RunContextOut(FromRecord):
    # Read off a `RunContext` (`model_validate`): the run's own fields come from its `run`.
    run_id: str = _of_run("run_id")
    session_id: str = _of_run("session_id")
    trigger: Trigger = _of_run("trigger")
    owner_user_id: int = _of_run("owner_user_id")
    execution_user_id: int | None = _of_run("execution_user_id")
    runtime_user_id: int = _of_run("runtime_user_id")
    identity_mode: IdentityMode = _of_run("identity_mode")
    owner_identity: PersonOut | None = None
    speaker_identity: PersonOut | None = None  # the execution user's, when the run has one
    workdir: str
    upload_dir: str
    outputs_dir: str  # in the workdir: where a run's results (charts, reports) go
    group_workspace: str | None  # the group chat's shared workspace, when the session has a group
    skills: SkillsOut
    archive_hint_enabled: bool
    memory_user_id: int
    prompt_identity_section: str | None
    delegated_credentials: list[DelegatedCredentialOut] = Field(
        default_factory=list, description="Credentials other members granted to this run (metadata: never a secret)."
    )
    template: RunTemplateOut | None = None

    @field_validator("template", mode="before")
    @classmethod
    def _template(cls, v: Any) -> Any:
        if v is None or isinstance(v, (dict, RunTemplateOut)):
            return v
        return RunTemplateOut(
            name=v.choice.name, source=v.choice.source,
            lacking=[LackingTemplateOut(skill=s, template=t, why=w) for s, t, w in v.lacking],
        )  # fmt: skip


class RunEnd(Body):
    status: Literal["succeeded", "failed", "cancelled"] = "succeeded"


class RunOut(FromRecord):
    run_id: str
    session_id: str
    trigger: Trigger
    owner_user_id: int
    execution_user_id: int | None
    runtime_user_id: int
    identity_mode: IdentityMode
    owner_identity: PersonOut | None = None
    speaker_identity: PersonOut | None = None
    status: RunStatus
    started_at: str
    ended_at: str | None


class ToolCallIn(Body):
    arguments: dict[str, Any] = Field(default_factory=dict)
    tool_call_id: str | None = Field(None, min_length=1, max_length=200)


class ToolCallOut(BaseModel):
    """`{"ok": true, "result": ...}` or `{"ok": false, "error": {"code", "message", ...}}`."""

    ok: bool
    result: Any = None
    error: dict[str, Any] | None = None


class IdentityModeIn(Body):
    mode: IdentityMode | None = Field(..., description="`null`: drop the admin's change; the configured mode applies")


class IdentityModeOut(BaseModel):
    mode: IdentityMode
    source: str
    changed_at: str
    invalid_value: str | None
    configured_mode: IdentityMode  # what applies without (or after clearing) an admin change
    configured_source: str
