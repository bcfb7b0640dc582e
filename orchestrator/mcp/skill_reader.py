"""Listing and reading a run's skills as MCP resources, in the runtime user's sandbox.

Everything goes through the dispatcher as ordinary sandbox tool calls of the run (list_dir,
glob_search, read_bytes), so the host never opens a path inside the sandbox-writable runtime
directory: the sandbox agent's PathSandbox resolves every path as the runtime user, and each
read is audited and bounded like a model's. The session's `skills/` holds exactly the skills
the run may use (a failed skill is never linked), so a failed skill is absent here too.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from mounts import ids
from orchestrator.mcp.bounded_call import dispatch_whole
from orchestrator.mcp.skill_resources import FRONT_MATTER_MAX_LINES, BadSkillUri, SkillFile, front_matter, parse_uri
from orchestrator.runs.records import RunRecord

SKILLS_DIR = "skills"  # relative to the run's working directory
SKILL_DOC = "SKILL.md"
RESOURCE_NOT_FOUND = -32002
# Bounds of one listing: a skill with more files than this lists its first ones.
FILES_PER_SKILL_MAX = 200
SKILLS_MAX = 100


class SkillReader:
    def __init__(self, dispatcher: Any) -> None:
        self._dispatcher = dispatcher

    async def _tool(self, run: RunRecord, name: str, actor: str, **arguments: Any) -> dict[str, Any]:
        outcome = await dispatch_whole(self._dispatcher, run.run_id, name, arguments, tool_call_id=None, actor=actor)
        return outcome.body()

    async def list(self, run: RunRecord, *, actor: str) -> list[types.Resource]:
        listing = await self._tool(run, "list_dir", actor, path=SKILLS_DIR)
        if not listing["ok"]:
            return []  # no skills directory: no skills
        resources: list[types.Resource] = []
        for entry in listing["result"]["entries"][:SKILLS_MAX]:
            try:
                name = ids.name(entry["name"], "skill")
            except ids.InvalidIdentifier:
                continue  # not a skill link (the sandbox may write anything into its runtime dir)
            resources.extend(await self._skill_files(run, name, actor))
        return resources

    async def _skill_files(self, run: RunRecord, name: str, actor: str) -> list[types.Resource]:
        root = f"{SKILLS_DIR}/{name}"
        # The front matter's lines only: the sandbox may plant a huge SKILL.md of its own, and a
        # listing must not read it whole (read_file bounds a line's and an answer's size too).
        doc = await self._tool(run, "read_file", actor, path=f"{root}/{SKILL_DOC}", limit=FRONT_MATTER_MAX_LINES + 2)
        if not doc["ok"]:
            return []  # no SKILL.md: not a skill
        meta = front_matter(str(doc["result"].get("content", "")))
        found = await self._tool(run, "glob_search", actor, pattern="**", path=root)
        shown_root = found["result"]["path"].rstrip("/") + "/" if found["ok"] else ""
        paths = [SKILL_DOC]
        for match in found["result"]["matches"] if found["ok"] else []:
            relative = match.removeprefix(shown_root) if shown_root and match.startswith(shown_root) else None
            try:
                relative = ids.relative_path(relative, "path") if relative else None
            except ids.InvalidIdentifier:
                relative = None
            if relative and relative != SKILL_DOC and len(paths) < FILES_PER_SKILL_MAX:
                paths.append(relative)
        resources = []
        for path in paths:
            file = SkillFile(name, path)
            is_doc = path == SKILL_DOC
            resources.append(
                types.Resource(
                    uri=file.uri,
                    name=f"{name}/{path}",
                    title=(meta.name or name) if is_doc else None,
                    description=meta.description if is_doc else f"a file of the skill {name}",
                    mime_type=_media_type(path),
                )
            )
        return resources

    async def read(self, run: RunRecord, uri: str, *, actor: str) -> types.ReadResourceResult:
        try:
            file = parse_uri(uri)
        except BadSkillUri as exc:
            raise MCPError(types.INVALID_PARAMS, f"{uri!r} is not a skill resource: {exc}") from None
        answer = await self._tool(run, "read_bytes", actor, path=f"{SKILLS_DIR}/{file.skill}/{file.path}")
        if not answer["ok"]:
            error = answer["error"]
            raise MCPError(RESOURCE_NOT_FOUND, error.get("message", "cannot read the resource"), data=error)
        data = _decoded(answer["result"])
        media_type = _media_type(file.path)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            blob = base64.b64encode(data).decode("ascii")
            return types.ReadResourceResult(
                contents=[types.BlobResourceContents(uri=file.uri, mime_type=media_type or "application/octet-stream", blob=blob)]
            )
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=file.uri, mime_type=media_type, text=text)])


def _decoded(result: dict[str, Any]) -> bytes:
    try:
        return base64.b64decode(result.get("content_base64", ""), validate=True)
    except (binascii.Error, ValueError):
        return b""


def _media_type(path: str) -> str | None:
    if path.endswith(".md"):
        return "text/markdown"
    return mimetypes.guess_type(path)[0]
