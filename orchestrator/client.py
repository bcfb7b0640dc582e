"""A Python client for chat bots and admins, over httpx (docs/bots.md).

Only httpx and pydantic are needed: a bot can vendor this one module. Every method returns a
typed model; an HTTP error raises a typed `ApiError` subclass carrying the server's structured
error (`code`, `message`, `field`, details). A tool-level failure (200 with `ok: false`) is not
an exception: it is a `ToolResult` the model should see, with `raise_for_error()` for callers
that want one.

    with OrchestratorClient("http://127.0.0.1:8700", token="...") as bot:
        session = bot.create_session(owner_user_id=17, channel="feishu_group", group=("feishu", "oc_1"))
        run = bot.start_run(session.session_id, trigger="group_message", speaker_user_id=67)
        result = bot.call_tool(run.run_id, "read_file", {"path": "notes.md"})
"""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Literal
from urllib.parse import quote, unquote

import httpx
from pydantic import BaseModel, ConfigDict

Trigger = Literal[
    "group_message",
    "private_message",
    "retry",
    "crash_recovery",
    "subagent",
    "web",
    "scheduled",
    "openapi",
    "manual_compaction",
    "side_task",
    "wechat",
]


# --- errors ---------------------------------------------------------------------------------


class ApiError(Exception):
    """The server refused a request; `code`, `message` and `field` come from its error body."""

    status: int | None = None

    def __init__(
        self,
        message: str,
        *,
        code: str = "error",
        status: int | None = None,
        field: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.message = message
        self.code = code
        if status is not None:
            self.status = status
        self.field = field
        self.details = dict(details or {})


class BadRequest(ApiError):
    status = 400


class Unauthorized(ApiError):
    status = 401


class Forbidden(ApiError):
    status = 403


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    status = 409


class Gone(ApiError):
    status = 410


class InvalidRequest(ApiError):
    status = 422


class Unavailable(ApiError):
    status = 503


class CleanupPending(Unavailable):
    """A session deletion is not finished yet: repeat the delete to continue it."""


class TransportError(ApiError):
    """The server could not be reached, or the connection broke."""


class ToolCallFailed(ApiError):
    """A tool-level failure, raised only by `ToolResult.raise_for_error()`."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: InvalidRequest,
    503: Unavailable,
}


def error_from_response(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
        error = dict(body.get("error") or {})
    except (ValueError, AttributeError):
        error = {}
    code = str(error.pop("code", "http_error"))
    message = str(error.pop("message", response.text[:500] or response.reason_phrase))
    field = error.pop("field", None)
    cls = CleanupPending if code == "session_cleanup_pending" else _BY_STATUS.get(response.status_code, ApiError)
    return cls(message, code=code, status=response.status_code, field=field, details=error)


# --- models ---------------------------------------------------------------------------------


class Model(BaseModel):
    # New server fields must not break old bots.
    model_config = ConfigDict(extra="ignore", frozen=True)


class Group(Model):
    channel: str
    chat_id: str


class Health(Model):
    status: str
    version: str
    backend: str
    runtime_identity: str
    runtime_identity_source: str | None = None


class User(Model):
    user_id: int
    display_name: str | None
    backend: str | None
    groups: list[Group]


class ProjectSettings(Model):
    project_id: str
    cross_session_read: bool
    cross_project_collaboration: bool


class Session(Model):
    session_id: str
    owner_user_id: int
    project_id: str | None
    channel: str
    group: Group | None
    parent_session_id: str | None
    title: str | None
    last_runtime_user_id: int | None
    allow_cross_read: bool
    cross_private: bool
    archived: bool
    pinned: bool
    created_at: str
    updated_at: str


class SessionDeleted(Model):
    session_id: str
    deleted: bool
    cleanup_done: bool


class ToolCallSummary(Model):
    name: str
    status: str


class Message(Model):
    seq: int
    at: str
    role: str
    content: str
    tool_calls: list[ToolCallSummary]
    speaker_user_id: int | None


class Messages(Model):
    session_id: str
    total: int
    messages: list[Message]


class Appended(Model):
    session_id: str
    appended: int
    message_count: int
    last_seq: int


class SkillCatalogEntry(Model):
    name: str
    path: str
    kind: str


class RunSkills(Model):
    available: list[str]
    failed: list[str]
    catalog: list[SkillCatalogEntry]


class RunContext(Model):
    run_id: str
    session_id: str
    trigger: str
    owner_user_id: int
    execution_user_id: int | None
    runtime_user_id: int
    identity_mode: str
    workdir: str
    upload_dir: str
    skills: RunSkills
    archive_hint_enabled: bool
    memory_user_id: int
    prompt_identity_section: str | None


class Run(Model):
    run_id: str
    session_id: str
    trigger: str
    owner_user_id: int
    execution_user_id: int | None
    runtime_user_id: int
    identity_mode: str
    status: str
    started_at: str
    ended_at: str | None


class RunPage(Model):
    runs: list[Run]  # newest first
    next_before: int | None  # pass as `before` for the next (older) page


class SandboxState(Model):
    user_id: int
    backend: str
    state: str  # running | stopped | failed | none
    since: str | None
    busy: int
    last_call_at: str | None


class ToolInfo(Model):
    name: str
    description: str
    place: str
    acts_as: str
    parameters: dict[str, Any]


class ToolErrorInfo(Model):
    model_config = ConfigDict(extra="allow", frozen=True)

    code: str
    message: str

    @property
    def details(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ToolResult(Model):
    ok: bool
    result: Any = None
    error: ToolErrorInfo | None = None

    @property
    def body(self) -> dict[str, Any]:
        """What to hand back to the model: `{"ok", "result"}` or `{"ok", "error"}`."""
        if self.ok:
            return {"ok": True, "result": self.result}
        assert self.error is not None
        return {"ok": False, "error": self.error.model_dump()}

    def raise_for_error(self) -> ToolResult:
        if not self.ok:
            assert self.error is not None
            details = self.error.details
            raise ToolCallFailed(self.error.message, code=self.error.code, status=200, field=details.pop("field", None), details=details)
        return self


class Delivery(Model):
    delivery_id: str
    run_id: str
    session_id: str
    runtime_user_id: int
    tool: str
    kind: str
    file_name: str
    media_type: str
    size: int
    sha256: str
    source: str
    created_at: str
    expires_at: str
    fetched_at: str | None


class DeliveryContent(Model):
    delivery_id: str
    kind: str
    file_name: str | None
    media_type: str
    sha256: str
    data: bytes


class InboxDelivery(Model):
    model_config = ConfigDict(extra="allow", frozen=True)

    delivery_id: str
    session_id: str
    direction: str
    request_ids: list[str]
    claim_expires_at: str
    context: str


class IdentityMode(Model):
    mode: str
    source: str
    changed_at: str
    invalid_value: str | None
    configured_mode: str | None = None
    configured_source: str | None = None


class SkillEntry(Model):
    path: str
    kind: str
    executable: bool = False
    size: int = 0
    sha256: str | None = None
    target: str | None = None


class Skill(Model):
    """A skill source as the server's skill code knows it."""

    name: str
    kind: str  # system | personal
    user_id: int | None
    path: str
    valid: bool
    fingerprint: str | None
    problem: str | None
    files: int
    bytes: int


class SkillDetail(Skill):
    entries: list[SkillEntry]


class IgnoredSkillEntry(Model):
    name: str
    reason: str


class SkillList(Model):
    skills: list[Skill]
    ignored: list[IgnoredSkillEntry]

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.skills]


