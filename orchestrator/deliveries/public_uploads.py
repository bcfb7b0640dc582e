"""Public artifacts: `GET /uploads/{uid}/{file}` and this service's own upload
URLs, which the host serves from disk instead of fetching them over the network.

Only what the orchestrator published is public: the random names `publish_artifact` wrote are
recorded in the state DB (`published_uploads`), and a name the sandbox wrote into its uploads
dir itself is "no such upload". Reading never follows a symlink and never leaves
`uploads/{uid}/`: the directories are opened one component at a time with O_NOFOLLOW from the
data root, the file relative to that descriptor, and only a regular file with one link, owned
by that user's sandbox uid, is served. A user owns `uploads/{uid}/` and may plant links, hard
links or FIFOs there; the checks are made on the opened descriptor, so there is no window to
race.
"""

from __future__ import annotations

import errno
import io
import mimetypes
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from mounts import ids
from mounts.layout import DataLayout
from orchestrator.clock import now_iso
from mounts.fs.nofollow import UnsafePath, closing_fd, open_below, open_regular_at
from orchestrator.state_store import StateStore, Transaction
from orchestrator.users.dirs import UserDirectories

_DEFAULT_PORTS = {"http": 80, "https": 443}
COPY_CHUNK = 256 * 1024  # bytes of an upload read and written at a time

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


def open_upload_fd(layout: DataLayout, ref: UploadRef, *, owner_uid: int) -> OpenedUpload | None:
    """The upload opened for reading (the caller closes `fd`), or None when there is no such
    regular file of `owner_uid`. A symlink, a FIFO, a directory, a file of somebody else (root
    included) or a hard link all count as "no such file": the public route says 404 and
    nothing more."""
    try:
        dir_fd = open_below(layout.root, ["uploads", str(ref.owner_user_id)])
    except UnsafePath:  # uploads/{uid} itself swapped for a symlink
        return None
    if dir_fd is None:
        return None
    with closing_fd(dir_fd):
        # A hard link planted by the sandbox to a file it does not own (a root-owned one it
        # may write) would publish that file: only the user's own single-link files.
        try:
            fd = open_regular_at(dir_fd, ref.file_name, owner_uid=owner_uid)
        except UnsafePath:
            return None
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.EACCES):
                return None
            raise
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
    except BaseException:
        os.close(fd)
        raise
    return OpenedUpload(fd=fd, size=size, media_type=media_type_of(ref.file_name))


class PublishedUploads:
    """The uploads this service published, and the only ones it serves."""

    def __init__(self, store: StateStore, layout: DataLayout, directories: UserDirectories) -> None:
        self._store = store
        self._layout = layout
        self._directories = directories

    def _owner_uid(self, user_id: int) -> int:
        """Who owns a user's uploads: its sandbox uid (the server's own uid when not root)."""
        return self._directories.sandbox_uid(user_id) if self._directories.chown else os.geteuid()

    def record(self, ref: UploadRef) -> None:
        with self._store.write() as tx:
            tx.execute(
                "INSERT OR IGNORE INTO published_uploads (owner_user_id, file_name, published_at) VALUES (?, ?, ?)",
                (ref.owner_user_id, ref.file_name, now_iso()),
            )

    @staticmethod
    def forget_user_in(tx: Transaction, user_id: int) -> None:
        """Drop the user's published names in the caller's transaction (a purge's tombstone)."""
        tx.execute("DELETE FROM published_uploads WHERE owner_user_id = ?", (user_id,))

    def is_published(self, ref: UploadRef) -> bool:
        with self._store.read() as tx:
            row = tx.one(
                "SELECT 1 FROM published_uploads WHERE owner_user_id = ? AND file_name = ?",
                (ref.owner_user_id, ref.file_name),
            )
        return row is not None

    def open(self, ref: UploadRef) -> OpenedUpload | None:
        """The published upload opened for reading (the caller closes `fd`), else None."""
        if not self.is_published(ref):
            return None
        return open_upload_fd(self._layout, ref, owner_uid=self._owner_uid(ref.owner_user_id))

    def copy_to(self, ref: UploadRef, max_bytes: int, sink: BinaryIO) -> int | None:
        """Copy the upload into `sink` in pieces (never whole): how many bytes, or None when
        missing; raises `UploadTooLarge` above `max_bytes` (the sink then holds a part)."""
        opened = self.open(ref)
        if opened is None:
            return None
        with closing_fd(opened.fd):
            if opened.size > max_bytes:
                raise UploadTooLarge(opened.size, max_bytes)
            total = 0
            while chunk := os.read(opened.fd, COPY_CHUNK):
                total += len(chunk)
                if total > max_bytes:  # it grew while we read
                    raise UploadTooLarge(total, max_bytes)
                sink.write(chunk)
            return total

    def read(self, ref: UploadRef, max_bytes: int) -> bytes | None:
        """The whole upload, or None when missing; raises `UploadTooLarge` above `max_bytes`."""
        buffer = io.BytesIO()
        return None if self.copy_to(ref, max_bytes, buffer) is None else buffer.getvalue()


class UploadTooLarge(Exception):
    def __init__(self, size: int, max_bytes: int) -> None:
        super().__init__(f"{size} bytes > {max_bytes}")
        self.size = size
        self.max_bytes = max_bytes


def iter_fd(fd: int, chunk_size: int = 1 << 16) -> Iterator[bytes]:
    while chunk := os.read(fd, chunk_size):
        yield chunk
