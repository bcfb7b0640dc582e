"""Validation of every identifier that may end up in a filesystem path.

Nothing in the project joins an id into a path without passing it through one of these
functions first (a bad id is a clear 422, never a path).
"""

from __future__ import annotations

import re

# A user's sandbox runs as uid = base + user id; keep the sum inside 31 bits.
MAX_USER_ID = 1_000_000_000

_SESSION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_PROJECT_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
_CHAT_ID = re.compile(r"[A-Za-z0-9_@:=+-][A-Za-z0-9._@:=+-]{0,127}")
_FINGERPRINT = re.compile(r"[0-9a-f]{64}")
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_TOKEN = re.compile(r"[0-9a-f]{8,64}")
# A chat platform's name (`slack`, `feishu_group`, a company's own) and a person's id on it.
# External ids are opaque: bounded, printable, no `/`, NUL or whitespace, and never part of a path.
_PLATFORM = re.compile(r"[a-z][a-z0-9_-]{0,31}")
MAX_EXTERNAL_ID_CHARS = 128
_EXTERNAL_ID = re.compile(r"[!-.0-~]{1,128}")  # printable ASCII (0x21-0x7e) but '/'
# The same rules as anchored JSON Schema patterns, so the OpenAPI document states them.
SESSION_ID_PATTERN = r"^(?!\.\.?$)" + _SESSION_ID.pattern + "$"
PROJECT_ID_PATTERN = r"^(?!\.\.?$)" + _PROJECT_ID.pattern + "$"
NAME_PATTERN = "^" + _NAME.pattern + "$"
CHAT_ID_PATTERN = "^" + _CHAT_ID.pattern + "$"
PLATFORM_PATTERN = "^" + _PLATFORM.pattern + "$"
EXTERNAL_ID_PATTERN = r"^(?!\.\.?$)" + "[!-.0-~]{1,128}$"
# `{platform}:{external id}` where a user id may stand (a path segment, X-Acting-User).
PERSON_PATTERN = r"^[a-z][a-z0-9_-]{0,31}:(?!\.\.?$)[!-.0-~]{1,128}$"
PERSON_MAX_CHARS = 32 + 1 + 128
MAX_PATH_COMPONENT_BYTES = 255  # NAME_MAX
MAX_RELATIVE_PATH_BYTES = 1024
MAX_RELATIVE_PATH_DEPTH = 32


class InvalidIdentifier(ValueError):
    """An identifier failed validation; `field` names it for the 422 answer."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def _require_str(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidIdentifier(field, f"{field} must be a string")
    return value


def user_id(value: object, field: str = "user_id") -> int:
    # bool is an int subclass: True must not become user 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidIdentifier(field, f"{field} must be a positive integer")
    if not 0 < value <= MAX_USER_ID:
        raise InvalidIdentifier(field, f"{field} must be between 1 and {MAX_USER_ID}")
    return value


def session_id(value: object, field: str = "session_id") -> str:
    text = _require_str(field, value)
    # "." and ".." match the character class but would name a parent directory.
    if not _SESSION_ID.fullmatch(text) or text in (".", ".."):
        raise InvalidIdentifier(
            field, f"{field} must be 1-128 characters of A-Z a-z 0-9 . _ : - and not '.' or '..'"
        )
    return text


def project_id(value: object, field: str = "project_id") -> str:
    text = _require_str(field, value)
    if not _PROJECT_ID.fullmatch(text) or text in (".", ".."):
        raise InvalidIdentifier(field, f"{field} must be 1-64 characters of A-Z a-z 0-9 . _ -")
    return text


def name(value: object, field: str = "name") -> str:
    """A skill name, agent id or group channel: a single safe path component."""
    text = _require_str(field, value)
    if not _NAME.fullmatch(text):
        raise InvalidIdentifier(
            field, f"{field} must be 1-64 characters of A-Z a-z 0-9 . _ - not starting with '.' or '-'"
        )
    return text


def chat_id(value: object, field: str = "chat_id") -> str:
    text = _require_str(field, value)
    if not _CHAT_ID.fullmatch(text):
        raise InvalidIdentifier(
            field, f"{field} must be 1-128 characters of A-Z a-z 0-9 . _ @ : = + - not starting with '.'"
        )
    return text


def platform(value: object, field: str = "platform") -> str:
    """A chat platform or channel name: `slack`, `feishu_group`, `acme-chat`."""
    text = _require_str(field, value)
    if not _PLATFORM.fullmatch(text):
        raise InvalidIdentifier(
            field, f"{field} must be 1-32 characters of a-z 0-9 _ - starting with a letter (e.g. slack, feishu)"
        )
    return text


def external_id(value: object, field: str = "external_id") -> str:
    """A person's id on a chat platform (Slack's `U024BE7LH`, Feishu's `ou_...`): opaque text
    that only ever names a row, never a path. Printable ASCII without `/` or spaces: every
    platform's ids fit, and the rule is exactly the documented pattern."""
    text = _require_str(field, value)
    if not _EXTERNAL_ID.fullmatch(text) or text in (".", ".."):  # dots: a URL path would fold them
        raise InvalidIdentifier(
            field,
            f"{field} must be 1-{MAX_EXTERNAL_ID_CHARS} printable ASCII characters without '/' or spaces, not '.' or '..'",
        )
    return text