class SkillInstalled(Skill):
    created: bool
    changed: bool
    previous_fingerprint: str | None


class SkillRemoved(Model):
    name: str
    kind: str
    user_id: int | None
    removed: bool
    previous_fingerprint: str | None


class SkillFile(Model):
    """A file of a skill to install: text or bytes, and its executable bit."""

    content: str | bytes
    executable: bool = False


SkillFiles = Mapping[str, str | bytes | SkillFile]


def _skill_body(files: SkillFiles) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, file in files.items():
        if not isinstance(file, SkillFile):
            file = SkillFile(content=file)
        if isinstance(file.content, bytes):
            out[path] = {"base64": base64.b64encode(file.content).decode("ascii"), "executable": file.executable}
        else:
            out[path] = {"text": file.content, "executable": file.executable}
    return {"files": out}


def skill_files_from_dir(directory: str | os.PathLike[str]) -> dict[str, SkillFile]:
    """A local skill directory as the files of `put_skill` (bytes, executable bits).
    Symlinks and special files cannot be sent: they raise ValueError."""
    root = os.fspath(directory)
    files: dict[str, SkillFile] = {}
    for current, dirs, names in os.walk(root, followlinks=False):
        for name in sorted(dirs + names):
            path = os.path.join(current, name)
            st = os.lstat(path)
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{relative}: only regular files can be sent (not a symlink or special file)")
            with open(path, "rb") as f:
                files[relative] = SkillFile(content=f.read(), executable=bool(st.st_mode & 0o111))
    return files


