"""Bodies of the skills API (docs/skills.md). Unknown fields are refused (422)."""

from __future__ import annotations

import binascii
from base64 import b64decode

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.http.models import Body, FromRecord
from orchestrator.skills.admin import InstallReport


BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


class SkillFileIn(Body):
    """One file: exactly one of `text` (stored as UTF-8) or `base64`; `executable` sets the
    file's x bits (part of the skill's fingerprint)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                {"required": ["text"], "properties": {"text": {"type": "string"}, "base64": {"type": "null"}}},
                {
                    "required": ["base64"],
                    "properties": {"base64": {"type": "string", "pattern": BASE64_PATTERN}, "text": {"type": "null"}},
                },
            ]
        },
    )

    text: str | None = None
    base64: str | None = None
    executable: bool = Field(False, strict=True)

    @field_validator("text")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate from a JSON escape
                raise ValueError("not valid Unicode text (a lone surrogate); send bytes as base64") from None
        return value

    @field_validator("base64")
    @classmethod
    def _base64(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("not valid base64 (RFC 4648, standard alphabet, padded)") from None
        return value

    @model_validator(mode="after")
    def _one_content(self) -> SkillFileIn:
        if (self.text is None) == (self.base64 is None):
            raise ValueError("give exactly one of text or base64")
        return self

    def content(self) -> bytes:
        if self.text is not None:
            return self.text.encode("utf-8")
        assert self.base64 is not None
        return b64decode(self.base64, validate=True)


class SkillPut(Body):
    """A whole skill: relative path -> file (or a string, short for `{"text": ...}`).
    Directories follow from the paths; a top-level `SKILL.md` is required."""

    files: dict[str, SkillFileIn] = Field(
        ...,
        description="relative path -> {text | base64, executable}; a plain string is short for {text: ...}",
        json_schema_extra={
            "required": ["SKILL.md"],
            "additionalProperties": {"anyOf": [{"$ref": "#/components/schemas/SkillFileIn"}, {"type": "string"}]},
        },
    )

    @field_validator("files", mode="before")
    @classmethod
    def _text_shorthand(cls, files: object) -> object:
        # Before validation, so errors name `files.{path}.base64`, not a union branch.
        if isinstance(files, dict):
            return {path: {"text": f} if isinstance(f, str) else f for path, f in files.items()}
        return files

    def package_files(self) -> dict[str, tuple[bytes, bool]]:
        return {path: (file.content(), file.executable) for path, file in self.files.items()}


class SkillEntryOut(FromRecord):
    path: str
    kind: str  # dir | file | symlink
    executable: bool = False
    size: int = 0
    sha256: str | None = None
    target: str | None = None

    @field_validator("sha256", "target", mode="before")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        # The manifest says "" for "none" (a directory has no digest, a file no link target).
        return value or None


class SkillOut(FromRecord):
    name: str
    kind: str
    user_id: int | None
    path: str
    valid: bool
    fingerprint: str | None
    problem: str | None
    files: int
    bytes: int


class SkillDetailOut(SkillOut):
    entries: list[SkillEntryOut]


class IgnoredEntryOut(BaseModel):
    name: str
    reason: str


class SkillListOut(FromRecord):
    skills: list[SkillOut]
    ignored: list[IgnoredEntryOut]

    @field_validator("ignored", mode="before")
    @classmethod
    def _pairs(cls, ignored: object) -> object:
        # The listing keeps (entry name, why it is not a skill) pairs.
        if isinstance(ignored, (list, tuple)):
            return [dict(zip(("name", "reason"), e)) if isinstance(e, tuple) else e for e in ignored]
        return ignored


class SkillInstalledOut(SkillOut):
    created: bool
    changed: bool
    previous_fingerprint: str | None


class SkillRemovedOut(BaseModel):
    name: str
    kind: str
    user_id: int | None
    removed: bool
    previous_fingerprint: str | None


def installed_out(report: InstallReport) -> SkillInstalledOut:
    """The installed skill's summary and what the install changed."""
    return SkillInstalledOut(
        **SkillOut.model_validate(report.skill).model_dump(),
        created=report.created,
        changed=report.changed,
        previous_fingerprint=report.previous_fingerprint,
    )