def fingerprint(value: object, field: str = "fingerprint") -> str:
    text = _require_str(field, value)
    if not _FINGERPRINT.fullmatch(text):
        raise InvalidIdentifier(field, f"{field} must be 64 lowercase hex digits")
    return text


def file_name(value: object, field: str = "file") -> str:
    """A single file name inside a per-user directory (an upload's UUID name)."""
    text = _require_str(field, value)
    if not _FILE_NAME.fullmatch(text):
        raise InvalidIdentifier(
            field, f"{field} must be 1-128 characters of A-Z a-z 0-9 . _ - not starting with '.' or '-'"
        )
    return text


def token(value: object, field: str = "token") -> str:
    """A random hex token naming a staging or trash directory of the skill store."""
    text = _require_str(field, value)
    if not _TOKEN.fullmatch(text):
        raise InvalidIdentifier(field, f"{field} must be 8-64 lowercase hex digits")
    return text


def path_component(value: object, field: str = "path") -> str:
    """One component of a relative path inside a tree we write (a skill's files): printable
    text that names exactly one entry. Unicode is welcome (skills are written in many
    languages); separators, control characters, NUL, `.`/`..` and a leading `-` are not."""
    text = _require_str(field, value)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate from a JSON escape
        raise InvalidIdentifier(field, f"{field}: {text!r} is not valid UTF-8") from None
    if not 0 < size <= MAX_PATH_COMPONENT_BYTES:
        raise InvalidIdentifier(field, f"{field}: a path component must be 1-{MAX_PATH_COMPONENT_BYTES} bytes")
    if text in (".", ".."):
        raise InvalidIdentifier(field, f"{field}: '.' and '..' are not allowed")
    if "/" in text or "\\" in text or not text.isprintable():
        raise InvalidIdentifier(field, f"{field}: {text!r} holds a separator or a control character")
    if text[0] in "- " or text[-1] == " ":
        raise InvalidIdentifier(field, f"{field}: {text!r} may not start with '-' or a space, or end with a space")
    return text


def relative_path(value: object, field: str = "path") -> str:
    """A clean relative path (`scripts/run.sh`): no leading `/`, no empty, `.` or `..`
    component, every component valid by `path_component`; bounded length and depth."""
    text = _require_str(field, value)
    if text.startswith("/"):
        raise InvalidIdentifier(field, f"{field}: absolute paths are not allowed")
    parts = text.split("/")
    if len(parts) > MAX_RELATIVE_PATH_DEPTH:
        raise InvalidIdentifier(field, f"{field}: at most {MAX_RELATIVE_PATH_DEPTH} levels deep")
    for part in parts:
        if part == "":
            raise InvalidIdentifier(field, f"{field}: empty path component (a doubled or trailing '/')")
        path_component(part, field)
    if len(text.encode("utf-8")) > MAX_RELATIVE_PATH_BYTES:
        raise InvalidIdentifier(field, f"{field}: at most {MAX_RELATIVE_PATH_BYTES} bytes")
    return text
