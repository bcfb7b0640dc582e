"""The prompt's runtime identity section (docs/bots.md says where a bot puts it).

Rendered when the runtime user is not the session owner, and in every run of a group chat's
session (the model must know who is speaking and whose environment it is in, whoever that
is); a private session's owner run has none, so its prompt prefix does not change by a byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.templates.choice import RunTemplate


@dataclass(frozen=True)
class DelegatedCredential:
    """A credential another member granted to this run's session and runtime user (its
    metadata only: the secret never reaches a run)."""

    credential: str
    owner_user_id: int
    owner_display_name: str | None
    hosts: tuple[str, ...]
    expires_at: str
    grant_id: str


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
    speaker_user_id: int | None = None  # who sent this message, when the run has a speaker
    speaker_display_name: str | None = None
    delegated: tuple[DelegatedCredential, ...] = ()


def _who(user_id: int, display_name: str | None) -> str:
    return f"user #{user_id} {display_name}" if display_name else f"user #{user_id}"


def _delegated_lines(facts: IdentityPromptFacts) -> list[str]:
    lines = []
    for d in facts.delegated:
        hosts = ", ".join(d.hosts)
        lines.append(
            f"- Delegated credential `{d.credential}` of {_who(d.owner_user_id, d.owner_display_name)}, usable in this "
            f"session until {d.expires_at} for https://{hosts}: the egress proxy adds it to HTTPS requests to those hosts. "
            "Its value is never in this environment; do not ask for it, and use it only for what its owner asked."
        )
    return lines


def render_identity_section(facts: IdentityPromptFacts) -> str | None:
    """The section, with the delegated credentials this run may use (and a section of its own
    for them in a private session's owner run, which otherwise has none)."""
    base = _render_base(facts)
    delegated = _delegated_lines(facts)
    if not delegated:
        return base
    return "\n".join([base or "## Runtime identity", *delegated])


def _render_base(facts: IdentityPromptFacts) -> str | None:
    if facts.runtime_user_id == facts.owner_user_id:
        return _render_owner_runtime(facts) if facts.group_workspace else None
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


def _render_owner_runtime(facts: IdentityPromptFacts) -> str:
    """A group session's run in the owner's environment: who owns it, who is speaking."""
    owner = _who(facts.owner_user_id, facts.owner_display_name)
    lines = [
        "## Runtime identity",
        f"- Current runtime identity: {owner}, the session owner. The shell, files, skills, CLI "
        "tools and credentials in this run all belong to the owner.",
    ]
    if facts.speaker_user_id is not None and facts.speaker_user_id != facts.owner_user_id:
        speaker = _who(facts.speaker_user_id, facts.speaker_display_name)
        lines.append(
            f"- This message is from {speaker}, a member of the group chat. Their own files, skills "
            "and credentials are not in this environment; work done here is done as the owner."
        )
    lines.append(f"- Put results meant for the whole group in the group workspace {facts.group_workspace}.")
    return "\n".join(lines)


def render_template_section(template: RunTemplate) -> str | None:
    """Skills of the run that need a sandbox template this sandbox lacks (None when none does:
    the prompt does not change by a byte)."""
    if not template.lacking:
        return None
    lines = ["## Sandbox template", f"- This sandbox runs the template {template.choice.name!r}."]
    for skill, needed, why in template.lacking:
        lines.append(
            f"- The skill {skill!r} needs the template {needed!r}, which this sandbox lacks ({why}): "
            "tools it expects may be missing. Try it, and if it fails, tell the user an admin must "
            "give them that template."
        )
    return "\n".join(lines)
