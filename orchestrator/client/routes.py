"""Every route of the API, once: how its request is built and how its answer is parsed.

Each method of `ClientMethods` returns a `Request` (segments, body, parser); its `@route`
decorator binds the method and the path template, quotes every path segment, and hands the
bound `Call` to the client's `_run` — which sends it (sync or async) and parses the answer.
So the sync and the async clients share all of it, and the route table a test compares with
the server's is the one the requests really use.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote, unquote

import httpx

from orchestrator.client.errors import ApiError, TransportError, error_from_response
from orchestrator.client.models import (
    AdminRunPage,
    AdminUserPage,
    Appended,
    Collaboration,
    CollaborationPage,
    CollaborationStopped,
    Delivery,
    DeliveryContent,
    Preview,
    DiskOverview,
    Credential,
    CredentialGrant,
    CredentialGrants,
    EgressRules,
    Group,
    Health,
    IncomingFile,
    IdentityModeState,
    InboxDelivery,
    Messages,
    ProjectSettings,
    Run,
    RunCodeResult,
    RunContext,
    RunPage,
    SandboxAction,
    SandboxState,
    Session,
    SessionDeleted,
    SharedMemberFreed,
    SharedMembers,
    SkillDetail,
    SkillFiles,
    SkillInstalled,
    SkillList,
    SkillRemoved,
    Template,
    TemplateList,
    ToolInfo,
    ToolResult,
    User,
    UserDisk,
    UserPurged,
    UserResources,
    UserTemplate,
    GroupTemplate,
    UserRef,
    Identity,
    IdentityMode,
    IdentityPage,
    Trigger,
    _skill_body,
    person_body,
    user_ref_text,
)

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 60.0
# A tool call's HTTP timeout: the call's own time limit and this much more, for the server's
# margin around the sandbox (15 s for a shell) and a repeat's bounded wait (10 s more).
TOOL_CALL_MARGIN_S = 60.0
SHELL_DEFAULT_TIMEOUT_S = 60.0  # the server's default `ORCH_TOOL_TIMEOUT_S`
SHELL_MAX_TIMEOUT_S = 600.0  # the server's default `ORCH_TOOL_TIMEOUT_MAX_S`
KERNEL_START_S = 60.0  # a run_code whose kernel starts first (the server's own margin)


def segment(value: object) -> str:
    """One path segment, quoted so nothing in it is a separator or a dot segment: a tool name
    `../end` or `read_file?x=1` stays a tool name."""
    text = quote(str(value), safe="")
    return text.replace(".", "%2E") if text in (".", "..") else text


def tool_call_timeout_s(name: str, arguments: Mapping[str, Any], default_s: float) -> float:
    """How long to wait for a tool call's answer: a shell waits for its `timeout_s`."""
    if name == "process_output":  # a long poll: its wait on top
        waited = arguments.get("wait_s")
        return max(default_s, DEFAULT_TIMEOUT_S) + (float(waited) if isinstance(waited, (int, float)) and waited > 0 else 0.0)
    if name == "kernel_restart":  # the server waits for the new kernel's start
        return max(default_s, DEFAULT_TIMEOUT_S) + KERNEL_START_S
    if name not in ("shell", "run_code"):
        return max(default_s, DEFAULT_TIMEOUT_S)
    asked = arguments.get("timeout_s")
    limit = float(asked) if isinstance(asked, (int, float)) and asked > 0 else SHELL_DEFAULT_TIMEOUT_S
    start = KERNEL_START_S if name == "run_code" else 0.0  # a kernel may start first
    return max(default_s, min(limit, SHELL_MAX_TIMEOUT_S) + TOOL_CALL_MARGIN_S + start)


def _typed_run_code(result: ToolResult) -> RunCodeResult:
    assert isinstance(result.typed, RunCodeResult)
    return result.typed


def _json_of(model: Any) -> Callable[[httpx.Response], Any]:
    return lambda response: model.model_validate(response.json())


def _sessions(response: httpx.Response) -> list[Session]:
    return [Session.model_validate(s) for s in response.json()["sessions"]]


def _nothing(response: httpx.Response) -> None:
    return None


@dataclass(frozen=True)
class Request(Generic[T]):
    """What a method knows about its request, before the route binds its method and path."""

    parse: Callable[[httpx.Response], T]
    segments: Mapping[str, object] = field(default_factory=dict)
    json: Any = None
    content: bytes | None = None  # a raw body (an upload), instead of `json`
    params: Mapping[str, Any] | None = None
    acting_user: UserRef | None = None
    admin: bool = False
    auth: bool = True
    timeout_s: float | None = None
    raw_path: str | None = None  # a path given whole (a public upload URL's own path)


