"""The runtime-scoped host tools: `publish_artifact`, `send_file`,
`send_image`, `dump_user_messages`. They act as the runtime user (the identity table says so)
and touch only that user's directories, the outbox and the public uploads."""

from __future__ import annotations

import json
import posixpath
import re
import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mounts.layout import DataLayout
from orchestrator.sessions.chat_records import Role
from orchestrator.deliveries.outbox import DeliverySpool, DeliveryStore, NewDelivery
from orchestrator.errors import ToolError
from orchestrator.quotas.host_copies import HostCopies, HostCopyRefused
from orchestrator.deliveries.image_types import SNIFF_BYTES, sniff_image
from mounts.fs.nofollow import UnsafePath
from mounts.fs.spool import FileSpool
from orchestrator.deliveries.public_uploads import PublishedUploads, UploadRef, media_type_of
from orchestrator.sessions.service import SessionService
from orchestrator.settings import HostToolSettings
from orchestrator.tools.byte_sources import BytesResolver, is_url
from orchestrator.tools.foreign_paths import public_upload_url
from orchestrator.tools.registry import ToolCall, ToolPlace, ToolRegistry, ToolSpec
from orchestrator.tools.transfer_slots import TransferSlots
from orchestrator.users.dirs import UnsafeDirectory, UserDirectories
from orchestrator.users.files import UserFileWriter
from sandbox_agent.wire import PATH_FIELD, TOOL_PATH_ARG_MAX, TOOL_PATH_PATTERN

_EXTENSION = re.compile(r"\.[A-Za-z0-9]{1,10}$")
_UNSAFE_NAME_CHARS = re.compile(r"[\x00-\x1f\x7f/\\]")
FILE_NAME_MAX = 200



@contextmanager
def _tool_level_unsafe_directory() -> Iterator[None]:
    """A directory the user's own shell replaced (a symlink, a file) is the model's business,
    like every other tool failure: `200 {ok: false, error: {code: unsafe_directory}}`, not an
    HTTP 409 that a bot's tool loop would take for its own mistake."""
    try:
        yield
    except UnsafeDirectory as exc:
        raise ToolError("unsafe_directory", exc.message) from None

# A path argument of a host tool, of which surrounding white space is dropped (so it must hold
# more); otherwise the limits of every path argument (sandbox_agent/wire.py).
# Not `scheme:...` either (after the white space): that is read as a URL (byte_sources.is_url).
STRIPPED_PATH = {
    **PATH_FIELD["json_schema_extra"],
    "pattern": r"(?=[\s\S]*\S)(?!\s*(?![A-Za-z]:[\\/])[A-Za-z][A-Za-z0-9+.-]*:)" + TOOL_PATH_PATTERN,
}


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PublishArtifactArgs(_Args):
    path: str = Field(
        ...,
        min_length=1,
        max_length=TOOL_PATH_ARG_MAX,  # counted before the white space is dropped, as the schema does
        description="A file you can read: absolute, or relative to the working directory.",
        json_schema_extra=STRIPPED_PATH,
    )


class SendArgs(_Args):
    path_or_url: str = Field(
        ...,
        min_length=1,
        max_length=8192,
        description="A file you can read (absolute, or relative to the working directory), or an http(s) URL.",
        # A URL may be long; a path has the limits of every path argument (sandbox_agent/wire.py).
        json_schema_extra={
            "anyOf": [
                {"pattern": "^https?://"},
                STRIPPED_PATH,
            ]
        },
    )


class DumpUserMessagesArgs(_Args):
    pass


def extension_of(name: str | None) -> str:
    match = _EXTENSION.search(name or "")
    return match.group(0).lower() if match else ""


def safe_file_name(name: str | None, default: str) -> str:
    """A display name for the chat: no path, no control characters, bounded length."""
    base = _UNSAFE_NAME_CHARS.sub("_", posixpath.basename((name or "").replace("\\", "/"))).strip(" .")
    if not base:
        return default
    if len(base) > FILE_NAME_MAX:
        ext = extension_of(base)
        base = base[: FILE_NAME_MAX - len(ext)] + ext
    return base


