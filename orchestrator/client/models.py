"""The client's typed models of the server's answers. Extra fields are ignored, so a newer
server never breaks an older bot; `ToolResult.typed` validates the results of the tools whose
shape is fixed."""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import Mapping
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.client.errors import InvalidResponseError, ToolCallFailed

class Trigger(str, Enum):
    """What started a run (`start_run(trigger=...)`). The server's `orchestrator.identity.Trigger`
    has the same values (a test compares them); this copy keeps the client free of the server's
    code, so it installs alone (docs/client.md). A plain string works too."""

    GROUP_MESSAGE = "group_message"
    PRIVATE_MESSAGE = "private_message"
    RETRY = "retry"
    CRASH_RECOVERY = "crash_recovery"
    SUBAGENT = "subagent"
    WEB = "web"
    SCHEDULED = "scheduled"
    OPENAPI = "openapi"
    MANUAL_COMPACTION = "manual_compaction"
    SIDE_TASK = "side_task"
    WECHAT = "wechat"


class IdentityMode(str, Enum):
    """The runtime-identity mode (`set_runtime_identity(mode)`); the server's
    `orchestrator.identity.IdentityMode` has the same values (a test compares them)."""

    EXECUTION = "execution"
    OWNER = "owner"


class Model(BaseModel):
    # New server fields must not break old bots.
    model_config = ConfigDict(extra="ignore", frozen=True)


class Group(Model):
    channel: str
    chat_id: str


class Person(Model):
    """A person as their chat platform names them: `Person(platform="slack", id="U024BE7LH")`.
    Wherever the client takes a user id, a `Person` (or a `("slack", "U024BE7LH")` tuple) may
    stand instead (docs/bots.md, "Platform identities")."""

    platform: str
    id: str

    def header_value(self) -> str:
        return f"{self.platform}:{self.id}"


# Our integer user id, or a person by platform identity.
UserRef = int | Person | tuple[str, str]


def user_ref_text(user: UserRef) -> str:
    """How a user reference travels in a path segment or `X-Acting-User`."""
    if isinstance(user, tuple):
        user = Person(platform=user[0], id=user[1])
    return user.header_value() if isinstance(user, Person) else str(int(user))


def person_body(user: UserRef | None) -> dict[str, str] | None:
    if user is None or isinstance(user, int):
        return None
    person = user if isinstance(user, Person) else Person(platform=user[0], id=user[1])
    return {"platform": person.platform, "id": person.id}


class Identity(Model):
    """A platform identity and the user id it names (`PUT /v1/identities/{platform}/{id}`)."""

    user_id: int
    platform: str
    external_id: str
    display_name: str | None = None


class IdentityPage(Model):
    identities: list[Identity]
    next_after: str | None


class Health(Model):
    """`/healthz`: anyone sees status, version and the mode; the rest needs the admin token."""

    status: str
    version: str
    runtime_identity: str
    backend: str | None = None
    runtime_identity_source: str | None = None
    egress: dict[str, Any] | None = None  # {"mode": "off" | "allowlist", ...} (docs/egress.md)
    isolation: dict[str, Any] | None = None  # {"uid_block": [first, last], ...} (docs/operations.md)


class Credential(Model):
    """A user's credential, metadata only: the secret never comes back (docs/credentials.md)."""

    name: str
    hosts: list[str]
    header: str
    env: str | None = None
    created_at: str
    last_used_at: str | None = None


class CredentialGrant(Model):
    """A credential's use delegated to one session's runs (of one runtime user, or all)."""

    grant_id: str
    credential: str
    grantor_user_id: int
    grantee_user_id: int | None
    session_id: str
    expires_at: str
    revoked_at: str | None = None


class CredentialGrants(Model):
    granted: list[CredentialGrant]
    held: list[CredentialGrant]


class DelegatedCredential(Model):
    """In a run's context: a credential another member granted to this run."""

    credential: str
    owner_user_id: int
    hosts: list[str]
    expires_at: str
    grant_id: str


class EgressRules(Model):
    """A user's egress allow list (docs/egress.md)."""

    user_id: int
    mode: str
    allow: list[str]
    remove: list[str]
    defaults: list[str]
    effective: list[str]


class DiskUsage(Model):
    """One volume's disk and inode usage against its quota (docs/disk-quotas.md)."""

    volume: str
    mechanism: str
    bytes_used: int
    bytes_limit: int
    inodes_used: int
    inodes_limit: int
    over_quota: bool
    partial: bool
    image_mb: int | None = None


