"""The client SDK against a live server (real sockets, real process-backend agents)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest

from orchestrator import client as sdk
from orchestrator.client import OrchestratorClient
from orchestrator.http.app import create_app
from orchestrator.service import OrchestratorService
from orchestrator.templates.recipe import recipe_of
from tests.agent_env import agent_data_dir, traversable_tmp  # noqa: F401 - fixtures
from tests.conftest import ADMIN_TOKEN, API_TOKEN, make_settings
from tests.live_server import free_port, live_server

OWNER, MEMBER = 17, 67


@pytest.fixture
def server(agent_data_dir) -> Iterator[tuple[str, OrchestratorService]]:
    port = free_port()
    service = OrchestratorService(make_settings(agent_data_dir, public_base_url=f"http://127.0.0.1:{port}"))
    with live_server(create_app(service), port) as base:
        yield base, service


@pytest.fixture
def bot(server) -> Iterator[OrchestratorClient]:
    with OrchestratorClient(server[0], token=API_TOKEN, admin_token=ADMIN_TOKEN) as client:
        yield client


def test_a_bot_loop_with_tools_deliveries_and_public_uploads(bot: OrchestratorClient) -> None:
    assert bot.health().status == "ok"
    bot.put_user(MEMBER, display_name="Qin")
    session = bot.create_session(owner_user_id=OWNER, channel="feishu_group", group=("feishu", "oc_sdk"))
    bot.append_messages(session.session_id, [{"role": "user", "content": "hi", "speaker_user_id": MEMBER}])
    run = bot.start_run(session.session_id, trigger="group_message", speaker_user_id=MEMBER)
    assert run.runtime_user_id == MEMBER and "Qin" in (run.prompt_identity_section or "")
    assert bot.call_tool(run.run_id, "write_file", {"path": "r.txt", "content": "result\n"}).ok
    sent = bot.call_tool(run.run_id, "send_file", {"path_or_url": "r.txt"}, tool_call_id="call-1").raise_for_error()
    delivery = bot.fetch_delivery(sent.result["delivery_id"])
    assert delivery.data == b"result\n" and delivery.file_name == "r.txt" and delivery.kind == "file"
    assert delivery.sha256 == hashlib.sha256(b"result\n").hexdigest()
    assert [d.delivery_id for d in bot.list_deliveries(run.run_id)] == [delivery.delivery_id]
    published = bot.call_tool(run.run_id, "publish_artifact", {"path": "r.txt"}).raise_for_error().result
    assert bot.fetch_upload(published["url"]) == b"result\n"
    bot.delete_delivery(delivery.delivery_id)
    with pytest.raises(sdk.NotFoundError):
        bot.fetch_delivery(delivery.delivery_id)
    assert bot.end_run(run.run_id).status == "succeeded"
    assert bot.get_session(session.session_id).last_runtime_user_id == MEMBER
    assert {t.name for t in bot.list_tools()} >= {"send_file", "send_image", "publish_artifact", "dump_user_messages"}


def test_tool_failures_are_results_until_raised(bot: OrchestratorClient, server) -> None:
    session = bot.create_session(owner_user_id=OWNER, channel="web")
    run = bot.start_run(session.session_id, trigger="web")
    result = bot.call_tool(run.run_id, "send_file", {"path_or_url": f"{server[1].layout.root}/uploads/5/a.png"})
    assert result.ok is False and result.error.code == "foreign_upload_path"
    assert result.error.details["url"].endswith("/uploads/5/a.png")
    assert result.body["error"]["url"] == result.error.details["url"]
    with pytest.raises(sdk.ToolCallFailed) as failed:
        result.raise_for_error()
    assert failed.value.code == "foreign_upload_path" and failed.value.details["url"] == result.error.details["url"]


def test_http_errors_are_typed_exceptions_with_the_structured_error(bot: OrchestratorClient, server) -> None:
    base, service = server
    with pytest.raises(sdk.NotFoundError) as missing:
        bot.get_session("no-such-session")
    assert missing.value.status == 404 and missing.value.code == "not_found"
    with pytest.raises(sdk.InvalidRequestError) as invalid:
        bot.create_session(owner_user_id=OWNER, channel="web", session_id="../x")
    assert invalid.value.field == "session_id"
    session = bot.create_session(owner_user_id=OWNER, channel="web")
    with pytest.raises(sdk.ConflictError):
        bot.create_session(owner_user_id=OWNER, channel="web", session_id=session.session_id)
    with OrchestratorClient(base, token="wrong") as stranger, pytest.raises(sdk.UnauthorizedError):
        stranger.get_session(session.session_id)
    with OrchestratorClient(base, token=API_TOKEN) as plain_bot, pytest.raises(sdk.ForbiddenError):
        plain_bot.get_runtime_identity()
    assert bot.set_runtime_identity("owner").mode == "owner"
    assert bot.get_runtime_identity().source == "admin"
    changes = bot.audit(action="runtime_identity.change")
    assert len(changes) == 1 and changes[0]["actor"] == "admin"
    run = bot.start_run(session.session_id, trigger="web")
    assert bot.call_tool(run.run_id, "write_file", {"path": "x.txt", "content": "x"}).ok
    delivery_id = bot.call_tool(run.run_id, "send_file", {"path_or_url": "x.txt"}).result["delivery_id"]
    with service.store.write() as tx:  # let it expire
        tx.execute("UPDATE deliveries SET expires_at = '2000-01-01T00:00:00+00:00'")
    with pytest.raises(sdk.GoneError) as gone:
        bot.fetch_delivery(delivery_id)
    assert gone.value.details["expired_at"].startswith("2000")
    with OrchestratorClient(f"http://127.0.0.1:{free_port()}", token=API_TOKEN) as nowhere, pytest.raises(sdk.TransportError):
        nowhere.health()


def test_client_models_match_the_servers_openapi(server) -> None:
    schemas = create_app(server[1]).openapi()["components"]["schemas"]
    pairs = {
        sdk.Session: "SessionOut",
        sdk.RunContext: "RunContextOut",
        sdk.Run: "RunOut",
        sdk.User: "UserOut",
        sdk.ProjectSettings: "ProjectSettingsOut",
        sdk.Messages: "MessagesOut",
        sdk.Appended: "AppendOut",
        sdk.SessionDeleted: "DeletedOut",
        sdk.Delivery: "DeliveryOut",
        sdk.IdentityModeState: "IdentityModeOut",
        sdk.Skill: "SkillOut",
        sdk.SkillDetail: "SkillDetailOut",
        sdk.SkillEntry: "SkillEntryOut",
        sdk.SkillList: "SkillListOut",
        sdk.SkillInstalled: "SkillInstalledOut",
        sdk.SkillRemoved: "SkillRemovedOut",
        sdk.AdminUser: "AdminUserOut",
        sdk.AdminUserPage: "AdminUsersOut",
        sdk.AdminRun: "AdminRunOut",
        sdk.SandboxAction: "SandboxActionOut",
        sdk.UserResources: "ResourcesOut",
        sdk.UserPurged: "PurgeOut",
    }
    for model, schema in pairs.items():
        server_fields = set(schemas[schema]["properties"])
        assert set(model.model_fields) <= server_fields, (model.__name__, set(model.model_fields) - server_fields)
        assert set(schemas[schema].get("required", [])) <= set(model.model_fields) | {"transcript_turns", "fetch"}, schema


def test_skills_through_the_sdk(bot: OrchestratorClient, server, tmp_path) -> None:
    local = tmp_path / "report-skill"
    (local / "scripts").mkdir(parents=True)
    (local / "SKILL.md").write_text("# report\n")
    (local / "scripts" / "make.sh").write_text("#!/bin/sh\necho report\n")
    (local / "scripts" / "make.sh").chmod(0o755)
    (local / "logo.png").write_bytes(b"\x89PNG\x00\xff")
    files = sdk.skill_files_from_dir(local)
    assert files["scripts/make.sh"].executable and files["logo.png"].content == b"\x89PNG\x00\xff"

    installed = bot.put_skill("report", files)
    assert installed.created and installed.valid and installed.files == 3
    detail = bot.get_skill("report")
    assert {e.path: e.executable for e in detail.entries if e.kind == "file"} == {
        "SKILL.md": False, "logo.png": False, "scripts/make.sh": True,
    }
    assert server[1].layout.skill_source("report").joinpath("logo.png").read_bytes() == b"\x89PNG\x00\xff"
    assert bot.list_skills().names == ["report"]
    again = bot.put_skill("report", {"SKILL.md": "# report v2\n", "run": sdk.SkillFile(content="x", executable=True)})
    assert again.changed and again.previous_fingerprint == installed.fingerprint
    assert bot.delete_skill("report").previous_fingerprint == again.fingerprint
    with pytest.raises(sdk.NotFoundError):
        bot.get_skill("report")
    with pytest.raises(sdk.InvalidRequestError) as invalid:
        bot.put_skill("report", {"../up": "x", "SKILL.md": "x"})
    assert invalid.value.field == "files.../up"

    personal = bot.put_personal_skill(MEMBER, "mine", {"SKILL.md": "# mine\n"})
    assert personal.kind == "personal" and personal.user_id == MEMBER
    assert bot.list_personal_skills(MEMBER).names == ["mine"]
    assert bot.get_personal_skill(MEMBER, "mine").entries[0].path == "SKILL.md"
    assert bot.delete_personal_skill(MEMBER, "mine").removed
    with OrchestratorClient(server[0], token=API_TOKEN) as plain_bot, pytest.raises(sdk.ForbiddenError):
        plain_bot.put_skill("report", {"SKILL.md": "x"})  # system skills need the admin token

    (local / "link").symlink_to("SKILL.md")
    with pytest.raises(ValueError, match="link"):
        sdk.skill_files_from_dir(local)


def test_templates_of_groups_and_runs_through_the_client(server, bot: OrchestratorClient) -> None:
    _, service = server
    recipe = recipe_of(name="team", apt=["figlet"])
    service.templates.repo.put_recipe("team", recipe)  # as a finished build leaves it (no engine needed)
    service.templates.repo.finish("team", recipe, image="sandbox-orchestrator/template:team", recipe_hash="0" * 64,
                                  log="", error=None)  # fmt: skip
    assert bot.set_group_template("feishu", "oc_sdk", "team").template == "team"
    assert bot.get_group_template("feishu", "oc_sdk").template == "team"
    session = bot.create_session(owner_user_id=OWNER, channel="feishu_group", group=("feishu", "oc_sdk"))
    run = bot.start_run(session.session_id, trigger="web")
    assert run.template is not None and (run.template.name, run.template.source) == ("team", "group")
    with pytest.raises(sdk.ForbiddenError) as refused:
        bot.start_run(session.session_id, trigger="web", template="team")
    assert refused.value.code == "template_not_requestable"
    service.templates.set_requestable("team", True)
    asked = bot.start_run(session.session_id, trigger="web", template="team")
    assert asked.template is not None and asked.template.source == "run"
    assert bot.set_group_template("feishu", "oc_sdk", None).template == "default"


def test_the_admins_hand_on_users_through_the_client(server, bot: OrchestratorClient) -> None:
    session = bot.create_session(owner_user_id=OWNER, channel="web")
    run = bot.start_run(session.session_id, trigger="web")
    assert bot.call_tool(run.run_id, "write_file", {"path": "a.txt", "content": "x"}).ok
    listed = bot.admin_users(backend="process", state="running")
    assert [u.user_id for u in listed.users] == [OWNER] and listed.users[0].state == "running"
    assert [r.run_id for r in bot.admin_runs(state="active", user_id=OWNER).runs] == [run.run_id]
    assert bot.admin_sandbox_action(OWNER, "stop") == sdk.SandboxAction(user_id=OWNER, state="stopped")
    grown = bot.set_user_resources(OWNER, cpus=0.5, memory_mb=256)
    assert (grown.cpus, grown.memory_mb, grown.override) == (0.5, 256, True)
    assert bot.get_user_resources(OWNER) == grown
    with pytest.raises(sdk.InvalidRequestError):
        bot.purge_user(OWNER, confirm_user_id=OWNER + 1)
    purged = bot.purge_user(OWNER, confirm_user_id=OWNER)
    assert purged.purged and purged.sessions_deleted == [session.session_id]
    with pytest.raises(sdk.GoneError) as gone:
        bot.get_user(OWNER)
    assert gone.value.code == "user_purged"
