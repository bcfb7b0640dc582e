"""The admin console (`/admin`, docs/admin-console.md): server-rendered pages over the same
service calls as the admin API, so a change made here writes the same audit rows.

- Login exchanges the admin token for a session cookie (orchestrator/console/sessions.py);
  the bot token is refused on every route (403), and any other bearer token (401).
- Every change is a POST carrying the session's CSRF token as `csrf_token`.
- Every page is sent with a strict Content-Security-Policy: only this server's own script and
  style, no inline script, no frames; Jinja2 escapes every value a user controls.
- A route names the parts of the orchestrator it uses as dependencies (orchestrator/http/parts.py),
  as the API's routes do; none reaches the service or the settings whole.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.responses import HTMLResponse, RedirectResponse, Response

from mounts import ids
from orchestrator import __version__, audit
from orchestrator.clock import iso
from orchestrator.console.charts import CallSample, bar_chart, hour_of_calls, line_chart
from orchestrator.console.login_attempts import LoginAttempts
from orchestrator.console.sessions import (
    ConsoleSession,
    ConsoleSessions,
    Validity,
    cookie_header,
    csrf_matches,
    session_ids,
)
from orchestrator.egress.policy import InvalidPattern, UserRules
from orchestrator.egress.service import EgressService
from orchestrator.errors import InvalidInput, OrchestratorError
from orchestrator.http.auth import caller_for
from orchestrator.http.parts import (
    ConsoleLogins,
    Records,
    api_settings_of,
    console_logins_of,
    disk_quotas_of,
    egress_of,
    purge_of,
    records_of,
    resources_of,
    run_repo_of,
    sandbox_control_of,
    sandboxes_of,
    session_repo_of,
    switch_of,
    system_status_of,
    templates_of,
    user_listing_of,
    users_of,
)
from orchestrator.identity import IdentityMode
from orchestrator.quotas.model import group_volume
from orchestrator.quotas.service import DiskQuotas
from orchestrator.runs.identity_switch import RuntimeIdentitySwitch
from orchestrator.runs.listing import RunFilter, run_filter
from orchestrator.runs.records import RunRepository
from orchestrator.sandboxes.router import SandboxRouter
from orchestrator.sessions.records import SessionRepository
from orchestrator.settings import ApiSettings
from orchestrator.system_status import SystemStatus
from orchestrator.templates.service import TemplateService
from orchestrator.users.listing import UserFilter, UserListing, parse_cursor
from orchestrator.users.purge import UserPurge
from orchestrator.users.repository import UserRepository
from orchestrator.users.resources import ResourceOverrides
from orchestrator.users.sandbox_control import SandboxAction, SandboxControl

STATIC_DIR = Path(__file__).parent / "static"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self';"
    " frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
ACTOR = "admin"  # the same actor the admin token's API calls write: one audit trail
PAGE = 50
# Why the user's sandbox runs its template (docs/templates.md, "Who gets which template").
TEMPLATE_WHY = {
    "user": "set for this user",
    "group": "the group's, in its latest call's session",
    "skill": "a skill of its latest call's run needs it",
    "run": "the bot asked for it in its latest call's run",
    "default": "no template set: the default image",
}

_templates = Environment(loader=PackageLoader("orchestrator.console", "templates"), autoescape=select_autoescape(default=True))

router = APIRouter(include_in_schema=False)


class ConsoleRefusal(Exception):
    """Answered as a page (or a redirect to the login), never as the API's JSON."""

    def __init__(self, status: int, message: str, *, to_login: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.to_login = to_login


def _sessions(request: Request) -> ConsoleSessions:
    return request.app.state.console_sessions


def _headers(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**SECURITY_HEADERS, **(extra or {})}


def render(name: str, status: int = 200, *, session: ConsoleSession | None = None, **context: Any) -> HTMLResponse:
    html = _templates.get_template(name).render(
        csrf_token=session.csrf_token if session is not None else None, version=__version__, **context
    )
    return HTMLResponse(html, status_code=status, headers=_headers())


def redirect(url: str, *, cookie: str | None = None) -> RedirectResponse:
    response = RedirectResponse(url, status_code=303, headers=_headers())
    if cookie is not None:
        response.headers.append("set-cookie", cookie)
    return response


def _refuse_tokens(request: Request, api: ApiSettings) -> None:
    """The console is reached with its cookie only: the bot token is refused outright (403),
    any other bearer token is not a login (401). Tokens are told apart as the API does."""
    authorization = request.headers.get("authorization")
    if authorization is None:
        return
    caller = caller_for(api, authorization)
    if caller is not None and caller.role == "bot":
        raise ConsoleRefusal(403, "the admin console is not for the bot token")
    if caller is None or caller.role != "local":
        raise ConsoleRefusal(401, "the admin console takes its login cookie, not a bearer token")


def _session(request: Request, api: ApiSettings) -> ConsoleSession:
    _refuse_tokens(request, api)
    found, session = _sessions(request).find_any(session_ids(request.headers.getlist("cookie")))
    if session is None:
        raise ConsoleRefusal(401, "log in", to_login=True) if found is Validity.MISSING else ConsoleRefusal(
            401, "your console session expired: log in again", to_login=True
        )
    return session


async def _change(request: Request, api: ApiSettings) -> tuple[ConsoleSession, FormData]:
    """A change: a live session and its CSRF token in the form."""
    session = _session(request, api)
    form = await request.form()
    sent = form.get("csrf_token")
    if not csrf_matches(session, sent if isinstance(sent, str) else None):
        raise ConsoleRefusal(403, "the form's CSRF token is missing or wrong: reload the page and try again")
    return session, form


def _field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def install_console(app: FastAPI, api: ApiSettings) -> None:
    """The console's routes and its own in-memory state (logins, login attempts); the parts
    its routes use come from the app's `ApiParts` (orchestrator/http/parts.py)."""
    app.state.console_sessions = ConsoleSessions(api.console_session_ttl_s)
    app.state.console_login_attempts = LoginAttempts()
    app.mount("/admin/static", StaticFiles(directory=STATIC_DIR), name="console-static")
    app.include_router(router)

    @app.exception_handler(ConsoleRefusal)
    async def _refusal(request: Request, exc: ConsoleRefusal) -> Response:
        if exc.to_login:
            query = "?expired=1" if "expired" in exc.message else ""
            return redirect(f"/admin/login{query}")
        return render("error.html", exc.status, message=exc.message, title="Refused")


# --- login ------------------------------------------------------------------------------------


@router.get("/admin")
def admin_root(request: Request, api: ApiSettings = Depends(api_settings_of)) -> Response:
    _refuse_tokens(request, api)
    return redirect("/admin/")


@router.get("/admin/login")
def login_page(request: Request, expired: str | None = None, api: ApiSettings = Depends(api_settings_of)) -> HTMLResponse:
    _refuse_tokens(request, api)
    note = "Your session expired: log in again." if expired else None
    return render("login.html", note=note, title="Log in")


@router.post("/admin/login")
async def login(
    request: Request,
    api: ApiSettings = Depends(api_settings_of),
    logins: ConsoleLogins = Depends(console_logins_of),
) -> Response:
    _refuse_tokens(request, api)
    attempts: LoginAttempts = request.app.state.console_login_attempts
    address = request.client.host if request.client is not None else ""
    wait = attempts.wait_s(address)
    if wait:
        refused = render("login.html", 429, note=f"Too many wrong tokens: try again in {wait} s.", title="Log in")
        refused.headers["Retry-After"] = str(wait)
        return refused
    form = await request.form()
    token = _field(form, "token")
    caller = caller_for(api, f"Bearer {token}") if token or not api.auth_enabled else None
    if caller is None:
        attempts.failed(address)
        return render("login.html", 401, note="That is not the admin token.", title="Log in")
    if caller.role == "bot":
        return render("login.html", 403, note="The bot token cannot open the admin console.", title="Log in")
    session = _sessions(request).open()
    logins.record(actor=ACTOR)
    cookie = cookie_header(
        session.session_id, secure=request.url.scheme == "https", max_age=int(api.console_session_ttl_s)
    )
    return redirect("/admin/", cookie=cookie)


@router.post("/admin/logout")
async def logout(request: Request, api: ApiSettings = Depends(api_settings_of)) -> Response:
    session, _ = await _change(request, api)
    _sessions(request).close(session.session_id)
    return redirect("/admin/login", cookie=cookie_header("", secure=request.url.scheme == "https", max_age=0))


# --- overview ---------------------------------------------------------------------------------


def _hour(records: Records) -> Any:
    now = datetime.now(timezone.utc)
    since = audit.AuditFilter(action="tool.call", since=iso(now - timedelta(hours=1)))
    rows = records.audit(where=since, limit=100_000)
    samples = [
        CallSample(datetime.fromisoformat(e.at), float(e.detail.get("duration_ms") or 0.0), str(e.detail.get("outcome")))
        for e in rows
    ]
    return hour_of_calls(samples, now)


@router.get("/admin/")
def overview(
    request: Request,
    api: ApiSettings = Depends(api_settings_of),
    status: SystemStatus = Depends(system_status_of),
    sandboxes: SandboxRouter = Depends(sandboxes_of),
    records: Records = Depends(records_of),
) -> HTMLResponse:
    session = _session(request, api)
    statuses = sandboxes.status()
    by_state = Counter((s.backend, s.state) for s in statuses)
    hour = _hour(records)
    charts = [
        bar_chart(hour.per_minute, label="Tool calls per minute"),
        line_chart({"p50": hour.p50_ms, "p95": hour.p95_ms}, label="Tool call latency", unit="ms"),
    ]
    return render(
        "overview.html",
        session=session,
        title="Overview",
        identity=status.identity(),
        backend=status.default_backend,
        backends=status.backends,
        backend_reason=status.backend_reason,
        kernel=status.kernel_boundaries(),
        isolation=status.process_isolation(),
        disk=status.disk(),
        egress=status.egress(),
        by_state=sorted(by_state.items()),
        hour=hour,
        charts=charts,
    )


# --- runtime identity ---------------------------------------------------------------------


def _mode_choice(raw: str) -> IdentityMode | None:
    """Pure: the form's mode; `configured` drops the admin's change."""
    if raw == "configured":
        return None
    try:
        return IdentityMode(raw)
    except ValueError:
        raise InvalidInput("mode must be execution, owner or configured", field="mode") from None


@router.get("/admin/identity")
def identity_page(
    request: Request,
    api: ApiSettings = Depends(api_settings_of),
    switch: RuntimeIdentitySwitch = Depends(switch_of),
    records: Records = Depends(records_of),
) -> HTMLResponse:
    session = _session(request, api)
    history = records.audit(action="runtime_identity.change", limit=50)
    return render("identity.html", session=session, title="Runtime identity", state=switch.state(), history=history)


@router.post("/admin/identity")
async def identity_change(
    request: Request,
    api: ApiSettings = Depends(api_settings_of),
    switch: RuntimeIdentitySwitch = Depends(switch_of),
) -> Response:
    session, form = await _change(request, api)
    try:
        mode = _mode_choice(_field(form, "mode"))
    except InvalidInput as exc:
        raise ConsoleRefusal(422, exc.message) from None
    if _field(form, "confirm") != "yes":  # first the confirmation: what changes for the next runs
        state = switch.state()
        after = mode if mode is not None else state.configured_mode
        return render(
            "identity_confirm.html", session=session, title="Confirm the change", state=state, mode=mode, after=after
        )
    await run_in_threadpool(switch.set_by_admin, mode, actor=ACTOR)
    return redirect("/admin/identity")


# --- users ------------------------------------------------------------------------------------


@router.get("/admin/users")
def users_page(
    request: Request,
    platform: str = "",
    backend: str = "",
    state: str = "",
    cursor: str = "",
    api: ApiSettings = Depends(api_settings_of),
    user_listing: UserListing = Depends(user_listing_of),
    sandboxes: SandboxRouter = Depends(sandboxes_of),
) -> HTMLResponse:
    session = _session(request, api)
    try:
        after = parse_cursor(cursor)
    except InvalidInput as exc:
        raise ConsoleRefusal(422, exc.message) from None
    found, next_after = user_listing.page(
        UserFilter(platform=platform or None, backend=backend or None, state=state or None), after=after, limit=PAGE
    )
    next_url = None
    if next_after is not None:
        next_url = "/admin/users?" + urlencode({"platform": platform, "backend": backend, "state": state, "cursor": next_after})
    return render(
        "users.html", session=session, title="Users", users=found, next_url=next_url,
        notice=_sessions(request).take_notice(session),
        filters={"platform": platform, "backend": backend, "state": state}, backends=sorted(sandboxes.backends),
    )  # fmt: skip


def _user_id(raw: str) -> int:
    if not raw.isascii() or not raw.isdecimal():
        raise ConsoleRefusal(404, "no such user")
    try:
        return ids.user_id(int(raw), "user_id")
    except ids.InvalidIdentifier as exc:
        raise ConsoleRefusal(404, exc.message) from None


def _live_user(users: UserRepository, raw: str) -> int:
    user_id = _user_id(raw)
    if users.purged.is_purged(user_id):
        raise ConsoleRefusal(410, f"user {user_id} was purged; its id is never used again")
    return user_id


@router.get("/admin/users/{user_id}")
def user_page(
    request: Request,
    user_id: str,
    api: ApiSettings = Depends(api_settings_of),
    users: UserRepository = Depends(users_of),
    user_listing: UserListing = Depends(user_listing_of),
    templates: TemplateService = Depends(templates_of),
    egress: EgressService | None = Depends(egress_of),
    resources: ResourceOverrides = Depends(resources_of),
    disk_quotas: DiskQuotas = Depends(disk_quotas_of),
    session_repo: SessionRepository = Depends(session_repo_of),
    records: Records = Depends(records_of),
) -> HTMLResponse:
    session = _session(request, api)
    uid = _live_user(users, user_id)
    summary = user_listing.summary(uid)
    if summary is None:
        raise ConsoleRefusal(404, f"user {uid} is not known here")
    template = templates.effective(uid)
    egress_rules = None
    if egress is not None:
        rules = egress.rules.rules_of(uid)
        egress_rules = {"allow": rules.allow, "remove": rules.remove, "effective": [str(p) for p in egress.rules.allow_for(uid)]}
    return render(
        "user.html",
        session=session,
        title=f"User {uid}",
        user=summary,
        notice=_sessions(request).take_notice(session),
        resources=resources.of(uid),
        resources_override=resources.has_override(uid),
        maxima=resources.maxima,
        disk_mechanism=disk_quotas.mechanism.value,
        disk=disk_quotas.usage(uid),
        egress=egress_rules,
        template=template,
        template_why=TEMPLATE_WHY.get(template.source, template.source),
        template_assigned=templates.repo.assigned("user", str(uid)),
        template_names=[r.name for r in templates.repo.all()],
        sessions=session_repo.latest_of_owner(uid, limit=PAGE),
        runs=records.runs(RunFilter(user_id=uid), limit=20),
        actions=[a.value for a in SandboxAction],
    )


def _back_to(request: Request, session: ConsoleSession, url: str, notice: str) -> RedirectResponse:
    _sessions(request).notify(session, notice)
    return redirect(url)


async def _act(
    request: Request, api: ApiSettings, users: UserRepository, user_id: str, do: Callable[[int, FormData], str]
) -> Response:
    """Run one change for a user off the event loop; a refusal is shown as a page."""
    session, form = await _change(request, api)
    uid = _live_user(users, user_id)
    try:
        notice = await run_in_threadpool(do, uid, form)
    except OrchestratorError as exc:
        raise ConsoleRefusal(exc.status_code if exc.status_code >= 400 else 409, exc.message) from None
    return _back_to(request, session, f"/admin/users/{uid}", notice)


@router.post("/admin/users/{user_id}/sandbox/{action}")
async def user_sandbox(
    request: Request,
    user_id: str,
    action: str,
    api: ApiSettings = Depends(api_settings_of),
    users: UserRepository = Depends(users_of),
    sandbox_control: SandboxControl = Depends(sandbox_control_of),
) -> Response:
    try:
        wanted = SandboxAction(action)
    except ValueError:
        raise ConsoleRefusal(404, "no such sandbox action") from None

    def do(uid: int, _form: FormData) -> str:
        return f"sandbox {sandbox_control.act(uid, wanted, actor=ACTOR)}"

    return await _act(request, api, users, user_id, do)


def _number(form: FormData, name: str, kind: type) -> Any:
    raw = _field(form, name)
    if raw == "":
        return None
    try:
        return kind(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be a number", field=name) from None


@router.post("/admin/users/{user_id}/disk")
async def user_disk(
    request: Request,
    user_id: str,
    api: ApiSettings = Depends(api_settings_of),
    users: UserRepository = Depends(users_of),
    disk_quotas: DiskQuotas = Depends(disk_quotas_of),
) -> Response:
    def do(uid: int, form: FormData) -> str:
        disk_mb = _number(form, "disk_mb", int)
        if disk_mb is None or not 8 <= disk_mb <= 16 * 1024 * 1024:
            raise InvalidInput("disk_mb must be between 8 and 16777216", field="disk_mb")
        _, online = disk_quotas.set_disk_limit(uid, disk_mb)
        return f"disk quota {disk_mb} MiB" + ("" if online else " (the sandbox was stopped for the resize)")

    return await _act(request, api, users, user_id, do)


def _patterns(form: FormData, name: str) -> tuple[str, ...]:
    return tuple(line.strip() for line in _field(form, name).replace(",", "\n").splitlines() if line.strip())


@router.post("/admin/users/{user_id}/egress")
async def user_egress(
    request: Request,
    user_id: str,
    api: ApiSettings = Depends(api_settings_of),
    users: UserRepository = Depends(users_of),
    egress: EgressService | None = Depends(egress_of),
) -> Response:
    def do(uid: int, form: FormData) -> str:
        if egress is None:
            raise InvalidInput("egress is off on this server (ORCH_EGRESS=off)", field="allow")
        try:
            egress.rules.put(uid, UserRules(_patterns(form, "allow"), _patterns(form, "remove")), actor=ACTOR)
        except InvalidPattern as exc:
            raise InvalidInput(str(exc), field="allow") from None
        return "egress rules saved"

    return await _act(request, api, users, user_id, do)


@router.post("/admin/users/{user_id}/resources")
async def user_resources(
    request: Request,
    user_id: str,
    api: ApiSettings = Depends(api_settings_of),
    users: UserRepository = Depends(users_of),
    resources: ResourceOverrides = Depends(resources_of),
) -> Response:
    def do(uid: int, form: FormData) -> str:
        cpus, memory_mb = _number(form, "cpus", float), _number(form, "memory_mb", int)
        if (cpus is not None and cpus <= 0) or (memory_mb is not None and memory_mb <= 0):
            raise InvalidInput("cpus and memory_mb must be above 0 (empty: the default)", field="cpus")
        users.admit(uid)
        resources.put(uid, cpus=cpus, memory_mb=memory_mb, actor=ACTOR)
        return "CPU and memory saved (from the sandbox's next start)"

    return await _act(request, api, users, user_id, do)


@router.post("/admin/users/{user_id}/template")
async def user_template(
    request: Request,
    user_id: str,
    api: ApiSettings = Depends(api_settings_of),
    users: UserRepository = Depends(users_of),
    templates: TemplateService = Depends(templates_of),
) -> Response:
    def do(uid: int, form: FormData) -> str:
        name = _field(form, "template") or None
        users.admit(uid)
        templates.assign_user(uid, name)
        return f"template {name or 'none'} saved (from the user's next call)"

    return await _act(request, api, users, user_id, do)


@router.post("/admin/users/{user_id}/purge")
async def user_purge(
    request: Request,
    user_id: str,
    api: ApiSettings = Depends(api_settings_of),
    purge: UserPurge = Depends(purge_of),
) -> Response:
    session, form = await _change(request, api)
    uid = _user_id(user_id)
    confirm = _field(form, "confirm_user_id")
    try:
        await run_in_threadpool(
            lambda: purge.purge(uid, confirm_user_id=int(confirm) if confirm.isdecimal() else None, actor=ACTOR)
        )
    except OrchestratorError as exc:
        raise ConsoleRefusal(exc.status_code, exc.message) from None
    return _back_to(request, session, "/admin/users", f"user {uid} purged")


# --- groups, runs, audit -------------------------------------------------------------------


@router.get("/admin/groups")
def groups_page(
    request: Request,
    api: ApiSettings = Depends(api_settings_of),
    disk_quotas: DiskQuotas = Depends(disk_quotas_of),
    session_repo: SessionRepository = Depends(session_repo_of),
    records: Records = Depends(records_of),
) -> HTMLResponse:
    session = _session(request, api)
    usage = {u.volume: u for u in disk_quotas.all_usage()}
    groups = [
        {
            "group": g.group,
            "members": g.members,
            "usage": usage.get(group_volume(records.layout, g.group).key),
            "sessions": session_repo.list_for_group(g.group),
        }
        for g in records.groups()
    ]
    return render("groups.html", session=session, title="Groups", groups=groups)


@router.get("/admin/runs")
def runs_page(
    request: Request,
    state: str = "recent",
    user_id: str = "",
    session_id: str = "",
    channel: str = "",
    chat_id: str = "",
    api: ApiSettings = Depends(api_settings_of),
    records: Records = Depends(records_of),
) -> HTMLResponse:
    session = _session(request, api)
    try:
        wanted = run_filter(state, _user_id(user_id) if user_id else None, session_id or None, channel or None, chat_id or None)
    except InvalidInput as exc:
        raise ConsoleRefusal(422, exc.message) from None
    return render(
        "runs.html", session=session, title="Runs", runs=records.runs(wanted, limit=200),
        filters={"state": state, "user_id": user_id, "session_id": session_id, "channel": channel, "chat_id": chat_id},
    )  # fmt: skip


@router.get("/admin/runs/{run_id}")
def run_page(
    request: Request,
    run_id: str,
    api: ApiSettings = Depends(api_settings_of),
    run_repo: RunRepository = Depends(run_repo_of),
    records: Records = Depends(records_of),
) -> HTMLResponse:
    session = _session(request, api)
    try:
        run = run_repo.get(ids.session_id(run_id, "run_id"))
    except ids.InvalidIdentifier:
        run = None
    if run is None:
        raise ConsoleRefusal(404, "no such run")
    return render("run.html", session=session, title=f"Run {run.run_id}", run=run, calls=records.tool_calls(run.run_id))


def _moment(raw: str, name: str) -> str | None:
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise ConsoleRefusal(422, f"{name} must be a time like 2026-01-31T12:00") from None
    return iso(value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc))


@router.get("/admin/audit")
def audit_page(
    request: Request,
    action: str = "",
    user_id: str = "",
    session_id: str = "",
    tool: str = "",
    outcome: str = "",
    since: str = "",
    until: str = "",
    api: ApiSettings = Depends(api_settings_of),
    records: Records = Depends(records_of),
) -> HTMLResponse:
    session = _session(request, api)
    where = audit.AuditFilter(
        action=action or None, user_id=_user_id(user_id) if user_id else None, session_id=session_id or None,
        tool=tool or None, outcome=outcome or None, since=_moment(since, "since"), until=_moment(until, "until"),
    )  # fmt: skip
    entries = records.audit(where=where, limit=200)
    filters = {"action": action, "user_id": user_id, "session_id": session_id, "tool": tool, "outcome": outcome,
               "since": since, "until": until}  # fmt: skip
    return render("audit.html", session=session, title="Audit", entries=entries, filters=filters)
