"""`orchestrator smoke`: the group-chat acceptance checks end to end against a live server.

Owner A creates a group session and member B speaks in it; every acceptance check that applies to
this product is run through the public API with the client SDK, exactly as a chat bot would,
and prints one `PASS`/`FAIL` line. The smoke creates what it needs itself: two fresh users
(random ids unless given), a group session, files and artifacts through the tools, and a
system skill `orch-smoke` when it must: written into the server's data dir when told where it
is (`--data-dir`), else installed through the admin skills API when the server has no valid
system skill of its own (B's catalog would be empty). It deletes its sessions, and the skill
it made, at the end. Checks that belong to a chat product
and not to this one (the Feishu/DingTalk cards, `docker logs`) are covered by their equivalents:
the structured tool errors replace log greps.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from orchestrator.credentials.probe import echo_upstream, echoed_headers, https_command, make_upstream_ca
from orchestrator.client import ApiError, OrchestratorClient, RunContext, ToolResult, TransportError
from orchestrator.client.models import Health

SMOKE_SKILL = "orch-smoke"
SMOKE_PACKAGE = "cowsay"  # a small pure-Python wheel with a console script, installed from PyPI
SKILL_WAIT_S = 10.0  # a skill written into the data dir is seen once the skills watcher reports it
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"


class CheckFailed(Exception):
    pass


class CheckSkipped(Exception):
    """The check does not apply to this server (printed as a SKIP line, not a failure)."""


def expect(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


NOT_RUN = "not run:"


def need(value: Any, what: str) -> Any:
    if value is None:
        raise CheckFailed(f"{NOT_RUN} needs {what}, which failed earlier")
    return value


@dataclass
class CheckResult:
    name: str
    ok: bool
    detail: str = ""
    skipped: bool = False


@dataclass
class SmokeOptions:
    owner_user_id: int | None = None
    member_user_id: int | None = None
    data_dir: Path | None = None
    backend: str | None = None  # set as both users' backend override
    keep: bool = False  # keep the sessions (for a look afterwards)
    url: str | None = None  # named when the server does not answer
    # The server's ORCH_EGRESS_UPSTREAM_CA_BUNDLE file: the credential check writes its CA there.
    credential_upstream_ca: Path | None = None


def owner_mode_note(source: str) -> str:
    """Why the group checks fail in `owner` mode, and how to leave it (docs/operations.md)."""
    how = (
        "an admin set it: `PUT /v1/admin/runtime-identity {\"mode\": null}` returns to the configured mode"
        if source == "admin"
        else f"it is configured ({source}): set ORCH_RUNTIME_IDENTITY=execution and restart, or "
        "`PUT /v1/admin/runtime-identity {\"mode\": \"execution\"}`"
    )
    return (
        "the server runs in owner mode, where every run uses the session owner's identity: the checks "
        f"that member B runs as B cannot pass; {how}"
    )


def _printable(data: bytes) -> str:
    return "".join(f"\\x{b:02x}" for b in data)


SMOKE_USER_ID_BASE = 700_000_000  # far from the ids a deployment's real users have
SMOKE_USER_ID_SPREAD = 99_000_000


def max_user_id_of(health: Health) -> int | None:
    """The largest user id the server takes, from the uid block `/healthz` reports."""
    block = (health.isolation or {}).get("uid_block")
    if isinstance(block, list) and len(block) == 2 and all(type(n) is int for n in block) and block[1] > block[0]:
        return block[1] - block[0]
    return None


def smoke_user_ids(
    owner: int | None, member: int | None, max_user_id: int | None, randbelow: Callable[[int], int]
) -> tuple[int, int]:
    """Pure: users A and B of a smoke run. Given ids win; else A is drawn from 7e8 upwards, or,
    on a server whose uid block is smaller, from the top tenth of its ids (real users tend to be
    numbered from the bottom) so that B = A + 1 still fits."""
    if owner is None:
        if max_user_id is not None and max_user_id < SMOKE_USER_ID_BASE + SMOKE_USER_ID_SPREAD + 1:
            top_tenth = max(1, max_user_id // 10)
            owner = max(1, max_user_id - top_tenth + randbelow(top_tenth))
            owner = min(owner, max(1, max_user_id - 1))
        else:
            owner = SMOKE_USER_ID_BASE + randbelow(SMOKE_USER_ID_SPREAD)
    return owner, member if member is not None else owner + 1


CREDENTIAL_CHECK = "B's credential reaches a local HTTPS upstream through the proxy; B's sandbox never holds it"


@dataclass
class SmokeRun:
    client: OrchestratorClient
    options: SmokeOptions
    out: TextIO
    results: list[CheckResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.nonce = secrets.token_hex(4)
        self.a, self.b = smoke_user_ids(self.options.owner_user_id, self.options.member_user_id, None, secrets.randbelow)
        self.sessions: list[str] = []
        self.skill: str | None = None
        self.skill_created: Path | None = None  # orch-smoke written into the data dir
        self.skill_installed = False  # orch-smoke installed through the admin API
        self.skill_note = "the smoke did not get to provide a skill"
        self.sid: str | None = None
        self.a_run: RunContext | None = None
        self.b_run: RunContext | None = None
        self.a_upload: dict[str, Any] | None = None
        self.a_runtime_file: str | None = None
        self.refused_url: str | None = None
        self.dump_path: str | None = None
        self.last_runtime: list[int | None] = []
        self.mode_note: str | None = None  # set in owner mode: added to every FAIL

    # reporting -------------------------------------------------------------------------
    def check(self, name: str, step: Callable[[], str | None]) -> bool:
        try:
            detail = step() or ""
            result = CheckResult(name, True, detail)
        except CheckSkipped as exc:
            result = CheckResult(name, True, str(exc), skipped=True)
        except CheckFailed as exc:
            result = CheckResult(name, False, str(exc))
        except ApiError as exc:
            result = CheckResult(name, False, f"API error {exc.status} {exc.code}: {exc.message}")
        except Exception as exc:  # noqa: BLE001 - a smoke reports, it does not crash
            result = CheckResult(name, False, f"{type(exc).__name__}: {exc}")
        self.results.append(result)
        line = f"{'SKIP' if result.skipped else 'PASS' if result.ok else 'FAIL'} {name}"
        if not result.ok and self.mode_note is not None and not result.detail.startswith(NOT_RUN):
            line += " (owner mode)"  # the NOTE above says why; a check that did not run failed earlier
        if result.detail:
            line += f" — {result.detail}"
        print(line, file=self.out, flush=True)
        return result.ok

    # helpers ---------------------------------------------------------------------------
    def tool(self, run: RunContext, name: str, **arguments: Any) -> ToolResult:
        return self.client.call_tool(run.run_id, name, arguments)

    def ok(self, run: RunContext, name: str, **arguments: Any) -> dict[str, Any]:
        result = self.tool(run, name, **arguments)
        expect(result.ok, f"{name} failed: {result.error.code if result.error else '?'}: "
               f"{result.error.message if result.error else ''}")
        return result.result

    def refused(self, run: RunContext, name: str, code: str, **arguments: Any) -> dict[str, Any]:
        result = self.tool(run, name, **arguments)
        expect(not result.ok, f"{name} {arguments} succeeded; expected {code}")
        assert result.error is not None
        expect(result.error.code == code, f"{name} answered {result.error.code} ({result.error.message}); expected {code}")
        return {"code": result.error.code, "message": result.error.message, **result.error.details}

    def data_root(self, run: RunContext) -> Path:
        # workdir = {data}/runtime/{uid}/{sid}; containers see the same absolute paths
        return Path(run.workdir).parents[2]

    def last_runtime_user(self) -> int | None:
        return self.client.get_session(need(self.sid, "the group session")).last_runtime_user_id

    # the checks ------------------------------------------------------------------------
    def preflight(self) -> int | None:
        """The mode first (it decides what the group checks can show); an exit code when the
        server does not answer at all, so that is one line and not a FAIL per check."""
        try:
            health = self.client.health()
        except TransportError as exc:
            where = self.options.url or "the server"
            print(f"cannot reach {where}: {exc.message} (is `orchestrator serve` running there?)", file=self.out, flush=True)
            return 2
        source = health.runtime_identity_source or "unknown"
        print(f"runtime identity mode: {health.runtime_identity} (source: {source})", file=self.out, flush=True)
        if health.runtime_identity == "owner":
            self.mode_note = owner_mode_note(source)
            print(f"NOTE {self.mode_note}", file=self.out, flush=True)
        return None

    def run(self) -> int:
        unreachable = self.preflight()
        if unreachable is not None:
            return unreachable
        steps: list[tuple[str, Callable[[], str | None]]] = [
            ("server answers /healthz", self.health),
            ("A creates a group session", self.create_session),
            ("A speaks: runtime identity A, the owner's identity section, archive hint on", self.a_speaks),
            ("A publishes an artifact; its public URL serves the same bytes without a token", self.a_publishes),
            ("B speaks in A's group session: runtime identity B, owner A, identity section", self.b_speaks),
            ("B's skill catalog paths are under runtime/B/{sid}/skills/", self.b_catalog),
            ("B reads a skill's SKILL.md (no path escape)", self.b_reads_skill),
            ("B's skill link points into skill-views/B", self.b_skill_view),
            ("B installs a CLI into deps/B/npm/bin and runs it", self.b_installs_cli),
            ("B installs a real package into deps/B/ through the egress proxy and runs it", self.b_installs_package),
            ("B's read_file of A's upload: container diagnostic, no URL", self.b_reads_a_upload),
            ("B's send_file of A's upload path: host pre-check gives the public URL", self.b_sends_a_upload_path),
            ("B's send_file by that URL succeeds with A's bytes", self.b_sends_by_url),
            ("B's send_file of A's runtime file: no URL, ask the member or regenerate", self.b_sends_a_runtime_file),
            ("B dumps the user messages and reads them back", self.b_dumps_messages),
            ("B sends a file from its sandbox; the delivery has its bytes", self.b_sends_own_file),
            ("a retry of B's failed turn keeps B", self.retry_keeps_b),
            ("A speaks again: A's paths, B's CLI not reachable", self.a_speaks_again),
            ("last_runtime_user_id follows the speakers (A, B, B, A)", self.last_runtime_follows),
            ("compaction archive: hint and directory for A only", self.archive_for_owner_only),
            ("private chat (wechat): B sends its own upload", self.private_chat_send),
        ]
        if self.options.credential_upstream_ca is not None:  # opt-in: the server must be set up for it
            steps.insert(10, (CREDENTIAL_CHECK, self.b_credential))
        try:
            for name, step in steps:
                self.check(name, step)
        finally:
            if not self.options.keep:
                self.check("cleanup: the smoke's sessions are deleted", self.cleanup)
        failed = [r for r in self.results if not r.ok]
        if failed and self.mode_note is not None:
            print(f"NOTE {len(failed)} failure(s) above are expected in owner mode: {self.mode_note}", file=self.out, flush=True)
        skipped = sum(r.skipped for r in self.results)
        summary = f"{len(self.results) - len(failed) - skipped} passed, " + (f"{skipped} skipped, " if skipped else "")
        print(f"{summary}{len(failed)} failed", file=self.out, flush=True)
        return 1 if failed else 0

    def health(self) -> str:
        health = self.client.health()
        expect(health.status == "ok", f"status {health.status}")
        # Draw A and B again inside the largest user id the server takes (its uid block).
        self.a, self.b = smoke_user_ids(
            self.options.owner_user_id, self.options.member_user_id, max_user_id_of(health), secrets.randbelow
        )
        return f"backend {health.backend}, version {health.version}, users A={self.a} B={self.b}"

    def create_session(self) -> str:
        for user, name in ((self.a, "smoke owner A"), (self.b, "smoke member B")):
            self.client.put_user(user, display_name=name, backend=self.options.backend)
        if self.options.data_dir is not None:
            self._create_skill(self.options.data_dir)
        else:
            self._provide_skill_through_api()
        session = self.client.create_session(
            owner_user_id=self.a,
            channel="feishu_group",
            group=("feishu", f"smoke-{self.nonce}"),
            title="orchestrator smoke",
        )
        self.sessions.append(session.session_id)
        self.sid = session.session_id
        self.client.append_messages(
            session.session_id,
            [
                {"role": "user", "content": f"A asks for a chart {self.nonce}", "speaker_user_id": self.a},
                {"role": "assistant", "content": "here it is"},
                {"role": "user", "content": f"B asks to make it blue {self.nonce}", "speaker_user_id": self.b},
            ],
        )
        return f"{session.session_id}; skill: {self.skill_note}"

    def _skill_doc(self) -> str:
        return (
            f"---\nname: {SMOKE_SKILL}\ndescription: created by orchestrator smoke\n---\n"
            f"# Smoke skill\nnonce {self.nonce}\n"
        )

    def _create_skill(self, data_dir: Path) -> None:
        skill = data_dir / "skills" / SMOKE_SKILL
        skill.mkdir(parents=True, exist_ok=True)
        (skill / "SKILL.md").write_text(self._skill_doc())
        skill.chmod(0o755)
        (skill / "SKILL.md").chmod(0o644)
        self.skill_created = skill
        self.skill_note = f"wrote {SMOKE_SKILL} into {data_dir}/skills"

    def _provide_skill_through_api(self) -> None:
        """B (a fresh user) sees the system skills only: if the server has no valid one of its
        own, install orch-smoke through the admin API (removed again at the end)."""
        try:
            listing = self.client.list_skills()
        except ApiError as exc:
            self.skill_note = (
                f"cannot list the server's system skills (admin API: {exc.status or ''} {exc.code}); "
                "for a server without skills, pass --admin-token (or set ORCH_ADMIN_TOKEN) so the smoke "
                "can install one, or --data-dir with the server's data dir on this machine"
            )
            return
        # A leftover orch-smoke of an interrupted smoke is replaced, and removed at the end.
        own = [s.name for s in listing.skills if s.valid and s.name != SMOKE_SKILL]
        if own:
            self.skill_note = f"the server's own system skills ({', '.join(own[:3])}{', ...' if len(own) > 3 else ''})"
            return
        try:
            installed = self.client.put_skill(SMOKE_SKILL, {"SKILL.md": self._skill_doc()})
        except ApiError as exc:
            self.skill_note = f"the server has no system skill and installing {SMOKE_SKILL} failed: {exc}"
            return
        self.skill_installed = True
        self.skill_note = f"installed {SMOKE_SKILL} through the admin API ({installed.fingerprint[:12]})"

    def a_speaks(self) -> str:
        sid = need(self.sid, "the group session")
        # A skill installed through the API is there at once; one written into the data dir
        # once the server's file watcher reports it.
        deadline = time.monotonic() + (SKILL_WAIT_S if self.skill_created else 0)
        wanted = SMOKE_SKILL if self.skill_created or self.skill_installed else None
        while True:
            run = self.client.start_run(sid, trigger="group_message", speaker_user_id=self.a)
            if wanted is None or wanted in run.skills.available or time.monotonic() > deadline:
                break
            self.client.end_run(run.run_id)
            time.sleep(0.25)  # the skills watcher has not reported the new skill yet
        self.a_run = run
        self.last_runtime.append(self.last_runtime_user())
        expect(run.runtime_user_id == self.a and run.owner_user_id == self.a, f"runtime {run.runtime_user_id}")
        # A group session: the section says the run is the owner's own, and names nobody else.
        section = run.prompt_identity_section or ""
        expect("the session owner" in section and "This message is from" not in section, f"identity section: {section!r}")
        expect(run.archive_hint_enabled, "archive hint off for the owner")
        if wanted:
            expect(SMOKE_SKILL in run.skills.available, f"the new skill {SMOKE_SKILL} is not available: {run.skills}")
        return f"run {run.run_id}"

    def a_publishes(self) -> str:
        run = need(self.a_run, "A's run")
        self.ok(run, "shell", command=f"printf '{_printable(PNG)}' > smoke-chart.png")
        published = self.ok(run, "publish_artifact", path="smoke-chart.png")
        expect(published["path"].startswith(run.upload_dir + "/"), f"published outside A's uploads: {published['path']}")
        self.a_upload = published
        self.ok(run, "write_file", path="smoke-notes.md", content=f"A's notes {self.nonce}\n")
        self.a_runtime_file = f"{run.workdir}/smoke-notes.md"
        try:
            data = self.client.fetch_upload(published["url"])
        except ApiError as exc:
            raise CheckFailed(
                f"GET {published['url']} failed ({exc}); is ORCH_PUBLIC_BASE_URL this server's public origin?"
            ) from None
        expect(data == PNG, "the public URL serves other bytes")
        return published["url"]

    def b_speaks(self) -> str:
        sid = need(self.sid, "the group session")
        run = self.client.start_run(sid, trigger="group_message", speaker_user_id=self.b)
        self.b_run = run
        self.last_runtime.append(self.last_runtime_user())
        expect(run.runtime_user_id == self.b, f"runtime identity {run.runtime_user_id}, expected B={self.b}")
        expect(run.execution_user_id == self.b and run.owner_user_id == self.a, "execution/owner ids wrong")
        expect(run.memory_user_id == self.b, "memory does not follow the runtime user")
        expect(not run.archive_hint_enabled, "the archive hint is offered to B (it is the owner's only)")
        expect(f"/runtime/{self.b}/{sid}" in run.workdir, f"workdir {run.workdir}")
        expect(f"/uploads/{self.b}" in run.upload_dir, f"upload dir {run.upload_dir}")
        section = run.prompt_identity_section or ""
        expect(f"#{self.b}" in section and f"#{self.a}" in section, "the identity section does not name B and A")
        return f"run {run.run_id}"

    def b_catalog(self) -> str:
        run = need(self.b_run, "B's run")
        expect(run.skills.catalog, f"B has no skills; skill: {self.skill_note}")
        prefix = f"{run.workdir}/skills/"
        wrong = [e.path for e in run.skills.catalog if not e.path.startswith(prefix)]
        expect(not wrong, f"catalog paths outside {prefix}: {wrong}")
        self.skill = SMOKE_SKILL if SMOKE_SKILL in run.skills.available else run.skills.available[0]
        return f"{len(run.skills.catalog)} skill(s), using {self.skill}"

    def b_reads_skill(self) -> str:
        run, skill = need(self.b_run, "B's run"), need(self.skill, "a skill in B's catalog")
        path = next(e.path for e in run.skills.catalog if e.name == skill)
        content = self.ok(run, "read_file", path=f"{path}/SKILL.md")["content"]
        if skill == SMOKE_SKILL and (self.skill_created or self.skill_installed):
            expect(f"nonce {self.nonce}" in content, "SKILL.md has other content than the smoke wrote")
        return f"{path}/SKILL.md"

    def b_skill_view(self) -> str:
        run, skill = need(self.b_run, "B's run"), need(self.skill, "a skill in B's catalog")
        entries = self.ok(run, "list_dir", path="skills")["entries"]
        link = next((e for e in entries if e["name"] == skill), None)
        expect(link is not None and link["type"] == "symlink", f"no link for {skill} in B's skills dir: {entries}")
        data = self.data_root(run)
        allowed = (f"{data}/skill-views/{self.b}/", f"{data}/userskills/{self.b}/")
        expect(link["target"].startswith(allowed), f"the link points to {link['target']}, not B's views")
        return link["target"]

    def b_installs_cli(self) -> str:
        run = need(self.b_run, "B's run")
        deps = f"{self.data_root(run)}/deps/{self.b}/npm/bin"
        script = f"#!/bin/sh\\necho smoke-cli-{self.nonce}\\n"
        result = self.ok(
            run,
            "shell",
            command=f"mkdir -p {deps} && printf '{script}' > {deps}/orch-smoke-cli && chmod +x {deps}/orch-smoke-cli"
            " && command -v orch-smoke-cli && orch-smoke-cli",
        )
        expect(result["exit_code"] == 0, f"exit {result['exit_code']}: {result['stderr'][-300:]}")
        expect(f"{deps}/orch-smoke-cli" in result["stdout"], f"not found on PATH: {result['stdout'][-300:]}")
        expect(f"smoke-cli-{self.nonce}" in result["stdout"], "the CLI did not run")
        return f"{deps}/orch-smoke-cli"

    def b_installs_package(self) -> str:
        # Without the admin token /healthz does not say (None): then the install is tried.
        egress = self.client.health().egress
        if egress is not None and egress.get("mode") == "off":
            raise CheckSkipped("the server says egress is off (ORCH_EGRESS=off): sandboxes have no way out")
        run = need(self.b_run, "B's run")
        target = f"{self.data_root(run)}/deps/{self.b}/pip"
        result = self.ok(
            run,
            "shell",
            command=f"python3 -m pip install --quiet --target {target} {SMOKE_PACKAGE} 2>&1 | tail -5"
            f" && command -v {SMOKE_PACKAGE} && {SMOKE_PACKAGE} -t smoke-{self.nonce}",
            timeout_s=300,
        )
        expect(result["exit_code"] == 0, f"exit {result['exit_code']}: {result['stdout'][-400:]} {result['stderr'][-300:]}")
        expect(f"{target}/bin/{SMOKE_PACKAGE}" in result["stdout"], f"not installed on PATH: {result['stdout'][-400:]}")
        expect(f"smoke-{self.nonce}" in result["stdout"], f"{SMOKE_PACKAGE} did not run: {result['stdout'][-400:]}")
        return f"{SMOKE_PACKAGE} from PyPI in {target}"

    def b_credential(self) -> str:
        ca_file = need(self.options.credential_upstream_ca, "--credential-upstream-ca")
        run = need(self.b_run, "B's run")
        try:
            self.client.credentials(self.b, acting_user=self.b)
        except ApiError as exc:
            if exc.code == "credentials_off":
                raise CheckSkipped(f"the server says: {exc.message}") from None
            raise
        chain = make_upstream_ca(ca_file)
        name, secret = f"smoke-{self.nonce}", f"smoke-secret-{secrets.token_hex(16)}"
        with echo_upstream(chain) as port:
            target = f"127.0.0.1:{port}"
            self.client.set_egress(self.b, allow=[target])
            try:
                self.client.put_credential(
                    self.b, name, secret=secret, hosts=[target], env="SMOKE_TOKEN", acting_user=self.b
                )  # fmt: skip
                result = self.ok(run, "shell", command=https_command(f"{target}/echo", f"Authorization: Bearer cred:{name}"))
                expect(result["exit_code"] == 0, f"exit {result['exit_code']}: {result['stderr'][-300:]}")
                answer = json.loads(result["stdout"])
                expect(answer.get("status") == 200, f"the upstream answered {answer}")
                got = echoed_headers(answer, "Authorization")
                expect(got == [f"Bearer {secret}"], f"the upstream saw Authorization {['(the secret)' if secret in g else g for g in got]}")
                env = self.ok(run, "shell", command="env; cat /proc/self/environ")
                expect(secret not in env["stdout"], "the secret is in B's environment")
            finally:
                try:
                    self.client.delete_credential(self.b, name, acting_user=self.b)
                finally:
                    self.client.set_egress(self.b)
        return f"the upstream on {target} saw B's token; B's environment does not hold it"

    def b_reads_a_upload(self) -> str:
        run, upload = need(self.b_run, "B's run"), need(self.a_upload, "A's artifact")
        error = self.refused(run, "read_file", "foreign_upload_path", path=upload["path"])
        expect("http" not in error["message"], "the container diagnostic carries a URL")
        expect(f"current runtime identity {self.b}" in error["message"], "the message does not name B")
        return error["code"]

    def b_sends_a_upload_path(self) -> str:
        run, upload = need(self.b_run, "B's run"), need(self.a_upload, "A's artifact")
        error = self.refused(run, "send_file", "foreign_upload_path", path_or_url=upload["path"])
        expect(error.get("url") == upload["url"], f"url {error.get('url')!r}, expected {upload['url']}")
        expect(upload["url"] in error["message"], "the message does not carry the URL")
        self.refused_url = error["url"]
        return error["url"]

    def b_sends_by_url(self) -> str:
        run, url = need(self.b_run, "B's run"), need(self.refused_url, "the URL from the pre-check")
        sent = self.ok(run, "send_file", path_or_url=url)
        delivery = self.client.fetch_delivery(sent["delivery_id"])
        expect(delivery.data == PNG, "the delivery's bytes differ from A's file")
        image = self.ok(run, "send_image", path_or_url=url)
        expect(image["media_type"] == "image/png", f"send_image media type {image['media_type']}")
        return sent["delivery_id"]

    def b_sends_a_runtime_file(self) -> str:
        run, path = need(self.b_run, "B's run"), need(self.a_runtime_file, "A's runtime file")
        error = self.refused(run, "send_file", "foreign_runtime_path", path_or_url=path)
        expect("url" not in error and "http" not in error["message"], "a URL was offered for a runtime file")
        return error["code"]

    def b_dumps_messages(self) -> str:
        run = need(self.b_run, "B's run")
        dumped = self.ok(run, "dump_user_messages")
        expect(dumped["path"].startswith(f"{run.workdir}/user-messages/"), f"dumped to {dumped['path']}")
        content = self.ok(run, "read_file", path=dumped["path"])["content"]
        expect(f"B asks to make it blue {self.nonce}" in content, "B's message is not in the dump")
        expect("here it is" not in content, "the dump holds assistant messages")
        self.dump_path = dumped["path"]
        return dumped["path"]

    def b_sends_own_file(self) -> str:
        run = need(self.b_run, "B's run")
        body = f"B's report {self.nonce}\n".encode()
        self.ok(run, "write_file", path="smoke-report.txt", content=body.decode())
        sent = self.ok(run, "send_file", path_or_url="smoke-report.txt")
        delivery = self.client.fetch_delivery(sent["delivery_id"])
        expect(delivery.data == body and delivery.file_name == "smoke-report.txt", "the delivery differs")
        return sent["delivery_id"]

    def retry_keeps_b(self) -> str:
        run, sid = need(self.b_run, "B's run"), need(self.sid, "the group session")
        self.client.end_run(run.run_id, "failed")
        retry = self.client.start_run(sid, trigger="retry")
        self.last_runtime.append(self.last_runtime_user())
        self.client.end_run(retry.run_id)
        expect(retry.runtime_user_id == self.b, f"the retry ran as {retry.runtime_user_id}, not B")
        wrong = [e.path for e in retry.skills.catalog if not e.path.startswith(f"{retry.workdir}/skills/")]
        expect(f"/runtime/{self.b}/" in retry.workdir and not wrong, "the retry's paths are not B's")
        expect(self.last_runtime[-1] == self.b, f"last_runtime_user_id {self.last_runtime[-1]} after the retry")
        return f"run {retry.run_id}"

    def a_speaks_again(self) -> str:
        sid, b_run = need(self.sid, "the group session"), need(self.b_run, "B's run")
        run = self.client.start_run(sid, trigger="group_message", speaker_user_id=self.a)
        self.a_run = run
        self.last_runtime.append(self.last_runtime_user())
        expect(run.runtime_user_id == self.a and f"/runtime/{self.a}/" in run.workdir, "A's run is not A's")
        wrong = [e.path for e in run.skills.catalog if not e.path.startswith(f"{run.workdir}/skills/")]
        expect(not wrong, f"A's catalog paths outside A's runtime dir: {wrong}")
        cli = f"{self.data_root(b_run)}/deps/{self.b}/npm/bin/orch-smoke-cli"
        result = self.tool(run, "read_file", path=cli)
        expect(not result.ok, "A can read B's CLI")
        return result.error.code if result.error else ""

    def last_runtime_follows(self) -> str:
        expect(len(self.last_runtime) == 4, f"not every turn ran: {self.last_runtime}")
        expected = [self.a, self.b, self.b, self.a]
        expect(self.last_runtime == expected, f"{self.last_runtime}, expected {expected}")
        return " → ".join(str(u) for u in self.last_runtime)

    def archive_for_owner_only(self) -> str:
        a_run, b_run = need(self.a_run, "A's run"), need(self.b_run, "B's run")
        expect(a_run.archive_hint_enabled and not b_run.archive_hint_enabled, "archive hints are not owner-only")
        a_entries = {e["name"] for e in self.ok(a_run, "list_dir", path=".")["entries"]}
        expect("compaction" in a_entries, "A's runtime dir has no compaction/ directory")
        b_entries = self.tool(a_run, "list_dir", path=b_run.workdir)
        expect(not b_entries.ok, "A can list B's runtime dir")
        self.client.end_run(a_run.run_id)
        return "A: hint + compaction/; B: neither"

    def private_chat_send(self) -> str:
        session = self.client.create_session(owner_user_id=self.b, channel="wechat", title="orchestrator smoke (wechat)")
        self.sessions.append(session.session_id)
        run = self.client.start_run(session.session_id, trigger="wechat")
        expect(run.runtime_user_id == self.b and run.prompt_identity_section is None, "wechat run is not B's own")
        self.ok(run, "shell", command=f"printf '{_printable(PNG)}' > wechat.png")
        published = self.ok(run, "publish_artifact", path="wechat.png")
        sent = self.ok(run, "send_image", path_or_url=published["path"])
        expect(self.client.fetch_delivery(sent["delivery_id"]).data == PNG, "the delivery differs")
        self.client.end_run(run.run_id)
        return sent["delivery_id"]

    def cleanup(self) -> str:
        deleted = 0
        for sid in self.sessions:
            for _ in range(20):
                try:
                    self.client.delete_session(sid)
                    deleted += 1
                    break
                except ApiError as exc:
                    if exc.code != "session_cleanup_pending":
                        raise
                    time.sleep(0.25)
        removed = ""
        if self.skill_created is not None:
            shutil.rmtree(self.skill_created, ignore_errors=True)
            removed = f", {SMOKE_SKILL} removed from the data dir"
        if self.skill_installed:
            self.client.delete_skill(SMOKE_SKILL)
            removed = f", {SMOKE_SKILL} removed through the admin API"
        expect(deleted == len(self.sessions), f"{len(self.sessions) - deleted} session(s) not deleted")
        return f"{deleted} session(s){removed}"


def run_smoke(client: OrchestratorClient, options: SmokeOptions, out: TextIO) -> int:
    return SmokeRun(client, options, out).run()
