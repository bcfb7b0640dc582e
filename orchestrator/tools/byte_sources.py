"""Where the bytes of `send_file`, `send_image` and `publish_artifact` come from.

In this order:
1. an http(s) URL of this service's own `/uploads/` is read from disk (no network round trip);
2. any other http(s) URL is fetched by the host (size cap, timeout, no private addresses);
3. a local path is first pre-checked lexically on the host: another member's `uploads/` or
   `runtime/` gets its actionable error here, *before* any sandbox is asked,
   the same for every backend;
4. only then the acting (runtime) user's sandbox reads it with `read_bytes`, so its
   PathSandbox decides everything else exactly as for the model's own file tools.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import BinaryIO

from mounts.fs.spool import SpoolWriteFailed
from mounts.layout import DataLayout
from orchestrator.errors import ToolError
from orchestrator.deliveries.public_uploads import PublishedUploads, UploadTooLarge, is_own_origin, own_upload_ref
from orchestrator.sandboxes.router import SandboxRouter
from orchestrator.tools.read_bytes_stream import spool_failed
from orchestrator.tools.foreign_paths import classify_foreign_path, foreign_path_message
from orchestrator.tools.registry import ToolCall
from orchestrator.deliveries.url_fetch import UrlFetcher
from sandbox_agent.path_sandbox import quoted
from sandbox_agent.wire import TOOL_PATH_ARG_MAX, ReadBytesResult

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")


@dataclass(frozen=True)
class ResolvedBytes:
    data: bytes  # empty when they went to a sink instead (`spooled`)
    file_name: str | None
    media_type: str | None  # as declared by the source (extension or Content-Type), not sniffed
    origin: str  # sandbox | uploads | url
    location: str  # the absolute path or the URL read
    spooled: int | None = None  # bytes written to the caller's sink

    @property
    def size(self) -> int:
        return len(self.data) if self.spooled is None else self.spooled


def is_url(value: str) -> bool:
    return bool(_SCHEME.match(value)) and not _WINDOWS_DRIVE.match(value)


class BytesResolver:
    def __init__(
        self,
        *,
        layout: DataLayout,
        uploads: PublishedUploads,
        public_base_url: str,
        sandboxes: SandboxRouter,
        fetcher: UrlFetcher,
    ) -> None:
        self._layout = layout
        self._uploads = uploads
        self._public_base_url = public_base_url
        self._sandboxes = sandboxes
        self._fetcher = fetcher

    def resolve(
        self, call: ToolCall, path_or_url: str, *, tool: str, max_bytes: int, sink: BinaryIO | None = None
    ) -> ResolvedBytes:
        """The bytes to send; a sandbox file's go to `sink` when one is given (`from_path`)."""
        value = path_or_url.strip()
        if not value:
            raise ToolError(
                "invalid_arguments", "Give a file path or an http(s) URL.", field="path_or_url", path=quoted(path_or_url)
            )
        if is_url(value):
            return self._from_url(value, max_bytes, sink)
        if len(path_or_url) > TOOL_PATH_ARG_MAX:  # the schema's bound, counted as it counts
            raise ToolError(
                "invalid_arguments",
                f"A path is at most {TOOL_PATH_ARG_MAX} characters.",
                field="path_or_url",
                path=quoted(path_or_url),
            )
        return self.from_path(call, value, tool=tool, max_bytes=max_bytes, sink=sink)

    def _from_url(self, url: str, max_bytes: int, sink: BinaryIO | None = None) -> ResolvedBytes:
        """An own upload is copied into `sink` when one is given; a fetched URL comes whole."""
        scheme = url.split(":", 1)[0].lower()
        if scheme not in ("http", "https"):
            raise ToolError(
                "invalid_arguments",
                f"Only local file paths and http(s) URLs can be sent, not {scheme}: URLs: {url}",
                field="path_or_url",
            )
        if is_own_origin(url, self._public_base_url):
            ref = own_upload_ref(url, self._public_base_url)
            if ref is None:
                raise ToolError(
                    "invalid_arguments",
                    "This URL is on this service but is not a public upload "
                    f"({self._public_base_url.rstrip('/')}/uploads/{{uid}}/{{file}}): {url}",
                    field="path_or_url",
                )
            try:
                if sink is None:
                    data, copied = self._uploads.read(ref, max_bytes), None
                else:
                    data, copied = b"", self._uploads.copy_to(ref, max_bytes, sink)
            except UploadTooLarge as exc:
                raise ToolError("too_large", f"The file is {exc.size} bytes; at most {max_bytes} can be sent: {url}") from None
            except SpoolWriteFailed as exc:
                raise spool_failed(exc) from None
            if data is None or (sink is not None and copied is None):
                raise ToolError("not_found", f"There is no such upload: {url}", url=url)
            return ResolvedBytes(data, ref.file_name, None, "uploads", url, copied)
        fetched = self._fetcher.fetch(url, max_bytes=max_bytes)
        return ResolvedBytes(fetched.data, fetched.file_name, fetched.media_type, "url", fetched.url)

    def from_path(
        self, call: ToolCall, path: str, *, tool: str, max_bytes: int, sink: BinaryIO | None = None
    ) -> ResolvedBytes:
        """The bytes of a sandbox file; with `sink` (a seekable binary file) they are written
        there as they arrive instead of being held whole (`ResolvedBytes.spooled`)."""
        user = call.acting_user_id
        foreign = classify_foreign_path(
            path,
            workdir=call.workdir,
            data_root=str(self._layout.root),
            runtime_user_id=user,
            public_base_url=self._public_base_url,
        )
        if foreign is not None:
            details = {"path": foreign.path}
            if foreign.public_url is not None:
                details["url"] = foreign.public_url
            raise ToolError(foreign.code, foreign_path_message(foreign, user, tool=tool), **details)
        # A worker thread (host tools block): the same deadline and per-user cap as the
        # model's own calls, on the agent's blocking client.
        try:
            result = self._sandboxes.call_blocking(
                user, "read_bytes", {"path": path}, cwd=call.workdir, context=call.context(), sink=sink
            )
        except SpoolWriteFailed as exc:
            raise spool_failed(exc, tool=tool) from None
        except ToolError as exc:
            if exc.code != "too_large":
                raise
            # The model called `tool`, not read_bytes: name the tool and the cap it has.
            shown = exc.details.get("path") or path
            raise ToolError("too_large", f"The file is larger than {tool} sends (at most {max_bytes} bytes): {shown}", path=shown) from None
        if not isinstance(result, ReadBytesResult):
            raise ToolError("sandbox_error", f"The sandbox answered read_bytes with a {type(result).__name__}.")
        data, location = result.data, result.path
        if result.size > max_bytes:
            raise ToolError("too_large", f"The file is {result.size} bytes; {tool} sends at most {max_bytes}: {location}", path=location)
        spooled = None
        if sink is not None:
            if data:  # an agent of an earlier BUILD answers in JSON: the bytes came whole
                sink.write(data)
            data, spooled = b"", result.size
        return ResolvedBytes(data, location.rsplit("/", 1)[-1] or None, result.media_type, "sandbox", location, spooled)