class UserDisk(Model):
    user_id: int
    mechanism: str
    usage: DiskUsage | None = None
    grown_online: bool | None = None


class DiskOverview(Model):
    mechanism: str
    reason: str
    min_free_disk_pct: float
    host_free_pct: float
    watermark_problem: str | None = None
    over_quota_users: list[int]
    over_share: dict[str, list[int]] = {}  # shared volume -> the members over their share there
    volumes: list[DiskUsage]


class SharedMember(Model):
    """One member's files in a shared place against the share one member may hold."""

    user_id: int | None  # None: files of an owner that is no user's sandbox (root)
    uid: int
    bytes_used: int
    inodes_used: int
    share_bytes: int
    share_inodes: int
    over_share: bool


class SharedMembers(Model):
    """A shared place (share/, a group workspace): its usage and each member's, largest first."""

    volume: str
    usage: DiskUsage
    members: list[SharedMember]
    partial: bool


class SharedMemberFreed(SharedMembers):
    user_id: int
    removed: int
    kept_dirs: int
    complete: bool  # False: stopped at its bound; call again


class TemplateChoice(Model):
    """The template a user's sandbox runs and why: `source` is user, group, skill, run or default."""

    name: str
    source: str


class User(Model):
    user_id: int
    display_name: str | None
    backend: str | None
    groups: list[Group]
    identities: list[Person] = []
    template: TemplateChoice | None = None


class Template(Model):
    """A sandbox template (docs/templates.md): `status` building, ready or failed; `image` the
    one that serves (the last that built); `log` the tail of the latest build (`get_template`)."""

    name: str
    status: str
    recipe_hash: str | None
    image: str | None
    error: str | None = None
    recipe: dict[str, Any] = {}
    log: str | None = None
    requestable: bool = False  # a bot may ask for it when it starts a run


class TemplateList(Model):
    templates: list[Template]


class UserTemplate(Model):
    user_id: int
    template: TemplateChoice


class GroupTemplate(Model):
    channel: str
    chat_id: str
    template: str  # `default` when none is set


class LackingTemplate(Model):
    skill: str
    template: str
    why: str


class RunTemplate(Model):
    """The template of a run's calls and why, and the skills whose template the sandbox lacks."""

    name: str
    source: str
    lacking: list[LackingTemplate] = []


class ProjectSettings(Model):
    project_id: str
    cross_session_read: bool
    cross_project_collaboration: bool


class Session(Model):
    session_id: str
    owner_user_id: int
    owner_identity: Person | None = None
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
    owner_identity: Person | None = None
    speaker_identity: Person | None = None
    workdir: str
    upload_dir: str
    outputs_dir: str | None = None
    group_workspace: str | None = None
    skills: RunSkills
    archive_hint_enabled: bool
    memory_user_id: int
    template: RunTemplate | None = None
    prompt_identity_section: str | None
    delegated_credentials: list[DelegatedCredential] = []


class Run(Model):
    run_id: str
    session_id: str
    trigger: str
    owner_user_id: int
    execution_user_id: int | None
    runtime_user_id: int
    identity_mode: str
    owner_identity: Person | None = None
    speaker_identity: Person | None = None
    status: str
    started_at: str
    ended_at: str | None


class RunPage(Model):
    runs: list[Run]  # newest first
    next_before: int | None  # pass as `before` for the next (older) page


class AdminUser(Model):
    """One user as the admin's list shows it (`admin_users`, docs/admin-console.md)."""

    user_id: int
    display_name: str | None
    identities: list[Person]
    backend: str
    backend_override: str | None
    state: str  # of its sandbox: running | paused | starting | failed | stopped
    groups: list[Group]
    cpus: float
    memory_mb: int
    resources_override: bool
    created_at: str


class AdminUserPage(Model):
    users: list[AdminUser]
    next_cursor: str | None  # pass as `cursor` for the next page


class AdminRun(Run):
    last_activity_at: str | None
    group: Group | None = None


class AdminRunPage(Model):
    runs: list[AdminRun]


class SandboxAction(Model):
    user_id: int
    state: str


class UserResources(Model):
    user_id: int
    cpus: float
    memory_mb: int
    override: bool
    max_cpus: float
    max_memory_mb: int