@dataclass(frozen=True)
class Call(Generic[T]):
    """A request ready to send, and the parser of its answer."""

    method: str
    path: str
    request: Request[T]

    def build(self, http: httpx.Client | httpx.AsyncClient, admin_headers: Mapping[str, str]) -> httpx.Request:
        r = self.request
        headers: dict[str, str] = {}
        if r.admin:
            headers.update(admin_headers)
        if r.acting_user is not None:
            headers["X-Acting-User"] = user_ref_text(r.acting_user)
        timeout = httpx.Timeout(r.timeout_s) if r.timeout_s is not None else httpx.USE_CLIENT_DEFAULT
        built = http.build_request(
            self.method, self.path, json=r.json, content=r.content, params=r.params, headers=headers, timeout=timeout
        )
        if not r.auth:  # public routes: never send a token where it is not needed
            built.headers.pop("Authorization", None)
        return built

    def failed(self, exc: httpx.HTTPError) -> ApiError:
        if isinstance(exc, httpx.TimeoutException):
            return TransportError(f"{self.method} {self.path} timed out: {exc}", code="timeout")
        return TransportError(f"{self.method} {self.path} failed: {exc}", code="transport_error")

    def finish(self, response: httpx.Response) -> T:
        if response.status_code >= 400:
            raise error_from_response(response)
        return self.request.parse(response)


def route(method: str, template: str) -> Callable[[Callable[..., Request[T]]], Callable[..., T]]:
    def bind(build: Callable[..., Request[T]]) -> Callable[..., T]:
        @functools.wraps(build)
        def send(self: ClientMethods, *args: Any, **kwargs: Any) -> T:
            request = build(self, *args, **kwargs)
            path = request.raw_path or template.format(**{k: segment(v) for k, v in request.segments.items()})
            return self._run(Call(method, path, request))

        send.route = (method, template)  # type: ignore[attr-defined]
        return send

    return bind


def routes_of(cls: type) -> set[tuple[str, str]]:
    """The (method, path template) of every route a client class calls."""
    return {fn.route for fn in vars_of(cls) if hasattr(fn, "route")}


def vars_of(cls: type) -> Iterable[Any]:
    for klass in cls.__mro__:
        yield from vars(klass).values()


def _without_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def _value(x: Any) -> Any:
    # Any enum: the client's own, or the server's `orchestrator.identity` ones a bot may pass.
    return x.value if isinstance(x, Enum) else x


def _delivery_content(delivery_id: str) -> Callable[[httpx.Response], DeliveryContent]:
    def parse(response: httpx.Response) -> DeliveryContent:
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

    return parse


