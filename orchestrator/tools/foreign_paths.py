"""The host's lexical pre-check of foreign paths (docs/hosttools.md).

Before a host tool asks a sandbox for bytes, it classifies the path here. A path inside
another member's `uploads/{uid}/` gets an error that carries the file's public URL, and a path
inside another member's `runtime/{uid}/` an error that says there is none, identically for the
docker and the process backend: the sandbox would refuse both without being able to name the
URL (it cannot know the public origin). Pure: values in, a decision out, no disk.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from urllib.parse import quote

from mounts import ids

FOREIGN_UPLOAD = "foreign_upload_path"
FOREIGN_RUNTIME = "foreign_runtime_path"


@dataclass(frozen=True)
class ForeignPath:
    code: str  # foreign_upload_path | foreign_runtime_path
    owner_user_id: int  # whose directory the path is in
    path: str  # the absolute, lexically normalized path
    public_url: str | None  # only for a file directly in uploads/{owner}/


def absolute_path(path: str, workdir: str) -> str:
    """`path` made absolute against the run's workdir and normalized lexically (no disk)."""
    joined = path if posixpath.isabs(path) else posixpath.join(workdir, path)
    normalized = posixpath.normpath(joined)
    # POSIX keeps a leading "//" as is; it names the same place as "/".
    return "/" + normalized.lstrip("/")


def public_upload_url(public_base_url: str, owner_user_id: int, file_name: str) -> str:
    return f"{public_base_url.rstrip('/')}/uploads/{owner_user_id}/{quote(file_name, safe='')}"


def _area_owner(parts: list[str], data_parts: list[str], area: str) -> tuple[int, list[str]] | None:
    """(X, rest) when `parts` is `{data}/{area}/{X}/rest...` with X a valid user id."""
    n = len(data_parts)
    if len(parts) <= n + 1 or parts[:n] != data_parts or parts[n] != area:
        return None
    owner = parts[n + 1]
    if not (owner.isascii() and owner.isdigit()) or (len(owner) > 1 and owner.startswith("0")):
        return None  # "007" is not user 7's directory: the layout writes ids without zeros
    try:
        return ids.user_id(int(owner)), parts[n + 2 :]
    except ids.InvalidIdentifier:
        return None


def classify_foreign_path(
    path: str, *, workdir: str, data_root: str, runtime_user_id: int, public_base_url: str
) -> ForeignPath | None:
    """None when the path is not in another user's runtime or uploads directory (the sandbox
    then decides, with its own checks); otherwise what kind of foreign path it is."""
    absolute = absolute_path(path, workdir)
    parts = [p for p in absolute.split("/") if p]
    data_parts = [p for p in posixpath.normpath(data_root).split("/") if p]
    upload = _area_owner(parts, data_parts, "uploads")
    if upload is not None and upload[0] != runtime_user_id:
        owner, rest = upload
        url = None
        if len(rest) == 1:  # GET /uploads/{uid}/{file} serves files directly in the directory
            try:
                url = public_upload_url(public_base_url, owner, ids.file_name(rest[0]))
            except ids.InvalidIdentifier:
                url = None
        return ForeignPath(FOREIGN_UPLOAD, owner, absolute, url)
    runtime = _area_owner(parts, data_parts, "runtime")
    if runtime is not None and runtime[0] != runtime_user_id:
        return ForeignPath(FOREIGN_RUNTIME, runtime[0], absolute, None)
    return None


def foreign_path_message(found: ForeignPath, runtime_user_id: int, *, tool: str) -> str:
    """The words a model reads: what happened, and what it can do instead."""
    if found.code == FOREIGN_UPLOAD and found.public_url is not None:
        if tool == "publish_artifact":
            then = f"it is already published; use its public URL: {found.public_url}"
        else:
            then = f"this file has a public URL, pass this URL to {tool} instead: {found.public_url}"
        return (
            "This file belongs to another member's artifacts directory "
            f"(current runtime identity {runtime_user_id}); its local path is not readable here, but "
            + then
        )
    if found.code == FOREIGN_UPLOAD:
        return (
            "This path is in another member's artifacts directory "
            f"(current runtime identity {runtime_user_id}); it is not readable here and has no public "
            "URL (only files directly inside uploads/{uid}/ have one). Ask that member to send it: "
            f"{found.path}"
        )
    return (
        "This file belongs to another member's session runtime directory "
        f"(current runtime identity {runtime_user_id}); its local path is not readable here and it "
        "has no public URL. Ask that member to do it themselves, or regenerate it into a shared "
        f"place (the group workspace): {found.path}"
    )