class HostTools:
    def __init__(
        self,
        *,
        settings: HostToolSettings,
        layout: DataLayout,
        directories: UserDirectories,
        resolver: BytesResolver,
        deliveries: DeliveryStore,
        sessions: SessionService,
        uploads: PublishedUploads,
        copies: HostCopies,
    ) -> None:
        self._settings = settings
        self._layout = layout
        self._directories = directories
        self._writer = UserFileWriter(layout, directories)
        self._resolver = resolver
        self._deliveries = deliveries
        self._sessions = sessions
        self._uploads = uploads
        self._copies = copies
        self.transfers = TransferSlots(
            transfers_max=settings.transfers_max,
            user_transfers_max=settings.user_transfers_max,
            wait_s=settings.transfer_wait_s,
        )

    # publish_artifact ------------------------------------------------------------------
    def publish_artifact(self, call: ToolCall) -> dict[str, Any]:
        args: PublishArtifactArgs = call.arguments  # type: ignore[assignment]
        if is_url(args.path.strip()):
            raise ToolError(
                "invalid_arguments",
                "publish_artifact copies a local file; a URL is already public, send it as it is.",
                field="path",
            )
        user = call.acting_user_id
        with _tool_level_unsafe_directory():
            uploads = self._directories.ensure_uploads(user)
        # The sandbox's raw answer streams into a spool in the uploads dir, renamed into place.
        try:
            with self.transfers.held(user, tool="publish_artifact"), self._writer.spooled(uploads, head_bytes=SNIFF_BYTES) as spool:
                return self._publish(call, uploads, spool)
        except UnsafePath as exc:
            raise ToolError("unsafe_path", f"Your uploads directory is not a plain directory ({exc}).") from None

    def _publish(self, call: ToolCall, uploads: Path, spool: FileSpool) -> dict[str, Any]:
        args: PublishArtifactArgs = call.arguments  # type: ignore[assignment]
        user = call.acting_user_id
        source = self._resolver.from_path(
            call, args.path.strip(), tool="publish_artifact", max_bytes=self._settings.read_bytes_max, sink=spool
        )
        image = sniff_image(spool.head)
        extension = extension_of(source.file_name) or (image.extension if image else "")
        name = f"{uuid.uuid4().hex}{extension}"
        written = self._writer.commit(user, spool, uploads, name, mode=0o644)
        self._uploads.record(UploadRef(user, name))  # only recorded names are public (issue 12)
        return {
            "path": str(written),
            "url": public_upload_url(self._settings.public_base_url, user, name),
            "file_name": name,
            "source": source.location,
            "size": source.size,
            "media_type": image.media_type if image else media_type_of(name),
            "note": "Anyone with the URL can download this file; it stays until removed from your uploads.",
        }

    # send_file / send_image ------------------------------------------------------------
    def send_file(self, call: ToolCall) -> dict[str, Any]:
        return self._send(call, kind="file", tool="send_file", max_bytes=self._settings.read_bytes_max)

    def send_image(self, call: ToolCall) -> dict[str, Any]:
        cap = min(self._settings.image_max_bytes, self._settings.read_bytes_max)
        return self._send(call, kind="image", tool="send_image", max_bytes=cap)

    def _send(self, call: ToolCall, *, kind: str, tool: str, max_bytes: int) -> dict[str, Any]:
        # A sandbox file streams into the outbox through the spool, charged to the user as it
        # grows; a URL's bytes come whole (bounded by the slot) and are charged before written.
        user = call.acting_user_id
        try:
            self._copies.check(user)  # a user already at the budget: refused before the sandbox is asked
            with self.transfers.held(user, tool=tool), self._deliveries.spool(SNIFF_BYTES, user) as spool:
                return self._send_held(call, kind=kind, tool=tool, max_bytes=max_bytes, spool=spool)
        except HostCopyRefused as refused:
            raise refused.tool_error(tool) from None

    def _send_held(
        self, call: ToolCall, *, kind: str, tool: str, max_bytes: int, spool: DeliverySpool
    ) -> dict[str, Any]:
        args: SendArgs = call.arguments  # type: ignore[assignment]
        source = self._resolver.resolve(call, args.path_or_url, tool=tool, max_bytes=max_bytes, sink=spool)
        if not source.size:
            raise ToolError("empty_file", f"The file is empty; there is nothing to send: {source.location}")
        image = sniff_image(spool.head if source.spooled is not None else source.data[:SNIFF_BYTES])
        if kind == "image":
            if image is None:
                raise ToolError(
                    "not_an_image",
                    "This is not a PNG, JPEG, GIF, WebP, BMP, TIFF or ICO image (judged by its content, "
                    f"not its name); send it with send_file instead: {source.location}",
                )
            name = safe_file_name(source.file_name, f"image{image.extension}")
            if not extension_of(name):
                name += image.extension
            media_type = image.media_type
        else:
            name = safe_file_name(source.file_name, "file")
            media_type = (
                image.media_type
                if image
                else (source.media_type if source.media_type not in (None, "") else media_type_of(name))
            )
        run = call.run
        delivery = self._deliveries.create(
            NewDelivery(
                run_id=run.run_id,
                session_id=run.session_id,
                runtime_user_id=call.acting_user_id,
                tool=tool,
                kind=kind,
                file_name=name,
                media_type=media_type or "application/octet-stream",
                source=source.location,
                data=source.data,
            ),
            spool=spool if source.spooled is not None else None,
        )
        return {
            "delivery_id": delivery.delivery_id,
            "kind": kind,
            "file_name": delivery.file_name,
            "media_type": delivery.media_type,
            "size": delivery.size,
            "sha256": delivery.sha256,
            "source": source.location,
            "fetch": delivery.fetch_path,
            "expires_at": delivery.expires_at,
            "note": f"Handed to the chat bot, which posts the {kind} to the conversation.",
        }

    # dump_user_messages -----------------------------------------------------------------
    def dump_user_messages(self, call: ToolCall) -> dict[str, Any]:
        user, run = call.acting_user_id, call.run
        messages, _ = self._sessions.messages(run.session_id)
        user_messages = [m for m in messages if m.role is Role.USER]
        now = datetime.now(timezone.utc)
        document = {
            "session_id": run.session_id,
            "dumped_at": now.isoformat(timespec="seconds"),
            "count": len(user_messages),
            "messages": [
                {"seq": m.seq, "at": m.at, "speaker_user_id": m.speaker_user_id, "content": m.content}
                for m in user_messages
            ],
        }
        with _tool_level_unsafe_directory():
            self._directories.ensure_session_runtime(user, run.session_id, is_owner=user == run.owner_user_id)
        name = f"user-messages-{now.strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}.json"
        data = (json.dumps(document, ensure_ascii=False, indent=2) + "\n").encode()
        try:
            written = self._writer.write_new(
                user, self._layout.user_messages_dir(user, run.session_id), name, data, mode=0o600
            )
        except UnsafePath as exc:
            raise ToolError("unsafe_path", f"The session's user-messages directory is not a plain directory ({exc}).") from None
        return {
            "path": str(written),
            "count": len(user_messages),
            "format": "json",
            "note": "Read it with read_file; `messages` lists every user message of this session, oldest first.",
        }