class ClientMethods:
    """The API's methods, shared by `OrchestratorClient` and `AsyncOrchestratorClient`: on
    the async client each returns an awaitable of the same model."""

    _timeout_s: float = DEFAULT_TIMEOUT_S
    _base_url: str = ""
    _admin_headers: Mapping[str, str] = {}

    def _configure(self, base_url: str, token: str | None, admin_token: str | None, timeout: float) -> dict[str, Any]:
        """Remember the settings both clients share; the keyword arguments of their httpx client."""
        self._admin_headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self._timeout_s = timeout
        self._base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return {"base_url": self._base_url, "headers": headers, "timeout": timeout, "trust_env": False}

    def _run(self, call: Call[Any]) -> Any:  # pragma: no cover - each client sends its own way
        raise NotImplementedError

    # health, users, groups, projects -----------------------------------------------------
    @route("GET", "/healthz")
    def health(self) -> Request[Health]:
        """With an admin token the whole answer (isolation, disk, egress, descriptors); else the mode."""
        return Request(_json_of(Health), admin=bool(self._admin_headers))

    @route("PUT", "/v1/users/{user_id}")
    def put_user(self, user_id: UserRef, *, display_name: str | None = None, backend: str | None = None) -> Request[User]:
        """`backend` (an override) needs the admin token; never below the server's isolation floor."""
        body = _without_none({"display_name": display_name, "backend": backend})
        return Request(_json_of(User), {"user_id": user_ref_text(user_id)}, json=body, admin=backend is not None)

    @route("GET", "/v1/users/{user_id}")
    def get_user(self, user_id: UserRef) -> Request[User]:
        return Request(_json_of(User), {"user_id": user_ref_text(user_id)})

    @route("PUT", "/v1/identities/{platform}/{external_id}")
    def put_identity(self, platform: str, external_id: str, *, display_name: str | None = None) -> Request[Identity]:
        """The user id of a person on a chat platform: allocated on the first call, the same on every repeat."""
        body = _without_none({"display_name": display_name})
        return Request(_json_of(Identity), {"platform": platform, "external_id": external_id}, json=body)

    @route("GET", "/v1/identities/{platform}/{external_id}")
    def get_identity(self, platform: str, external_id: str) -> Request[Identity]:
        return Request(_json_of(Identity), {"platform": platform, "external_id": external_id})

    @route("PUT", "/v1/admin/identities/{platform}/{external_id}")
    def link_identity(self, platform: str, external_id: str, user_id: int) -> Request[Identity]:
        """Admin: one more platform identity for an existing user (the same person elsewhere)."""
        return Request(_json_of(Identity), {"platform": platform, "external_id": external_id}, json={"user_id": user_id}, admin=True)

    @route("GET", "/v1/admin/identities")
    def list_identities(
        self, *, platform: str | None = None, user_id: int | None = None, after: str | None = None, limit: int = 100
    ) -> Request[IdentityPage]:
        """Admin: platform identities and their user ids, a page at a time (`after`: the previous `next_after`)."""
        params = _without_none({"platform": platform, "user_id": user_id, "after": after, "limit": limit})
        return Request(_json_of(IdentityPage), params=params, admin=True)

    @route("DELETE", "/v1/groups/{channel}/{chat_id}/members/{user_id}")
    def remove_group_member(self, channel: str, chat_id: str, user_id: UserRef) -> Request[bool]:
        """Revoke a membership (effective for the user's next call); False when there was none."""
        return Request(
            lambda r: bool(r.json()["removed"]), {"channel": channel, "chat_id": chat_id, "user_id": user_ref_text(user_id)}
        )

    @route("PUT", "/v1/projects/{project_id}/settings")
    def put_project_settings(
        self, project_id: str, *, cross_session_read: bool | None = None, cross_project_collaboration: bool | None = None
    ) -> Request[ProjectSettings]:
        body = _without_none(
            {"cross_session_read": cross_session_read, "cross_project_collaboration": cross_project_collaboration}
        )
        return Request(_json_of(ProjectSettings), {"project_id": project_id}, json=body)

    @route("GET", "/v1/projects/{project_id}/settings")
    def get_project_settings(self, project_id: str) -> Request[ProjectSettings]:
        return Request(_json_of(ProjectSettings), {"project_id": project_id})

    # sessions ------------------------------------------------------------------------------
    @route("POST", "/v1/sessions")
    def create_session(
        self,
        *,
        owner_user_id: int | None = None,
        channel: str,
        owner: UserRef | None = None,
        session_id: str | None = None,
        project_id: str | None = None,
        group: Group | tuple[str, str] | None = None,
        parent_session_id: str | None = None,
        title: str | None = None,
        acting_user: UserRef | None = None,
        if_exists: Literal["conflict", "return"] | None = None,
    ) -> Request[Session]:
        """`if_exists="return"`: the live session that already has this `session_id` (and the same
        owner, channel, group, project, parent) instead of `ConflictError`: create a chat's session per message.
        The owner is `owner_user_id` (our id) or `owner` (a `Person`, named on first sight)."""
        if isinstance(group, tuple):
            group = Group(channel=group[0], chat_id=group[1])
        body = _without_none(
            {
                "owner_user_id": owner_user_id,
                "owner": person_body(owner),
                "channel": channel,
                "session_id": session_id,
                "project_id": project_id,
                "group": group.model_dump() if group else None,
                "parent_session_id": parent_session_id,
                "title": title,
                "if_exists": if_exists,
            }
        )
        return Request(_json_of(Session), json=body, acting_user=acting_user)

    @route("GET", "/v1/sessions")
    def group_sessions(self, channel: str, chat_id: str, *, acting_user: UserRef | None = None) -> Request[list[Session]]:
        """A group chat's live sessions, whoever owns them, newest first."""
        params = {"channel": channel, "chat_id": chat_id}
        return Request(_sessions, params=params, acting_user=acting_user)

    @route("GET", "/v1/sessions/{session_id}/runs")
    def list_runs(
        self, session_id: str, *, limit: int = 20, before: int | None = None, acting_user: UserRef | None = None
    ) -> Request[RunPage]:
        params = _without_none({"limit": limit, "before": before})
        return Request(_json_of(RunPage), {"session_id": session_id}, params=params, acting_user=acting_user)

    @route("GET", "/v1/users/{user_id}/sandbox")
    def sandbox(self, user_id: UserRef, *, acting_user: UserRef | None = None) -> Request[SandboxState]:
        """The user's sandbox: backend, state, since when, and the user's last tool call."""
        return Request(_json_of(SandboxState), {"user_id": user_ref_text(user_id)}, acting_user=acting_user)

    @route("GET", "/v1/sessions/{session_id}")
    def get_session(self, session_id: str, *, acting_user: UserRef | None = None) -> Request[Session]:
        return Request(_json_of(Session), {"session_id": session_id}, acting_user=acting_user)

    @route("PATCH", "/v1/sessions/{session_id}")
    def update_session(self, session_id: str, *, acting_user: UserRef | None = None, **changes: Any) -> Request[Session]:
        """Change `title`, `archived`, `pinned`, `allow_cross_read`, `cross_private`."""
        return Request(_json_of(Session), {"session_id": session_id}, json=changes, acting_user=acting_user)

    @route("GET", "/v1/sessions")
    def list_sessions(
        self, *, owner_user_id: int | None = None, project_id: str | None = None, acting_user: UserRef | None = None
    ) -> Request[list[Session]]:
        params = _without_none({"owner_user_id": owner_user_id, "project_id": project_id})
        return Request(_sessions, params=params, acting_user=acting_user)

    @route("DELETE", "/v1/sessions/{session_id}")
    def delete_session(self, session_id: str, *, acting_user: UserRef | None = None) -> Request[SessionDeleted]:
        """Raises `CleanupPendingError` when the cleanup is not finished: call it again to continue."""
        return Request(_json_of(SessionDeleted), {"session_id": session_id}, acting_user=acting_user)

    @route("POST", "/v1/sessions/{session_id}/messages")
    def append_messages(
        self, session_id: str, messages: Iterable[Mapping[str, Any]], *, acting_user: UserRef | None = None
    ) -> Request[Appended]:
        """Each message: `role` (user, assistant, tool), `content`, optional `tool_calls`
        (`[{name, status}]`) and `speaker_user_id`."""
        body = {"messages": [dict(m) for m in messages]}
        return Request(_json_of(Appended), {"session_id": session_id}, json=body, acting_user=acting_user)

    @route("GET", "/v1/sessions/{session_id}/messages")
    def read_messages(self, session_id: str, *, limit: int = 50, acting_user: UserRef | None = None) -> Request[Messages]:
        return Request(_json_of(Messages), {"session_id": session_id}, params={"limit": limit}, acting_user=acting_user)

    # runs and tools ------------------------------------------------------------------------
    @route("POST", "/v1/sessions/{session_id}/runs")
    def start_run(
        self,
        session_id: str,
        *,
        trigger: Trigger | str,
        speaker_user_id: int | None = None,
        speaker: UserRef | None = None,
        agent_id: str | None = None,
        delivery_id: str | None = None,
        acting_user: UserRef | None = None,
        template: str | None = None,
    ) -> Request[RunContext]:
        """`template`: a template for this run's calls, one an admin marked requestable."""
        body = _without_none(
            {
                "trigger": _value(trigger),
                "speaker_user_id": speaker_user_id,
                "speaker": person_body(speaker),
                "agent_id": agent_id,
                "delivery_id": delivery_id,
                "template": template,
            }
        )
        return Request(_json_of(RunContext), {"session_id": session_id}, json=body, acting_user=acting_user)

    @route("GET", "/v1/runs/{run_id}")
    def get_run(self, run_id: str) -> Request[Run]:
        return Request(_json_of(Run), {"run_id": run_id})

    @route("POST", "/v1/runs/{run_id}/end")
    def end_run(self, run_id: str, status: Literal["succeeded", "failed", "cancelled"] = "succeeded") -> Request[Run]:
        return Request(_json_of(Run), {"run_id": run_id}, json={"status": status})

    @route("GET", "/v1/tools")
    def list_tools(self, names: Iterable[str] | None = None) -> Request[list[ToolInfo]]:
        """Every tool, or only those `names` (an unknown name is an `InvalidRequestError`)."""
        params = {"names": ",".join(names)} if names is not None else None
        return Request(lambda r: [ToolInfo.model_validate(t) for t in r.json()["tools"]], params=params)

    @route("POST", "/v1/runs/{run_id}/tools/{name}")
    def call_tool(
        self, run_id: str, name: str, arguments: Mapping[str, Any] | None = None, *, tool_call_id: str | None = None
    ) -> Request[ToolResult]:
        """Run a tool; a failure of the tool (`unknown_tool` too) is a `ToolResult` with
        `ok` false. With `tool_call_id`, a repeat (a retry after a timeout or a broken
        connection) returns the first call's result instead of running it again. The HTTP
        timeout follows the call (a shell waits for its `timeout_s`)."""
        arguments = dict(arguments or {})
        body = _without_none({"arguments": arguments, "tool_call_id": tool_call_id})
        return Request(
            lambda r: ToolResult.of(name, r.json()),
            {"run_id": run_id, "name": name},
            json=body,
            timeout_s=tool_call_timeout_s(name, arguments, self._timeout_s),
        )

    @route("POST", "/v1/runs/{run_id}/tools/{name}")  # call_tool's route, typed for run_code
    def run_code(
        self,
        run_id: str,
        code: str,
        *,
        language: Literal["python", "bash"] = "python",
        timeout_s: float | None = None,
        kernel: str | None = None,
        tool_call_id: str | None = None,
    ) -> Request[RunCodeResult]:
        """`run_code` (docs/interpreter.md): the code runs in the run's kernel of that language
        (and name), whose state survives between calls. A tool failure (`too_many_kernels`,
        `interpreter_unavailable`, ...) raises `ToolCallFailed`; a timeout or a dead kernel is
        a result (`status`)."""
        arguments = _without_none({"code": code, "language": language, "timeout_s": timeout_s, "kernel": kernel})
        body = _without_none({"arguments": arguments, "tool_call_id": tool_call_id})
        return Request(
            lambda r: _typed_run_code(ToolResult.of("run_code", r.json()).raise_for_error()),
            {"run_id": run_id, "name": "run_code"},
            json=body,
            timeout_s=tool_call_timeout_s("run_code", arguments, self._timeout_s),
        )

    # files from the chat -------------------------------------------------------------------
    @route("PUT", "/v1/runs/{run_id}/files/incoming/{name}")
    def upload_incoming(
        self,
        run_id: str,
        name: str,
        data: bytes,
        *,
        scope: Literal["personal", "group"] = "personal",
        acting_user: UserRef | None = None,
    ) -> Request[IncomingFile]:
        """Put a file from the chat into the run's sandbox (`personal`: the runtime user's
        `incoming/`; `group`: the group chat's `chat-files/{date}/`); hand the model `path`."""
        return Request(
            _json_of(IncomingFile),
            {"run_id": run_id, "name": name},
            content=bytes(data),
            params={"scope": scope},
            acting_user=acting_user,
        )

    # outgoing deliveries and public uploads ------------------------------------------------
    @route("GET", "/v1/deliveries/{delivery_id}")
    def fetch_delivery(self, delivery_id: str) -> Request[DeliveryContent]:
        """The bytes `send_file` / `send_image` produced, to post to the chat."""
        return Request(_delivery_content(delivery_id), {"delivery_id": delivery_id})

    @route("GET", "/v1/runs/{run_id}/deliveries")
    def list_deliveries(self, run_id: str) -> Request[list[Delivery]]:
        return Request(lambda r: [Delivery.model_validate(d) for d in r.json()["deliveries"]], {"run_id": run_id})

    @route("DELETE", "/v1/deliveries/{delivery_id}")
    def delete_delivery(self, delivery_id: str) -> Request[None]:
        return Request(_nothing, {"delivery_id": delivery_id})

    # preview links ---------------------------------------------------------------------------
    @route("POST", "/v1/runs/{run_id}/previews")
    def expose_port(self, run_id: str, port: int, *, ttl_s: int | None = None, acting_user: UserRef | None = None) -> Request[Preview]:
        """A preview URL of `port` in the run's runtime user's sandbox, to post to the chat."""
        body: dict[str, Any] = {"port": port} | ({"ttl_s": ttl_s} if ttl_s is not None else {})
        return Request(_json_of(Preview), {"run_id": run_id}, json=body, acting_user=acting_user)

    @route("GET", "/v1/runs/{run_id}/previews")
    def list_previews(self, run_id: str) -> Request[list[Preview]]:
        """The run's live previews, oldest first."""
        return Request(lambda r: [Preview.model_validate(p) for p in r.json()["previews"]], {"run_id": run_id})

    @route("GET", "/v1/previews/{preview_id}")
    def get_preview(self, preview_id: str) -> Request[Preview]:
        return Request(_json_of(Preview), {"preview_id": preview_id})

    @route("DELETE", "/v1/previews/{preview_id}")
    def revoke_preview(self, preview_id: str) -> Request[None]:
        """The link answers 404 from now on; its open connections are cut."""
        return Request(_nothing, {"preview_id": preview_id})

    @route("GET", "/uploads/{user_id}/{file_name}")
    def fetch_upload(self, url: str) -> Request[bytes]:
        """A public artifact by its URL, without a token (it must be this server's)."""
        base = self._base_url.rstrip("/")
        path = url[len(base) :] if url.startswith(base) else url
        return Request(lambda r: r.content, raw_path=path, auth=False)

    # collaboration -------------------------------------------------------------------------
    @route("GET", "/v1/sessions/{session_id}/inbox")
    def inbox(
        self, session_id: str, *, wait_s: float = 0.0, acting_user: UserRef | None = None
    ) -> Request[InboxDelivery | None]:
        def parse(response: httpx.Response) -> InboxDelivery | None:
            body = response.json()
            return InboxDelivery.model_validate(body["delivery"]) if body.get("delivery") else None

        return Request(
            parse,
            {"session_id": session_id},
            params={"wait_s": wait_s},
            acting_user=acting_user,
            timeout_s=self._timeout_s + wait_s,  # a long poll waits its wait_s first
        )

    @route("GET", "/v1/sessions/{session_id}/collaborations")
    def list_collaborations(
        self, session_id: str, *, limit: int = 20, before: int | None = None, acting_user: UserRef | None = None
    ) -> Request[CollaborationPage]:
        """A page of the session's collaborations, newest first; pass `next_before` as `before`."""
        params = _without_none({"limit": limit, "before": before})
        return Request(_json_of(CollaborationPage), {"session_id": session_id}, params=params, acting_user=acting_user)

    @route("GET", "/v1/sessions/{session_id}/collaborations/{request_id}")
    def get_collaboration(
        self, session_id: str, request_id: str, *, acting_user: UserRef | None = None
    ) -> Request[Collaboration]:
        segments = {"session_id": session_id, "request_id": request_id}
        return Request(_json_of(Collaboration), segments, acting_user=acting_user)

    @route("POST", "/v1/sessions/{session_id}/collaborations/{request_id}/stop")
    def stop_collaboration(
        self, session_id: str, request_id: str, *, acting_user: UserRef | None = None
    ) -> Request[CollaborationStopped]:
        segments = {"session_id": session_id, "request_id": request_id}
        return Request(_json_of(CollaborationStopped), segments, acting_user=acting_user)

    # admin ---------------------------------------------------------------------------------
    @route("GET", "/v1/admin/runtime-identity")
    def get_runtime_identity(self) -> Request[IdentityModeState]:
        return Request(_json_of(IdentityModeState), admin=True)

    @route("PUT", "/v1/admin/runtime-identity")
    def set_runtime_identity(self, mode: IdentityMode | str | None) -> Request[IdentityModeState]:
        """`None`: drop the admin's change, back to the configured mode."""
        return Request(_json_of(IdentityModeState), json={"mode": _value(mode)}, admin=True)

    @route("GET", "/v1/admin/audit")
    def audit(
        self, *, action: str | None = None, session_id: str | None = None, limit: int = 100
    ) -> Request[list[dict[str, Any]]]:
        params = _without_none({"action": action, "session_id": session_id, "limit": limit})
        return Request(lambda r: list(r.json()["entries"]), params=params, admin=True)

    @route("GET", "/v1/admin/sandboxes")
    def sandboxes(self) -> Request[dict[str, Any]]:
        return Request(lambda r: dict(r.json()), admin=True)

    @route("GET", "/v1/admin/users/{user_id}/egress")
    def get_egress(self, user_id: UserRef) -> Request[EgressRules]:
        """The user's egress allow list: defaults, the admin's changes, the effective list."""
        return Request(_json_of(EgressRules), {"user_id": user_ref_text(user_id)}, admin=True)

    @route("PUT", "/v1/admin/users/{user_id}/egress")
    def set_egress(
        self, user_id: UserRef, *, allow: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> Request[EgressRules]:
        """Replace the user's additions and removals; applies to the user's next connection."""
        body = {"allow": list(allow), "remove": list(remove)}
        return Request(_json_of(EgressRules), {"user_id": user_ref_text(user_id)}, json=body, admin=True)

    @route("PUT", "/v1/users/{user_id}/credentials/{name}")
    def put_credential(
        self, user_id: UserRef, name: str, *, secret: str, hosts: Sequence[str], header: str = "Authorization",
        template: str = "Bearer {secret}", env: str | None = None, acting_user: UserRef | None = None,
    ) -> Request[Credential]:  # fmt: skip
        """Store (or replace) a credential of the user; the answer is its metadata, never the
        secret. The bot must act for that very user (`acting_user`), or use the admin token."""
        body = _without_none({"secret": secret, "hosts": list(hosts), "header": header, "template": template, "env": env})
        return Request(_json_of(Credential), {"user_id": user_ref_text(user_id), "name": name}, json=body, acting_user=acting_user)

    @route("GET", "/v1/users/{user_id}/credentials")
    def credentials(self, user_id: UserRef, *, acting_user: UserRef | None = None) -> Request[list[Credential]]:
        parse = lambda response: [Credential.model_validate(c) for c in response.json()["credentials"]]  # noqa: E731
        return Request(parse, {"user_id": user_ref_text(user_id)}, acting_user=acting_user)

    @route("DELETE", "/v1/users/{user_id}/credentials/{name}")
    def delete_credential(self, user_id: UserRef, name: str, *, acting_user: UserRef | None = None) -> Request[None]:
        """Gone at once: its grants end and connections using it are cut."""
        return Request(_nothing, {"user_id": user_ref_text(user_id), "name": name}, acting_user=acting_user)

    @route("POST", "/v1/users/{user_id}/grants")
    def grant_credential(
        self, user_id: UserRef, *, credential: str, grantee_user_id: int | None, session_id: str, ttl_s: int,
        acting_user: UserRef | None = None,
    ) -> Request[CredentialGrant]:  # fmt: skip
        """Delegate the user's credential to the runs of `grantee_user_id` (None: every run) in
        one session, for `ttl_s` seconds; only the grantor (the bot acting for them) may."""
        body = {"credential": credential, "grantee_user_id": grantee_user_id, "session_id": session_id, "ttl_s": ttl_s}
        return Request(_json_of(CredentialGrant), {"user_id": user_ref_text(user_id)}, json=body, acting_user=acting_user)

    @route("GET", "/v1/users/{user_id}/grants")
    def grants(self, user_id: UserRef, *, acting_user: UserRef | None = None) -> Request[CredentialGrants]:
        """What the user granted and what was granted to them."""
        return Request(_json_of(CredentialGrants), {"user_id": user_ref_text(user_id)}, acting_user=acting_user)

    @route("DELETE", "/v1/grants/{grant_id}")
    def revoke_grant(self, grant_id: str, *, acting_user: UserRef | None = None) -> Request[None]:
        """Immediate: the next connection goes without it, open ones are cut."""
        return Request(_nothing, {"grant_id": grant_id}, acting_user=acting_user)

    @route("POST", "/v1/admin/credentials/rotate")
    def rotate_credentials_key(self) -> Request[int]:
        """Re-read the key file and re-encrypt every credential with its first key; the count."""
        return Request(lambda response: int(response.json()["credentials"]), admin=True)

    @route("GET", "/v1/admin/disk")
    def disk(self) -> Request[DiskOverview]:
        """The disk-quota mechanism in force, the host watermark and every volume's usage."""
        return Request(_json_of(DiskOverview), admin=True)

    @route("GET", "/v1/admin/users/{user_id}/disk")
    def get_user_disk(self, user_id: UserRef) -> Request[UserDisk]:
        return Request(_json_of(UserDisk), {"user_id": user_ref_text(user_id)}, admin=True)

    @route("PUT", "/v1/admin/users/{user_id}/disk")
    def set_user_disk(self, user_id: UserRef, disk_mb: int) -> Request[UserDisk]:
        """Grow the user's disk quota to `disk_mb` MiB (a shrink is refused: 409)."""
        return Request(_json_of(UserDisk), {"user_id": user_ref_text(user_id)}, json={"disk_mb": disk_mb}, admin=True)

    @route("GET", "/v1/admin/disk/volumes/{volume}/members")
    def shared_members(self, volume: str) -> Request[SharedMembers]:
        """Each member's files in a shared place (`share`, `group-…` as `disk()` lists them)."""
        return Request(_json_of(SharedMembers), {"volume": volume}, admin=True)

    @route("DELETE", "/v1/admin/disk/volumes/{volume}/members/{user_id}")
    def free_shared_member(self, volume: str, user_id: int) -> Request[SharedMemberFreed]:
        """Stop the member's sandbox and remove its files from the shared place."""
        return Request(_json_of(SharedMemberFreed), {"volume": volume, "user_id": user_id}, admin=True)

    # templates (docs/templates.md) ----------------------------------------------------------
    @route("PUT", "/v1/admin/templates/{name}")
    def put_template(
        self,
        name: str,
        *,
        parent: str | None = None,
        apt: Sequence[str] = (),
        pip: Sequence[str] = (),
        npm: Sequence[str] = (),
        files: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        requestable: bool | None = None,
    ) -> Request[Template]:
        """Define (or change) a template; it builds in the background: poll `get_template`.
        `requestable`: whether a bot may ask for it in `start_run` (None: unchanged)."""
        body = _without_none({"parent": parent, "apt": list(apt), "pip": list(pip), "npm": list(npm),
                              "files": dict(files or {}), "env": dict(env or {}), "requestable": requestable})  # fmt: skip
        return Request(_json_of(Template), {"name": name}, json=body, admin=True)

    @route("GET", "/v1/admin/templates/{name}")
    def get_template(self, name: str) -> Request[Template]:
        """Its status, serving image, error and the tail of the latest build's log."""
        return Request(_json_of(Template), {"name": name}, admin=True)

    @route("GET", "/v1/admin/templates")
    def list_templates(self) -> Request[TemplateList]:
        return Request(_json_of(TemplateList), admin=True)

    @route("DELETE", "/v1/admin/templates/{name}")
    def delete_template(self, name: str) -> Request[None]:
        """Raises `ApiError` with code `template_in_use` while a user (or a template) uses it."""
        return Request(_nothing, {"name": name}, admin=True)

    @route("PUT", "/v1/admin/users/{user_id}/template")
    def set_user_template(self, user_id: UserRef, template: str | None) -> Request[UserTemplate]:
        """The user's template (None: back to the default); an idle sandbox is recreated, files kept."""
        return Request(_json_of(UserTemplate), {"user_id": user_ref_text(user_id)}, json={"template": template}, admin=True)

    @route("PUT", "/v1/admin/groups/{channel}/{chat_id}/template")
    def set_group_template(self, channel: str, chat_id: str, template: str | None) -> Request[GroupTemplate]:
        """The template of the group's members' sandboxes in its sessions (None: none)."""
        return Request(_json_of(GroupTemplate), {"channel": channel, "chat_id": chat_id}, json={"template": template},
                       admin=True)  # fmt: skip

    @route("GET", "/v1/admin/groups/{channel}/{chat_id}/template")
    def get_group_template(self, channel: str, chat_id: str) -> Request[GroupTemplate]:
        return Request(_json_of(GroupTemplate), {"channel": channel, "chat_id": chat_id}, admin=True)

    # the admin's hand on users (docs/admin-console.md) --------------------------------------
    @route("GET", "/v1/admin/users")
    def admin_users(
        self, *, platform: str | None = None, backend: str | None = None, state: str | None = None,
        cursor: str | None = None, limit: int | None = None,
    ) -> Request[AdminUserPage]:  # fmt: skip
        """A page of users, filtered by platform identity, backend or sandbox state; pass the
        answer's `next_cursor` as `cursor` for the next one."""
        params = _without_none({"platform": platform, "backend": backend, "state": state, "cursor": cursor, "limit": limit})
        return Request(_json_of(AdminUserPage), params=params, admin=True)

    @route("GET", "/v1/admin/runs")
    def admin_runs(
        self, *, state: str = "recent", user_id: int | None = None, session_id: str | None = None,
        channel: str | None = None, chat_id: str | None = None, limit: int | None = None,
    ) -> Request[AdminRunPage]:  # fmt: skip
        """Runs, `active` (still running) or `recent` (any, newest first), by user, session or group."""
        params = _without_none({"state": state, "user_id": user_id, "session_id": session_id, "channel": channel,
                                "chat_id": chat_id, "limit": limit})  # fmt: skip
        return Request(_json_of(AdminRunPage), params=params, admin=True)

    @route("POST", "/v1/admin/users/{user_id}/sandbox/{action}")
    def admin_sandbox_action(self, user_id: UserRef, action: str) -> Request[SandboxAction]:
        """`action`: stop, restart, pause or resume the user's sandbox."""
        return Request(_json_of(SandboxAction), {"user_id": user_ref_text(user_id), "action": action}, admin=True)

    @route("GET", "/v1/admin/users/{user_id}/resources")
    def get_user_resources(self, user_id: UserRef) -> Request[UserResources]:
        return Request(_json_of(UserResources), {"user_id": user_ref_text(user_id)}, admin=True)

    @route("PUT", "/v1/admin/users/{user_id}/resources")
    def set_user_resources(self, user_id: UserRef, *, cpus: float | None, memory_mb: int | None) -> Request[UserResources]:
        """CPU and memory of the user's sandbox within the operator's maxima (None: the default)."""
        body = {"cpus": cpus, "memory_mb": memory_mb}
        return Request(_json_of(UserResources), {"user_id": user_ref_text(user_id)}, json=body, admin=True)

    @route("DELETE", "/v1/admin/users/{user_id}")
    def purge_user(self, user_id: int, *, confirm_user_id: int) -> Request[UserPurged]:
        """Purge the user (sandbox, files, volumes, credentials, skills); `confirm_user_id` must
        name it again. Its id then answers `GoneError` (`user_purged`) and is never used again."""
        return Request(_json_of(UserPurged), {"user_id": str(user_id)}, json={"confirm_user_id": confirm_user_id}, admin=True)

    # skills --------------------------------------------------------------------------------
    @route("GET", "/v1/admin/skills")
    def list_skills(self) -> Request[SkillList]:
        """The system skills (admin)."""
        return Request(_json_of(SkillList), admin=True)

    @route("GET", "/v1/admin/skills/{name}")
    def get_skill(self, name: str) -> Request[SkillDetail]:
        return Request(_json_of(SkillDetail), {"name": name}, admin=True)

    @route("PUT", "/v1/admin/skills/{name}")
    def put_skill(self, name: str, files: SkillFiles) -> Request[SkillInstalled]:
        """Install or replace the whole system skill `name` (admin). `files`: relative path ->
        text, bytes or `SkillFile`; see `skill_files_from_dir`."""
        return Request(_json_of(SkillInstalled), {"name": name}, json=_skill_body(files), admin=True)

    @route("DELETE", "/v1/admin/skills/{name}")
    def delete_skill(self, name: str) -> Request[SkillRemoved]:
        return Request(_json_of(SkillRemoved), {"name": name}, admin=True)

    @route("GET", "/v1/users/{user_id}/skills")
    def list_personal_skills(self, user_id: UserRef) -> Request[SkillList]:
        return Request(_json_of(SkillList), {"user_id": user_ref_text(user_id)})

    @route("GET", "/v1/users/{user_id}/skills/{name}")
    def get_personal_skill(self, user_id: UserRef, name: str) -> Request[SkillDetail]:
        return Request(_json_of(SkillDetail), {"user_id": user_ref_text(user_id), "name": name})

    @route("PUT", "/v1/users/{user_id}/skills/{name}")
    def put_personal_skill(self, user_id: UserRef, name: str, files: SkillFiles) -> Request[SkillInstalled]:
        """Install or replace the whole personal skill `name` of `user_id` (bot token)."""
        return Request(_json_of(SkillInstalled), {"user_id": user_ref_text(user_id), "name": name}, json=_skill_body(files))

    @route("DELETE", "/v1/users/{user_id}/skills/{name}")
    def delete_personal_skill(self, user_id: UserRef, name: str) -> Request[SkillRemoved]:
        return Request(_json_of(SkillRemoved), {"user_id": user_ref_text(user_id), "name": name})
