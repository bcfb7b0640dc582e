"""Public artifacts: `GET /uploads/{uid}/{file}` (SPEC §7, §12) and this service's own upload
URLs, which the host serves from disk instead of fetching them over the network.

Reading never follows a symlink and never leaves `uploads/{uid}/`: the directories are opened
one component at a time with O_NOFOLLOW from the data root, the file relative to that
descriptor, and only a regular file is served. A user owns `uploads/{uid}/` and may plant
links or FIFOs there; the open is the check, so there is no window to race.
"""

from __future__ import annotations

import errno
import mimetypes
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from mounts import ids
from mounts.layout import DataLayout
from orchestrator.nofollow_fs import UnsafePath, closing_fd, open_dirs, open_root

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DEFAULT_PORTS = {"http": 80, "https": 443}

# Served inline; anything else (HTML, SVG, scripts...) is an attachment, so an uploaded page
# never runs as this origin.
INLINE_TYPES = frozenset(
    {
        "image/png",
        "image/jpeg",
        "image/gif",
        "image/webp",
        "image/bmp",
        "application/pdf",
        "text/plain",
        "text/csv",
        "application/json",
        "audio/mpeg",
        "audio/ogg",
        "audio/wav",
        "video/mp4",
        "video/webm",
    }
)


@dataclass(frozen=True)
class UploadRef:
    owner_user_id: int
    file_name: str


def upload_ref(user_id: object, file_name: object) -> UploadRef | None:
    """A validated reference, or None when either part could not name an upload."""
    try:
        return UploadRef(ids.user_id(user_id), ids.file_name(file_name))
    except ids.InvalidIdentifier:
        return None


def _origin(url: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        host = (parts.hostname or "").lower()
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:  # a malformed port
        return None
    if scheme not in _DEFAULT_PORTS or not host or port is None:
        return None
    return scheme, host, port


def is_own_origin(url: str, public_base_url: str) -> bool:
    own = _origin(public_base_url)
    return own is not None and _origin(url) == own


def own_upload_ref(url: str, public_base_url: str) -> UploadRef | None:
    """The upload a URL of this service names (`{base}/uploads/{uid}/{file}`), else None.

    Segments are split before they are decoded, so an encoded `/` or `..` stays inside one
    segment and fails validation instead of moving up a directory."""
    if not is_own_origin(url, public_base_url):
        return None
    base_path = urlsplit(public_base_url).path.rstrip("/")
    path = urlsplit(url).path
    prefix = f"{base_path}/uploads/"
    if not path.startswith(prefix):
        return None
    segments = path[len(prefix) :].split("/")
    if len(segments) != 2:
        return None
    owner, name = (unquote(s) for s in segments)
    if not (owner.isascii() and owner.isdigit()) or owner.startswith("0"):
        return None
    return upload_ref(int(owner), name)


def media_type_of(file_name: str) -> str:
    return mimetypes.guess_type(file_name)[0] or "application/octet-stream"


@dataclass(frozen=True)
class OpenedUpload:
    fd: int
    size: int
    media_type: str


def open_upload_fd(layout: DataLayout, ref: UploadRef) -> OpenedUpload | None:
    """The upload opened for reading (the caller closes `fd`), or None when there is no such
    regular file. A symlink, a FIFO, a directory or a hard link to a file of somebody else all
    count as "no such file": the public route says 404 and nothing more."""
    with closing_fd(open_root(layout.root)) as root_fd:
        try:
            dir_fd = open_dirs(root_fd, ["uploads", str(ref.owner_user_id)])
        except UnsafePath:  # uploads/{uid} itself swapped for a symlink
            return None
    if dir_fd is None:
        return None
    with closing_fd(dir_fd):
        try:
            fd = os.open(ref.file_name, _READ_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENOTDIR, errno.EACCES):
                return None
            raise
        try:
            info = os.fstat(fd)
            owner = os.fstat(dir_fd).st_uid
            # A hard link planted by the directory's owner to a file it does not own would
            # publish that file: only files of the directory's owner (or ours) are served.
            if not stat.S_ISREG(info.st_mode) or info.st_uid not in (owner, os.geteuid()):
                os.close(fd)
                return None
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
    return OpenedUpload(fd=fd, size=info.st_size, media_type=media_type_of(ref.file_name))


def read_upload(layout: DataLayout, ref: UploadRef, max_bytes: int) -> bytes | None:
    """The whole upload, or None when missing; raises `UploadTooLarge` above `max_bytes`."""
    opened = open_upload_fd(layout, ref)
    if opened is None:
        return None
    with closing_fd(opened.fd):
        if opened.size > max_bytes:
            raise UploadTooLarge(opened.size, max_bytes)
        chunks, total = [], 0
        while chunk := os.read(opened.fd, 1 << 20):
            total += len(chunk)
            if total > max_bytes:  # it grew while we read
                raise UploadTooLarge(total, max_bytes)
            chunks.append(chunk)
        return b"".join(chunks)


class UploadTooLarge(Exception):
    def __init__(self, size: int, max_bytes: int) -> None:
        super().__init__(f"{size} bytes > {max_bytes}")
        self.size = size
        self.max_bytes = max_bytes


def iter_fd(fd: int, chunk_size: int = 1 << 16) -> Iterator[bytes]:
    while chunk := os.read(fd, chunk_size):
        yield chunk
