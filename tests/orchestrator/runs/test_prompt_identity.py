"""The prompt's runtime identity section: a pure rendering."""

from __future__ import annotations

from orchestrator.runs.prompt_identity import IdentityPromptFacts, render_identity_section

FACTS = IdentityPromptFacts(
    owner_user_id=17,
    owner_display_name="Alice",
    runtime_user_id=67,
    runtime_display_name="秦翌翔",
    uploads_root="/srv/data/uploads",
    public_base_url="https://bot.example.com/",
    group_workspace="/srv/data/groups/feishu/oc_1",
    share_dir="/srv/data/share",
)


def facts(**changes: object) -> IdentityPromptFacts:
    return IdentityPromptFacts(**{**FACTS.__dict__, **changes})


def test_no_section_when_the_runtime_user_is_the_owner_of_a_private_session() -> None:
    private = facts(runtime_user_id=17, runtime_display_name="Alice", group_workspace=None)
    assert render_identity_section(private) is None


def test_a_group_sessions_owner_run_says_whose_environment_and_who_speaks() -> None:
    owner_run = facts(runtime_user_id=17, runtime_display_name="Alice", speaker_user_id=67, speaker_display_name="Qin")
    section = render_identity_section(owner_run)
    assert section is not None
    lines = section.splitlines()
    assert lines[0] == "## Runtime identity"
    assert "user #17 Alice, the session owner" in lines[1] and "belong to the owner" in lines[1]
    assert "from user #67 Qin" in lines[2] and "not in this environment" in lines[2]
    assert "/srv/data/groups/feishu/oc_1" in lines[3]
    scheduled = render_identity_section(facts(runtime_user_id=17, runtime_display_name="Alice"))
    assert scheduled is not None and "This message is from" not in scheduled


def test_the_section_says_who_runs_who_owns_what_is_missing_the_url_mapping_and_the_limits() -> None:
    section = render_identity_section(FACTS)
    assert section is not None
    lines = section.splitlines()
    assert lines[0] == "## Runtime identity"
    assert "user #67 秦翌翔" in lines[1] and "sender of this message" in lines[1]
    assert "user #17 Alice" in lines[2]
    assert "personal skills" in lines[2] and "token caches" in lines[2] and "not in this environment" in lines[2]
    mapping = lines[3]
    assert "isolated per identity" in mapping
    assert (
        "publish_artifact as /srv/data/uploads/{uid}/{file} is publicly readable at "
        "https://bot.example.com/uploads/{uid}/{file}" in mapping
    )
    assert "send_file or send_image" in mapping and "the error will carry the URL" in mapping
    assert "/srv/data/groups/feishu/oc_1" in mapping and "/srv/data/share" in mapping
    assert "member's own account" in lines[4] and "trigger the bot themselves" in lines[4]


def test_without_display_names_and_without_a_group_workspace() -> None:
    section = render_identity_section(facts(owner_display_name=None, runtime_display_name=None, group_workspace=None))
    assert "user #67 (the sender" in section and "user #17 (who created" in section
    assert "groups/" not in section and "in /srv/data/share." in section
