"""Skills as MCP resources: `skill://{name}/{path}`.

The pure parts: building and parsing a resource URI (every piece validated before it becomes a
path: mounts/ids.py) and reading a SKILL.md's front matter. Listing and reading go through the
runtime user's sandbox (orchestrator/mcp/skill_reader.py), never through a host-side open.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

from mounts import ids

SCHEME = "skill"
# Front matter is the first lines of SKILL.md; more than this is not front matter.
FRONT_MATTER_MAX_LINES = 64
DESCRIPTION_MAX_CHARS = 1024


class BadSkillUri(ValueError):
    pass


@dataclass(frozen=True)
class SkillFile:
    skill: str
    path: str  # relative to the skill's directory, validated by ids.relative_path

    @property
    def uri(self) -> str:
        return f"{SCHEME}://{self.skill}/" + "/".join(quote(part, safe="") for part in self.path.split("/"))


def parse_uri(uri: str) -> SkillFile:
    """Pure: the skill file a `skill://{name}/{path}` URI names; BadSkillUri for anything else
    (another scheme, a bad skill name, `..`, an absolute or empty path, a query...)."""
    try:
        parts = urlsplit(uri)
    except ValueError as exc:
        raise BadSkillUri(f"not a URI: {exc}") from None
    if parts.scheme != SCHEME or parts.query or parts.fragment or "%2f" in parts.path.lower():
        raise BadSkillUri(f"a skill resource is {SCHEME}://{{name}}/{{path}}")
    try:
        name = ids.name(parts.netloc, "skill")
        path = ids.relative_path("/".join(unquote(p, errors="strict") for p in parts.path.removeprefix("/").split("/")))
    except (ids.InvalidIdentifier, UnicodeDecodeError) as exc:
        raise BadSkillUri(getattr(exc, "message", str(exc))) from None
    return SkillFile(name, path)


@dataclass(frozen=True)
class FrontMatter:
    name: str | None
    description: str | None
    template: str | None = None  # the sandbox template the skill needs (docs/templates.md)


def _scalar(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    return value


def front_matter(text: str) -> FrontMatter:
    """Pure: `name`, `description` and `template` of a SKILL.md's `---` front matter (plain or
    quoted one-line scalars, or a folded `>`/`|` block), None where missing. Not a YAML parser:
    a skill is written by anyone, and these keys are all a listing and the template rule use."""
    lines = text.splitlines()[: FRONT_MATTER_MAX_LINES + 2]
    if not lines or lines[0].strip() != "---":
        return FrontMatter(None, None)
    found: dict[str, str] = {}
    index = 1
    while index < len(lines) and lines[index].strip() != "---":
        line = lines[index]
        key, sep, value = line.partition(":")
        index += 1
        if not sep or line[:1].isspace() or key.strip() not in ("name", "description", "template"):
            continue
        value = value.strip()
        if value in (">", "|", ">-", "|-"):  # a block: the indented lines that follow
            block = []
            while index < len(lines) and (lines[index][:1].isspace() or not lines[index].strip()):
                block.append(lines[index].strip())
                index += 1
            value = (" " if value.startswith(">") else "\n").join(part for part in block if part)
        found[key.strip()] = _scalar(value)[:DESCRIPTION_MAX_CHARS]
    if index >= len(lines):  # never closed: not front matter
        return FrontMatter(None, None)
    return FrontMatter(found.get("name") or None, found.get("description") or None, found.get("template") or None)
