"""The admin console (`/admin`, docs/admin-console.md): server-rendered pages over the same
service calls as the admin API, so a change made here writes the same audit rows.

- Login exchanges the admin token for a session cookie (orchestrator/console/sessions.py);
  the bot token is refused on every route (403), and any other bearer token (401).
- Every change is a POST carrying the session's CSRF token as `csrf_token`.
- Every page is sent with a strict Content-Security-Policy: only this server's own script and
  style, no inline script, no frames; Jinja2 escapes every value a user controls.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, FastAPI, Request
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
from orchestrator.errors import InvalidInput, OrchestratorError
from orchestrator.http.auth import caller_for
from orchestrator.identity import IdentityMode
from orchestrator.quotas.model import group_volume
from orchestrator.runs.listing import RunFilter, list_runs, run_filter, tool_calls_of
from orchestrator.service import OrchestratorService
from orchestrator.users.listing import UserFilter, list_groups, parse_cursor
from orchestrator.users.sandbox_control import SandboxAction

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


def _service(request: Request) -> OrchestratorService:
    return request.app.state.service


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


def _refuse_tokens(request: Request) -> None:
    """The console is reached with its cookie only: the bot token is refused outright (403),
    any other bearer token is not a login (401)."""
    authorization = request.headers.get("authorization")
    if authorization is None:
        return
    caller = caller_for(_service(request), authorization)
    if caller is not None and caller.role == "bot":
        raise ConsoleRefusal(403, "the admin console is not for the bot token")
    if caller is None or caller.role != "local":
        raise ConsoleRefusal(401, "the admin console takes its login cookie, not a bearer token")


def _session(request: Request) -> ConsoleSession:
    _refuse_tokens(request)
    found, session = _sessions(request).find_any(session_ids(request.headers.getlist("cookie")))
    if session is None:
        raise ConsoleRefusal(401, "log in", to_login=True) if found is Validity.MISSING else ConsoleRefusal(
            401, "your console session expired: log in again", to_login=True
        )
    return session


async def _change(request: Request) -> tuple[ConsoleSession, FormData]:
    """A change: a live session and its CSRF token in the form."""
    session = _session(request)
    form = await request.form()
    sent = form.get("csrf_token")
    if not csrf_matches(session, sent if isinstance(sent, str) else None):
        raise ConsoleRefusal(403, "the form's CSRF token is missing or wrong: reload the page and try again")
    return session, form


def _field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def install_console(app: FastAPI, service: OrchestratorService) -> None:
    app.state.console_sessions = ConsoleSessions(service.settings.console_session_ttl_s)
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
def admin_root(request: Request) -> Response:
    _refuse_tokens(request)
    return redirect("/admin/")


@router.get("/admin/login")
def login_page(request: Request, expired: str | None = None) -> HTMLResponse:
    _refuse_tokens(request)
    note = "Your session expired: log in again." if expired else None
    return render("login.html", note=note, title="Log in")


@router.post("/admin/login")
async def login(request: Request) -> Response:
    _refuse_tokens(request)
    service = _service(request)
    attempts: LoginAttempts = request.app.state.console_login_attempts
    address = request.client.host if request.client is not None else ""
    wait = attempts.wait_s(address)
    if wait:
        refused = render("login.html", 429, note=f"Too many wrong tokens: try again in {wait} s.", title="Log in")
        refused.headers["Retry-After"] = str(wait)
        return refused
    form = await request.form()
    token = _field(form, "token")
    caller = caller_for(service, f"Bearer {token}") if token or not service.settings.auth_enabled else None
    if caller is None:
        attempts.failed(address)
        return render("login.html", 401, note="That is not the admin token.", title="Log in")
    if caller.role == "bot":
        return render("login.html", 403, note="The bot token cannot open the admin console.", title="Log in")
    session = _sessions(request).open()
    with service.store.write() as tx:
        audit.record(tx, actor=ACTOR, action="console.login")
    cookie = cookie_header(
        session.session_id, secure=request.url.scheme == "https", max_age=int(service.settings.console_session_ttl_s)
    )
    return redirect("/admin/", cookie=cookie)


@router.post("/admin/logout")
async def logout(request: Request) -> Response:
    session, _ = await _change(request)
    _sessions(request).close(session.session_id)
    return redirect("/admin/login", cookie=cookie_header("", secure=request.url.scheme == "https", max_age=0))


# --- overview ---------------------------------------------------------------------------------


def _hour(service: OrchestratorService) -> Any:
    now = datetime.now(timezone.utc)
    since = audit.AuditFilter(action="tool.call", since=iso(now - timedelta(hours=1)))
    rows = audit.entries(service.store, where=since, limit=100_000)
    samples = [
        CallSample(datetime.fromisoformat(e.at), float(e.detail.get("duration_ms") or 0.0), str(e.detail.get("outcome")))
        for e in rows
    ]
    return hour_of_calls(samples, now)


@router.get("/admin/")
def overview(request: Request) -> HTMLResponse:
    session = _session(request)
    service = _service(request)
    status = service.status
    statuses = service.sandboxes.status()
    by_state = Counter((s.backend, s.state) for s in statuses)
    hour = _hour(service)
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
def identity_page(request: Request) -> HTMLResponse:
    session = _session(request)
    service = _service(request)
    history = audit.entries(service.store, action="runtime_identity.change", limit=50)
    return render("identity.html", session=session, title="Runtime identity", state=service.switch.state(), history=history)


@router.post("/admin/identity")
async def identity_change(request: Request) -> Response:
    session, form = await _change(request)
    service = _service(request)
    try:
        mode = _mode_choice(_field(form, "mode"))
    except InvalidInput as exc:
        raise ConsoleRefusal(422, exc.message) from None
    if _field(form, "confirm") != "yes":  # first the confirmation: what changes for the next runs
        state = service.switch.state()
        after = mode if mode is not None else state.configured_mode
        return render(
            "identity_confirm.html", session=session, title="Confirm the change", state=state, mode=mode, after=after
        )
    await run_in_threadpool(service.switch.set_by_admin, mode, actor=ACTOR)
    return redirect("/admin/identity")


# --- users ------------------------------------------------------------------------------------


@router.get("/admin/users")
def users_page(request: Request, platform: str = "", backend: str = "", state: str = "", cursor: str = "") -> HTMLResponse:
    session = _session(request)
    service = _service(request)
    try:
        after = parse_cursor(cursor)
    except InvalidInput as exc:
        raise ConsoleRefusal(422, exc.message) from None
    found, next_after = service.user_listing.page(
        UserFilter(platform=platform or None, backend=backend or None, state=state or None), after=after, limit=PAGE
    )
    next_url = None
    if next_after is not None:
        next_url = "/admin/users?" + urlencode({"platform": platform, "backend": backend, "state": state, "cursor": next_after})
    return render(
        "users.html", session=session, title="Users", users=found, next_url=next_url,
        notice=_sessions(request).take_notice(session),
        filters={"platform": platform, "backend": backend, "state": state}, backends=sorted(service.sandboxes.backends),
    )  # fmt: skip


def _user_id(raw: str) -> int:
    if not raw.isascii() or not raw.isdecimal():
        raise ConsoleRefusal(404, "no such user")
    try:
        return ids.user_id(int(raw), "user_id")
    except ids.InvalidIdentifier as exc:
        raise ConsoleRefusal(404, exc.message) from None


def _live_user(service: OrchestratorService, raw: str) -> int:
    user_id = _user_id(raw)
    if service.users.purged.is_purged(user_id):
        raise ConsoleRefusal(410, f"user {user_id} was purged; its id is never used again")
    return user_id


@router.get("/admin/users/{user_id}")
def user_page(request: Request, user_id: str) -> HTMLResponse:
    session = _session(request)
    service = _service(request)
    uid = _live_user(service, user_id)
    summary = service.user_listing.summary(uid)
    if summary is None:
        raise ConsoleRefusal(404, f"user {uid} is not known here")
    template = service.templates.effective(uid)
    egress = None
    if service.egress is not None:
        rules = service.egress.rules.rules_of(uid)
        egress = {"allow": rules.allow, "remove": rules.remove, "effective": [str(p) for p in service.egress.rules.allow_for(uid)]}
    return render(
        "user.html",
        session=session,
        title=f"User {uid}",
        user=summary,
        notice=_sessions(request).take_notice(session),
        resources=service.resources.of(uid),
        resources_override=service.resources.has_override(uid),
        maxima=service.resources.maxima,
        disk_mechanism=service.disk_quotas.mechanism.value,
        disk=service.disk_quotas.usage(uid),
        egress=egress,
        template=template,
        template_why=TEMPLATE_WHY.get(template.source, template.source),
        template_assigned=service.templates.repo.assigned("user", str(uid)),
        template_names=[r.name for r in service.templates.repo.all()],
        sessions=service.session_repo.latest_of_owner(uid, limit=PAGE),
        runs=list_runs(service.store, RunFilter(user_id=uid), limit=20),
        actions=[a.value for a in SandboxAction],
    )


def _back_to(request: Request, session: ConsoleSession, url: str, notice: str) -> RedirectResponse:
    _sessions(request).notify(session, notice)
    return redirect(url)


async def _act(request: Request, user_id: str, do: Any) -> Response:
    """Run one change for a user off the event loop; a refusal is shown as a page."""
    session, form = await _change(request)
    service = _service(request)
    uid = _live_user(service, user_id)
    try:
        notice = await run_in_threadpool(do, service, uid, form)
    except OrchestratorError as exc:
        raise ConsoleRefusal(exc.status_code if exc.status_code >= 400 else 409, exc.message) from None
    return _back_to(request, session, f"/admin/users/{uid}", notice)


@router.post("/admin/users/{user_id}/sandbox/{action}")
async def user_sandbox(request: Request, user_id: str, action: str) -> Response:
    try:
        wanted = SandboxAction(action)
    except ValueError:
        raise ConsoleRefusal(404, "no such sandbox action") from None

    def do(service: OrchestratorService, uid: int, _form: FormData) -> str:
        return f"sandbox {service.sandbox_control.act(uid, wanted, actor=ACTOR)}"

    return await _act(request, user_id, do)


def _number(form: FormData, name: str, kind: type) -> Any:
    raw = _field(form, name)
    if raw == "":
        return None
    try:
        return kind(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be a number", field=name) from None


@router.post("/admin/users/{user_id}/disk")
async def user_disk(request: Request, user_id: str) -> Response:
    def do(service: OrchestratorService, uid: int, form: FormData) -> str:
        disk_mb = _number(form, "disk_mb", int)
        if disk_mb is None or not 8 <= disk_mb <= 16 * 1024 * 1024:
            raise InvalidInput("disk_mb must be between 8 and 16777216", field="disk_mb")
        _, online = service.disk_quotas.set_disk_limit(uid, disk_mb)
        return f"disk quota {disk_mb} MiB" + ("" if online else " (the sandbox was stopped for the resize)")

    return await _act(request, user_id, do)


def _patterns(form: FormData, name: str) -> tuple[str, ...]:
    return tuple(line.strip() for line in _field(form, name).replace(",", "\n").splitlines() if line.strip())


@router.post("/admin/users/{user_id}/egress")
async def user_egress(request: Request, user_id: str) -> Response:
    def do(service: OrchestratorService, uid: int, form: FormData) -> str:
        if service.egress is None:
            raise InvalidInput("egress is off on this server (ORCH_EGRESS=off)", field="allow")
        try:
            service.egress.rules.put(uid, UserRules(_patterns(form, "allow"), _patterns(form, "remove")), actor=ACTOR)
        except InvalidPattern as exc:
            raise InvalidInput(str(exc), field="allow") from None
        return "egress rules saved"

    return await _act(request, user_id, do)


@router.post("/admin/users/{user_id}/resources")
async def user_resources(request: Request, user_id: str) -> Response:
    def do(service: OrchestratorService, uid: int, form: FormData) -> str:
        cpus, memory_mb = _number(form, "cpus", float), _number(form, "memory_mb", int)
        if (cpus is not None and cpus <= 0) or (memory_mb is not None and memory_mb <= 0):
            raise InvalidInput("cpus and memory_mb must be above 0 (empty: the default)", field="cpus")
        service.users.admit(uid)
        service.resources.put(uid, cpus=cpus, memory_mb=memory_mb, actor=ACTOR)
        return "CPU and memory saved (from the sandbox's next start)"

    return await _act(request, user_id, do)


@router.post("/admin/users/{user_id}/template")
async def user_template(request: Request, user_id: str) -> Response:
    def do(service: OrchestratorService, uid: int, form: FormData) -> str:
        name = _field(form, "template") or None
        service.users.admit(uid)
        service.templates.assign_user(uid, name)
        return f"template {name or 'none'} saved (from the user's next call)"

    return await _act(request, user_id, do)


@router.post("/admin/users/{user_id}/purge")
async def user_purge(request: Request, user_id: str) -> Response:
    session, form = await _change(request)
    service = _service(request)
    uid = _user_id(user_id)
    confirm = _field(form, "confirm_user_id")
    try:
        await run_in_threadpool(
            lambda: service.purge.purge(uid, confirm_user_id=int(confirm) if confirm.isdecimal() else None, actor=ACTOR)
        )
    except OrchestratorError as exc:
        raise ConsoleRefusal(exc.status_code, exc.message) from None
    return _back_to(request, session, "/admin/users", f"user {uid} purged")


# --- groups, runs, audit -------------------------------------------------------------------


@router.get("/admin/groups")
def groups_page(request: Request) -> HTMLResponse:
    session = _session(request)
    service = _service(request)
    usage = {u.volume: u for u in service.disk_quotas.all_usage()}
    groups = [
        {
            "group": g.group,
            "members": g.members,
            "usage": usage.get(group_volume(service.layout, g.group).key),
            "sessions": service.session_repo.list_for_group(g.group),
        }
        for g in list_groups(service.store)
    ]
    return render("groups.html", session=session, title="Groups", groups=groups)


@router.get("/admin/runs")
def runs_page(
    request: Request, state: str = "recent", user_id: str = "", session_id: str = "", channel: str = "", chat_id: str = ""
) -> HTMLResponse:
    session = _session(request)
    service = _service(request)
    try:
        wanted = run_filter(state, _user_id(user_id) if user_id else None, session_id or None, channel or None, chat_id or None)
    except InvalidInput as exc:
        raise ConsoleRefusal(422, exc.message) from None
    return render(
        "runs.html", session=session, title="Runs", runs=list_runs(service.store, wanted, limit=200),
        filters={"state": state, "user_id": user_id, "session_id": session_id, "channel": channel, "chat_id": chat_id},
    )  # fmt: skip


@router.get("/admin/runs/{run_id}")
def run_page(request: Request, run_id: str) -> HTMLResponse:
    session = _session(request)
    service = _service(request)
    try:
        run = service.run_repo.get(ids.session_id(run_id, "run_id"))
    except ids.InvalidIdentifier:
        run = None
    if run is None:
        raise ConsoleRefusal(404, "no such run")
    return render("run.html", session=session, title=f"Run {run.run_id}", run=run, calls=tool_calls_of(service.store, run.run_id))


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
) -> HTMLResponse:
    session = _session(request)
    service = _service(request)
    where = audit.AuditFilter(
        action=action or None, user_id=_user_id(user_id) if user_id else None, session_id=session_id or None,
        tool=tool or None, outcome=outcome or None, since=_moment(since, "since"), until=_moment(until, "until"),
    )  # fmt: skip
    entries = audit.entries(service.store, where=where, limit=200)
    filters = {"action": action, "user_id": user_id, "session_id": session_id, "tool": tool, "outcome": outcome,
               "since": since, "until": until}  # fmt: skip
    return render("audit.html", session=session, title="Audit", entries=entries, filters=filters)