def register_host_tools(registry: ToolRegistry, tools: HostTools) -> None:
    registry.register(
        ToolSpec(
            "publish_artifact",
            "Publish a file you can read: it is copied into your uploads directory under a random name and "
            "gets a public URL anyone can download without a token. Returns the new path and the URL.",
            PublishArtifactArgs,
            ToolPlace.HOST,
            tools.publish_artifact,
        )
    )
    registry.register(
        ToolSpec(
            "send_file",
            "Send a file to the chat: a file you can read (path) or an http(s) URL. Another member's "
            "artifacts cannot be read by path: the error then gives the public URL to pass instead.",
            SendArgs,
            ToolPlace.HOST,
            tools.send_file,
        )
    )
    registry.register(
        ToolSpec(
            "send_image",
            "Send an image (PNG, JPEG, GIF, WebP, BMP, TIFF, ICO) to the chat: a file you can read (path) or "
            "an http(s) URL. Another member's artifacts cannot be read by path: the error then gives the "
            "public URL to pass instead.",
            SendArgs,
            ToolPlace.HOST,
            tools.send_image,
        )
    )
    registry.register(
        ToolSpec(
            "dump_user_messages",
            "Write every user message of this session to a JSON file in your session's user-messages "
            "directory and return its path, to read with read_file or process with the shell.",
            DumpUserMessagesArgs,
            ToolPlace.HOST,
            tools.dump_user_messages,
        )
    )