class UserPurged(Model):
    user_id: int
    purged: bool
    already_purged: bool
    sessions_deleted: list[str]
    volume_removed: bool
    entries_removed: int


class SandboxState(Model):
    user_id: int
    backend: str
    state: str  # running | paused | stopped | failed | none
    since: str | None
    busy: int
    last_call_at: str | None


class IncomingFile(Model):
    """A file uploaded from the chat into the run's sandbox: `path` is what to hand the model."""

    path: str
    name: str
    size: int
    scope: str
    runtime_user_id: int
    note: str


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


class ShellResult(Model):
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    duration_s: float | None = None
    cwd: str | None = None
    note: str | None = None


class CodeImage(Model):
    """An image a kernel showed, written to the session's outputs/ directory (send it with
    `send_image`, passing `path`)."""

    path: str
    mime: str
    size: int


class CodeError(Model):
    ename: str
    evalue: str
    traceback: str


class KernelRef(Model):
    name: str
    language: str


class RunCodeResult(Model):
    """What `run_code` answers (docs/interpreter.md). `status`: ok, error, timeout (the kernel
    was interrupted, its state kept) or kernel_died; `kernel_restarted`: the state was lost."""

    status: str
    stdout: str
    stderr: str
    text: str | None = None
    data: dict[str, Any] = {}
    images: list[CodeImage] = []
    error: CodeError | None = None
    kernel: KernelRef
    kernel_restarted: bool = False
    duration_s: float | None = None
    truncated: bool = False
    note: str | None = None


class ReadFileResult(Model):
    path: str
    content: str
    start_line: int | None = None
    end_line: int | None = None
    total_lines: int | None = None
    size: int | None = None
    truncated: bool = False


class WriteFileResult(Model):
    path: str
    bytes_written: int
    created: bool


class EditFileResult(Model):
    path: str
    replacements: int
    line: int | None = None


class DirEntry(Model):
    name: str
    type: str
    size: int | None = None
    target: str | None = None


class ListDirResult(Model):
    path: str
    entries: list[DirEntry]
    total: int
    truncated: bool = False


TypedResult = ShellResult | RunCodeResult | ReadFileResult | WriteFileResult | EditFileResult | ListDirResult
RESULT_TYPES: dict[str, type[Model]] = {
    "shell": ShellResult,
    "run_code": RunCodeResult,
    "read_file": ReadFileResult,
    "write_file": WriteFileResult,
    "edit_file": EditFileResult,
    "list_dir": ListDirResult,
}


class ToolResult(Model):
    """A tool call's answer. `result` is the server's JSON as the model should see it;
    `typed` is the same result validated into the tool's model, for the tools in
    `RESULT_TYPES` (None for other tools and for failures)."""

    ok: bool
    result: Any = None
    error: ToolErrorInfo | None = None
    tool: str | None = None
    typed: TypedResult | None = None

    @classmethod
    def of(cls, tool: str, body: Mapping[str, Any]) -> ToolResult:
        try:
            result = cls.model_validate({**body, "tool": tool, "typed": None})
            if result.ok and tool in RESULT_TYPES:
                typed = RESULT_TYPES[tool].model_validate(result.result)
                result = result.model_copy(update={"typed": typed})
        except ValidationError as exc:
            raise InvalidResponseError(
                f"the server's answer to {tool} does not have the shape this client knows: {exc.errors()[:3]}",
                code="invalid_response",
            ) from exc
        return result

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


class Preview(Model):
    """A preview link to a port a sandbox listens on (docs/previews.md)."""

    preview_id: str
    url: str
    port: int
    expires_at: str


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


class IdentityModeState(Model):
    """The admin view of the runtime-identity mode (the modes: `IdentityMode`)."""

    mode: str
    source: str
    changed_at: str
    invalid_value: str | None
    configured_mode: str | None = None
    configured_source: str | None = None


class Collaboration(Model):
    request_id: str
    role: str
    source_session_id: str
    target_session_id: str
    generation: str
    state: str
    reason: str | None
    delivery_state: str | None
    continuation: str
    continuation_reason: str | None
    clarification_count: int
    messages: list[dict[str, Any]]
    deliveries: list[dict[str, Any]]
    created_at: str
    updated_at: str


class CollaborationPage(Model):
    collaborations: list[Collaboration]
    next_before: int | None


class CollaborationStopped(Model):
    collaboration: Collaboration
    cancelled_run_ids: list[str]


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