# --- the client -----------------------------------------------------------------------------


def _without_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


class OrchestratorClient:
    """One bot's connection to the orchestrator. `admin_token` is used for `/v1/admin/*`."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        admin_token: str | None = None,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._admin_headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport, trust_env=False
        )

    def __enter__(self) -> OrchestratorClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # plumbing --------------------------------------------------------------------------
    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        acting_user: int | None = None,
        admin: bool = False,
        auth: bool = True,
    ) -> httpx.Response:
        headers: dict[str, str] = {}
        if admin:
            headers.update(self._admin_headers)
        if acting_user is not None:
            headers["X-Acting-User"] = str(acting_user)
        try:
            if auth:
                response = self._http.request(method, path, json=json, params=params, headers=headers)
            else:  # public routes: never send a token where it is not needed
                request = self._http.build_request(method, path, params=params)
                request.headers.pop("Authorization", None)
                response = self._http.send(request)
        except httpx.TimeoutException as exc:
            raise TransportError(f"{method} {path} timed out: {exc}", code="timeout") from exc
        except httpx.HTTPError as exc:
            raise TransportError(f"{method} {path} failed: {exc}", code="transport_error") from exc
        if response.status_code >= 400:
            raise error_from_response(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    # health, users, projects ---------------------------------------------------------------
    def health(self) -> Health:
        return Health.model_validate(self._json("GET", "/healthz"))

    def put_user(self, user_id: int, *, display_name: str | None = None, backend: str | None = None) -> User:
        """`backend` (an override) needs the admin token; never below the server's isolation floor."""
        body = _without_none({"display_name": display_name, "backend": backend})
        return User.model_validate(self._json("PUT", f"/v1/users/{user_id}", json=body, admin=backend is not None))

    def get_user(self, user_id: int) -> User:
        return User.model_validate(self._json("GET", f"/v1/users/{user_id}"))

    def remove_group_member(self, channel: str, chat_id: str, user_id: int) -> bool:
        """Revoke a membership (effective for the user's next call); False when there was none."""
        path = f"/v1/groups/{quote(channel, safe='')}/{quote(chat_id, safe='')}/members/{user_id}"
        return bool(self._json("DELETE", path)["removed"])

    def put_project_settings(
        self, project_id: str, *, cross_session_read: bool | None = None, cross_project_collaboration: bool | None = None
    ) -> ProjectSettings:
        body = _without_none(
            {"cross_session_read": cross_session_read, "cross_project_collaboration": cross_project_collaboration}
        )
        return ProjectSettings.model_validate(self._json("PUT", f"/v1/projects/{project_id}/settings", json=body))

    def get_project_settings(self, project_id: str) -> ProjectSettings:
        return ProjectSettings.model_validate(self._json("GET", f"/v1/projects/{project_id}/settings"))

    # sessions --------------------------------------------------------------------------
    def create_session(
        self,
        *,
        owner_user_id: int,
        channel: str,
        session_id: str | None = None,
        project_id: str | None = None,
        group: Group | tuple[str, str] | None = None,
        parent_session_id: str | None = None,
        title: str | None = None,
        acting_user: int | None = None,
        if_exists: Literal["conflict", "return"] | None = None,
    ) -> Session:
        """`if_exists="return"`: the live session that already has this `session_id` (and the same
        owner, channel, group, project, parent) instead of `Conflict`: create a chat's session per message."""
        if isinstance(group, tuple):
            group = Group(channel=group[0], chat_id=group[1])
        body = _without_none(
            {
                "owner_user_id": owner_user_id,
                "channel": channel,
                "session_id": session_id,
                "project_id": project_id,
                "group": group.model_dump() if group else None,
                "parent_session_id": parent_session_id,
                "title": title,
                "if_exists": if_exists,
            }
        )
        return Session.model_validate(self._json("POST", "/v1/sessions", json=body, acting_user=acting_user))

    def group_sessions(self, channel: str, chat_id: str, *, acting_user: int | None = None) -> list[Session]:
        """A group chat's live sessions, whoever owns them, newest first."""
        params = {"channel": channel, "chat_id": chat_id}
        body = self._json("GET", "/v1/sessions", params=params, acting_user=acting_user)
        return [Session.model_validate(s) for s in body["sessions"]]

    def list_runs(
        self, session_id: str, *, limit: int = 20, before: int | None = None, acting_user: int | None = None
    ) -> RunPage:
        params = _without_none({"limit": limit, "before": before})
        return RunPage.model_validate(
            self._json("GET", f"/v1/sessions/{quote(session_id, safe='')}/runs", params=params, acting_user=acting_user)
        )

    def sandbox(self, user_id: int, *, acting_user: int | None = None) -> SandboxState:
        """The user's sandbox: backend, state, since when, and the user's last tool call."""
        return SandboxState.model_validate(self._json("GET", f"/v1/users/{int(user_id)}/sandbox", acting_user=acting_user))

    def get_session(self, session_id: str, *, acting_user: int | None = None) -> Session:
        return Session.model_validate(self._json("GET", f"/v1/sessions/{session_id}", acting_user=acting_user))

    def update_session(self, session_id: str, *, acting_user: int | None = None, **changes: Any) -> Session:
        """Change `title`, `archived`, `pinned`, `allow_cross_read`, `cross_private`."""
        return Session.model_validate(
            self._json("PATCH", f"/v1/sessions/{session_id}", json=changes, acting_user=acting_user)
        )

    def list_sessions(
        self, *, owner_user_id: int | None = None, project_id: str | None = None, acting_user: int | None = None
    ) -> list[Session]:
        params = _without_none({"owner_user_id": owner_user_id, "project_id": project_id})
        body = self._json("GET", "/v1/sessions", params=params, acting_user=acting_user)
        return [Session.model_validate(s) for s in body["sessions"]]

    def delete_session(self, session_id: str, *, acting_user: int | None = None) -> SessionDeleted:
        """Raises `CleanupPending` when the cleanup is not finished: call it again to continue."""
        return SessionDeleted.model_validate(self._json("DELETE", f"/v1/sessions/{session_id}", acting_user=acting_user))

    def append_messages(
        self, session_id: str, messages: Iterable[Mapping[str, Any]], *, acting_user: int | None = None
    ) -> Appended:
        """Each message: `role` (user, assistant, tool), `content`, optional `tool_calls`
        (`[{name, status}]`) and `speaker_user_id`."""
        body = {"messages": [dict(m) for m in messages]}
        return Appended.model_validate(
            self._json("POST", f"/v1/sessions/{session_id}/messages", json=body, acting_user=acting_user)
        )

    def read_messages(self, session_id: str, *, limit: int = 50, acting_user: int | None = None) -> Messages:
        return Messages.model_validate(
            self._json("GET", f"/v1/sessions/{session_id}/messages", params={"limit": limit}, acting_user=acting_user)
        )

    # runs and tools ---------------------------------------------------------------------
    def start_run(
        self,
        session_id: str,
        *,
        trigger: Trigger | str,
        speaker_user_id: int | None = None,
        agent_id: str | None = None,
        delivery_id: str | None = None,
        acting_user: int | None = None,
    ) -> RunContext:
        body = _without_none(
            {"trigger": trigger, "speaker_user_id": speaker_user_id, "agent_id": agent_id, "delivery_id": delivery_id}
        )
        return RunContext.model_validate(
            self._json("POST", f"/v1/sessions/{session_id}/runs", json=body, acting_user=acting_user)
        )

    def get_run(self, run_id: str) -> Run:
        return Run.model_validate(self._json("GET", f"/v1/runs/{run_id}"))

    def end_run(self, run_id: str, status: Literal["succeeded", "failed", "cancelled"] = "succeeded") -> Run:
        return Run.model_validate(self._json("POST", f"/v1/runs/{run_id}/end", json={"status": status}))

    def list_tools(self) -> list[ToolInfo]:
        return [ToolInfo.model_validate(t) for t in self._json("GET", "/v1/tools")["tools"]]

    def call_tool(
        self, run_id: str, name: str, arguments: Mapping[str, Any] | None = None, *, tool_call_id: str | None = None
    ) -> ToolResult:
        body = _without_none({"arguments": dict(arguments or {}), "tool_call_id": tool_call_id})
        return ToolResult.model_validate(self._json("POST", f"/v1/runs/{run_id}/tools/{name}", json=body))

    # outgoing deliveries and public uploads --------------------------------------------------
    def fetch_delivery(self, delivery_id: str) -> DeliveryContent:
        """The bytes `send_file` / `send_image` produced, to post to the chat."""
        response = self._request("GET", f"/v1/deliveries/{delivery_id}")
        disposition = response.headers.get("content-disposition", "")
        file_name = None
        if "filename*=UTF-8''" in disposition:
            file_name = unquote(disposition.split("filename*=UTF-8''", 1)[1].split(";", 1)[0])
        return DeliveryContent(
            delivery_id=delivery_id,
            kind=response.headers.get("x-delivery-kind", "file"),
            file_name=file_name,
            media_type=response.headers.get("content-type", "application/octet-stream").split(";", 1)[0],
            sha256=response.headers.get("x-delivery-sha256", ""),
            data=response.content,
        )

    def list_deliveries(self, run_id: str) -> list[Delivery]:
        return [Delivery.model_validate(d) for d in self._json("GET", f"/v1/runs/{run_id}/deliveries")["deliveries"]]

    def delete_delivery(self, delivery_id: str) -> None:
        self._request("DELETE", f"/v1/deliveries/{delivery_id}")

    def fetch_upload(self, url: str) -> bytes:
        """A public artifact by its URL, without a token (it must be this server's)."""
        base = str(self._http.base_url).rstrip("/")
        path = url[len(base) :] if url.startswith(base) else url
        return self._request("GET", path, auth=False).content

    # collaboration inbox ---------------------------------------------------------------------
    def inbox(self, session_id: str, *, wait_s: float = 0.0, acting_user: int | None = None) -> InboxDelivery | None:
        body = self._json("GET", f"/v1/sessions/{session_id}/inbox", params={"wait_s": wait_s}, acting_user=acting_user)
        return InboxDelivery.model_validate(body["delivery"]) if body.get("delivery") else None

    # admin ------------------------------------------------------------------------------
    def get_runtime_identity(self) -> IdentityMode:
        return IdentityMode.model_validate(self._json("GET", "/v1/admin/runtime-identity", admin=True))

    def set_runtime_identity(self, mode: Literal["execution", "owner"] | None) -> IdentityMode:
        """`None`: drop the admin's change, back to the configured mode."""
        return IdentityMode.model_validate(
            self._json("PUT", "/v1/admin/runtime-identity", json={"mode": mode}, admin=True)
        )

    def audit(self, *, action: str | None = None, session_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        params = _without_none({"action": action, "session_id": session_id, "limit": limit})
        return list(self._json("GET", "/v1/admin/audit", params=params, admin=True)["entries"])

    def sandboxes(self) -> dict[str, Any]:
        return dict(self._json("GET", "/v1/admin/sandboxes", admin=True))

    # skills ---------------------------------------------------------------------------------
    def list_skills(self) -> SkillList:
        """The system skills (admin)."""
        return SkillList.model_validate(self._json("GET", "/v1/admin/skills", admin=True))

    def get_skill(self, name: str) -> SkillDetail:
        return SkillDetail.model_validate(self._json("GET", f"/v1/admin/skills/{name}", admin=True))

    def put_skill(self, name: str, files: SkillFiles) -> SkillInstalled:
        """Install or replace the whole system skill `name` (admin). `files`: relative path ->
        text, bytes or `SkillFile`; see `skill_files_from_dir`."""
        return SkillInstalled.model_validate(
            self._json("PUT", f"/v1/admin/skills/{name}", json=_skill_body(files), admin=True)
        )

    def delete_skill(self, name: str) -> SkillRemoved:
        return SkillRemoved.model_validate(self._json("DELETE", f"/v1/admin/skills/{name}", admin=True))

    def list_personal_skills(self, user_id: int) -> SkillList:
        return SkillList.model_validate(self._json("GET", f"/v1/users/{user_id}/skills"))

    def get_personal_skill(self, user_id: int, name: str) -> SkillDetail:
        return SkillDetail.model_validate(self._json("GET", f"/v1/users/{user_id}/skills/{name}"))

    def put_personal_skill(self, user_id: int, name: str, files: SkillFiles) -> SkillInstalled:
        """Install or replace the whole personal skill `name` of `user_id` (bot token)."""
        return SkillInstalled.model_validate(
            self._json("PUT", f"/v1/users/{user_id}/skills/{name}", json=_skill_body(files))
        )

    def delete_personal_skill(self, user_id: int, name: str) -> SkillRemoved:
        return SkillRemoved.model_validate(self._json("DELETE", f"/v1/users/{user_id}/skills/{name}"))
