"""The prompt's runtime identity section (docs/bots.md says where a bot puts it).

Rendered only when the runtime user is not the session owner, so an ordinary session's
prompt prefix does not change by a single byte.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IdentityPromptFacts:
    owner_user_id: int
    owner_display_name: str | None
    runtime_user_id: int
    runtime_display_name: str | None
    uploads_root: str  # host path of `uploads/`, as the sandbox sees it
    public_base_url: str
    group_workspace: str | None  # the group's shared workspace, when the session has one
    share_dir: str


def _who(user_id: int, display_name: str | None) -> str:
    return f"user #{user_id} {display_name}" if display_name else f"user #{user_id}"


def render_identity_section(facts: IdentityPromptFacts) -> str | None:
    if facts.runtime_user_id == facts.owner_user_id:
        return None
    runtime = _who(facts.runtime_user_id, facts.runtime_display_name)
    owner = _who(facts.owner_user_id, facts.owner_display_name)
    base = facts.public_base_url.rstrip("/")
    uploads = facts.uploads_root.rstrip("/")
    shared = f"the group workspace {facts.group_workspace} or {facts.share_dir}" if facts.group_workspace else facts.share_dir
    lines = [
        "## Runtime identity",
        f"- Current runtime identity: {runtime} (the sender of this message). The shell, files, "
        "skills, CLI tools and credentials in this run all belong to this identity.",
        f"- Session owner: {owner} (who created this session). The owner's personal skills, "
        "token caches and CLI dependencies are not in this environment: do not assume they are "
        "available and do not try to read the owner's runtime directory.",
        "- Artifacts are isolated per identity: another member's files under "
        f"{uploads}/{{uid}}/ or their runtime directory cannot be read here. A file published with "
        f"publish_artifact as {uploads}/{{uid}}/{{file}} is publicly readable at "
        f"{base}/uploads/{{uid}}/{{file}}, so you may pass another member's published upload path "
        "to send_file or send_image: the error will "
        f"carry the URL to use instead. Put results meant for the whole group in {shared}.",
        "- If a task must use a member's own account or credentials, ask that member to trigger "
        "the bot themselves, or tell the user that it needs that person to act.",
    ]
    return "\n".join(lines)
