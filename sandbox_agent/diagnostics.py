"""Identity diagnostics: a pure decision, used only after the
PathSandbox refused a path, so the model learns *why* and what it can do instead."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

FOREIGN_RUNTIME = "foreign_runtime_path"
FOREIGN_UPLOAD = "foreign_upload_path"
PATH_ESCAPE = "path_escape"


@dataclass(frozen=True)
class PathDiagnosis:
    code: str
    message: str


def _owner_of(parts: list[str], data_parts: list[str], area: str) -> int | None:
    """The user id X when `parts` is under `{data}/{area}/{X}`, else None."""
    n = len(data_parts)
    if len(parts) > n + 1 and parts[:n] == data_parts and parts[n] == area:
        owner = parts[n + 1]
        if owner.isascii() and owner.isdigit():
            return int(owner)
    return None


def classify_foreign_path(path: str, data_root: str, user_id: int, *, shown: str | None = None) -> PathDiagnosis:
    """Classify a refused absolute `path` (lexically normalized here) for user `user_id`.

    `shown` is the path quoted in the message (default: `path`)."""
    shown = path if shown is None else shown
    parts = [p for p in posixpath.normpath(path).split("/") if p]
    data_parts = [p for p in posixpath.normpath(data_root).split("/") if p]
    owner = _owner_of(parts, data_parts, "runtime")
    if owner is not None and owner != user_id:
        return PathDiagnosis(
            FOREIGN_RUNTIME,
            "This path belongs to another user's session runtime directory "
            f"(current runtime identity {user_id}); it is not accessible here: {shown}",
        )
    owner = _owner_of(parts, data_parts, "uploads")
    if owner is not None and owner != user_id:
        # No URL here: the sandbox cannot know the public origin.
        return PathDiagnosis(
            FOREIGN_UPLOAD,
            "This file belongs to another member's artifacts directory "
            f"(current runtime identity {user_id}); it is not accessible here. To forward it, "
            f"ask that member to do it, or use its public URL: {shown}",
        )
    return PathDiagnosis(PATH_ESCAPE, f"Path escape attempt: {shown}")


def diagnose(requested: str, escaped_at: str | None, data_root: str, user_id: int) -> PathDiagnosis:
    """The requested path decides first; when it alone looks harmless (e.g. a symlink inside
    the user's own runtime dir), the place the resolution actually left the roots decides."""
    first = classify_foreign_path(requested, data_root, user_id)
    if first.code != PATH_ESCAPE or escaped_at is None:
        return first
    return classify_foreign_path(escaped_at, data_root, user_id, shown=requested)


SYMLINK_ESCAPE = "symlink_escape"


def shared_place(root_path: str, purpose: str) -> str:
    """How a shared root is named to the model."""
    if purpose.startswith("group:"):
        return f"the group workspace {root_path}"
    return f"the shared directory {root_path}"


def shared_link_escape(requested: str, root_path: str, purpose: str, target: str) -> PathDiagnosis:
    """A symbolic link found in a shared directory points out of it (issue 12, item 7). Any
    member can plant links there, so they are followed only within that directory."""
    return PathDiagnosis(
        SYMLINK_ESCAPE,
        f"This path goes through a symbolic link in {shared_place(root_path, purpose)} that leads "
        f"outside it (to {target}). Links in a shared directory are followed only within that "
        "directory, because every member can create them; this one was not followed and nothing "
        f"was read or written through it: {requested}",
    )
