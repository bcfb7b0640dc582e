"""The run_code and kernel_* tools: the agent side of code kernels (sandbox_agent/kernels.py,
docs/interpreter.md).

A call names its session in its context (the host always does); a kernel is found only
within it. The answer is bounded like a shell's: stdout and stderr share
`shell_output_cap_bytes` (head and tail), rich values and the traceback are cut at the
output cap, and images are written to the session's `outputs/` directory (named by the host,
opened no-follow by the PathSandbox inside a writable root), never inlined.
"""

from __future__ import annotations

import base64
import binascii
import os
import queue
import re
import secrets
import shutil
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sandbox_agent import process_tree
from sandbox_agent.errors import AgentToolError
from sandbox_agent.kernels import DRIVER, Kernel, KernelKey, KernelTable
from sandbox_agent.tools.context import ToolContext
from sandbox_agent.tools.shell import PROC_FD, call_timeout, environment
from sandbox_agent.tools.shell_output import render, share_budget
from sandbox_agent.wire import (
    DEFAULT_KERNEL,
    KernelListArgs,
    KernelRestartArgs,
    KernelSelectArgs,
    KernelShutdownArgs,
    RunCodeArgs,
)

INTERRUPT_GRACE_S = 5.0  # after the SIGINT: longer, and the kernel is taken for unresponsive
POLL_S = 0.1
IMAGE_MIMES = {"image/png": "png", "image/svg+xml": "svg", "image/jpeg": "jpg"}
RICH_MIMES = ("text/html", "text/markdown", "application/json")
IMAGES_MAX = 32  # per call; more are counted, not written
IMAGE_MAX_BYTES = 16 * 1024 * 1024
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*(\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


# --- deciding -------------------------------------------------------------------------------


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def cut_text(text: str, cap: int) -> str:
    """`text` within `cap` bytes, its start kept, with a marker saying how much was cut."""
    data = text.encode("utf-8", "surrogateescape")
    if len(data) <= cap:
        return text
    return data[:cap].decode("utf-8", "ignore") + f"\n[... {len(data) - cap} bytes omitted ...]"


def image_payload(mime: str, value: Any) -> bytes | None:
    """The bytes of a displayed image (png/jpeg travel base64, svg as text), None if unusable."""
    if not isinstance(value, str):
        return None
    if mime == "image/svg+xml":
        return value.encode("utf-8", "surrogateescape")
    try:
        return base64.b64decode(value, validate=False)
    except (binascii.Error, ValueError):
        return None


@dataclass
class StreamText:
    """One output stream of a call, bounded: its first and last `keep` bytes and its total."""

    keep: int
    head: bytearray = field(default_factory=bytearray)
    tail: deque[bytes] = field(default_factory=deque)
    tail_bytes: int = 0
    total: int = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.keep - len(self.head)
        if room > 0:
            self.head.extend(data[:room])
        self.tail.append(data)
        self.tail_bytes += len(data)
        while self.tail and self.tail_bytes - len(self.tail[0]) >= self.keep:
            self.tail_bytes -= len(self.tail.popleft())

    def tail_bytes_value(self) -> bytes:
        joined = b"".join(self.tail)
        return joined[-self.keep :] if len(joined) > self.keep else joined


@dataclass
class Collected:
    """What one execution showed, as it arrives."""

    cap: int
    stdout: StreamText
    stderr: StreamText
    data: dict[str, Any] = field(default_factory=dict)
    images: list[tuple[str, bytes]] = field(default_factory=list)
    images_dropped: int = 0
    error: dict[str, str] | None = None
    status: str | None = None  # done's status; None until it came

    @classmethod
    def of(cls, shell_cap: int, output_cap: int) -> Collected:
        return cls(output_cap, StreamText(shell_cap), StreamText(shell_cap))

    def take(self, event: dict[str, Any]) -> tuple[str, bytes] | None:
        """Note one driver event; answers (stream, bytes) when it is output to stream on."""
        kind = event.get("ev")
        if kind == "stream":
            name = "stderr" if event.get("name") == "stderr" else "stdout"
            data = str(event.get("text", "")).encode("utf-8", "surrogateescape")
            (self.stderr if name == "stderr" else self.stdout).add(data)
            return name, data
        if kind in ("display", "result") and isinstance(event.get("data"), dict):
            bundle: dict[str, Any] = event["data"]
            shown = self._images(bundle)
            if kind == "result":
                self.data = {
                    mime: bundle[mime] for mime in ("text/plain", *RICH_MIMES) if mime in bundle
                }
            elif not shown and isinstance(bundle.get("text/plain"), str):
                text = bundle["text/plain"] + "\n"  # displayed text reads like printed text
                self.stdout.add(text.encode("utf-8", "surrogateescape"))
                return "stdout", text.encode("utf-8", "surrogateescape")
        elif kind == "error":
            traceback = event.get("traceback")
            lines = [str(line) for line in traceback] if isinstance(traceback, list) else []
            self.error = {
                "ename": cut_text(strip_ansi(str(event.get("ename", ""))), 1024),
                "evalue": cut_text(strip_ansi(str(event.get("evalue", ""))), self.cap),
                "traceback": cut_text(strip_ansi("\n".join(lines)), self.cap),
            }
        elif kind == "done":
            self.status = "error" if event.get("status") == "error" or self.error else "ok"
        return None

    def _images(self, bundle: dict[str, Any]) -> bool:
        for mime in IMAGE_MIMES:
            if mime in bundle:
                payload = image_payload(mime, bundle[mime])
                if payload is None or len(payload) > IMAGE_MAX_BYTES or len(self.images) >= IMAGES_MAX:
                    self.images_dropped += 1
                else:
                    self.images.append((mime, payload))
                return True  # one file per image: its best form (png before svg)
        return False

    def output_fields(self) -> dict[str, Any]:
        streams = (("stdout", self.stdout), ("stderr", self.stderr))
        shares = share_budget([stream.total for _, stream in streams], self.stdout.keep)
        fields: dict[str, Any] = {}
        cut = False
        for (name, stream), share in zip(streams, shares):
            shown = render(bytes(stream.head), stream.tail_bytes_value(), stream.total, share, None)
            fields[name] = shown.text
            cut |= shown.cut
        text = self.data.get("text/plain")
        data = {mime: _bounded(value, self.cap) for mime, value in self.data.items()}
        fields.update(text=_bounded(text, self.cap) if isinstance(text, str) else None, data=data)
        fields["truncated"] = cut
        return fields


def _bounded(value: Any, cap: int) -> Any:
    if isinstance(value, str):
        return cut_text(value, cap)
    return value if len(repr(value)) <= cap else cut_text(repr(value), cap)


# --- doing ------------------------------------------------------------------------------------


def _table(ctx: ToolContext) -> KernelTable:
    if ctx.kernels is None:
        raise AgentToolError("unsupported", "This sandbox agent runs no kernels.")
    return ctx.kernels


def _session(ctx: ToolContext) -> tuple[str, str | None]:
    context = ctx.call.context if ctx.call is not None else None
    if context is None or not context.session_id:
        raise AgentToolError("invalid_request", "Kernels belong to a session; the call named none.")
    return context.session_id, context.outputs_dir


def _key(session_id: str, language: str | None, name: str | None) -> KernelKey:
    return (session_id, language or "python", name or DEFAULT_KERNEL)


def _python(ctx: ToolContext, env: dict[str, str]) -> str:
    wanted = ctx.config.kernel_python
    if "/" in wanted:
        return wanted
    found = shutil.which(wanted, path=env.get("PATH"))
    if found is None:
        raise AgentToolError(
            "interpreter_unavailable",
            f"run_code needs a python with ipykernel; there is no {wanted} on this sandbox's PATH.",
            missing="python",
        )
    return found


def _obtain(ctx: ToolContext, key: KernelKey) -> tuple[Kernel, bool]:
    table = _table(ctx)
    existing = table.get(key)
    if existing is not None and not existing.ended:
        return existing, False
    with ctx.sandbox.open_dir(ctx.cwd, "/") as workdir:
        env = environment(ctx, workdir.path, "")
        python = _python(ctx, env)
        env.pop("TERM", None)  # ipykernel colours tracebacks either way; ANSI is stripped
        cwd = f"/proc/self/fd/{workdir.fd}" if PROC_FD else workdir.path

        def start(marker: str, runtime_dir: str) -> tuple[subprocess.Popen[bytes], process_tree.Leader]:
            env[process_tree.MARKER_ENV] = marker  # the tree's third trace: what a kernel starts carries it
            env["JUPYTER_RUNTIME_DIR"] = runtime_dir
            env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline" if key[1] == "python" else env.get("MPLBACKEND", "Agg")

            def popen() -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    [python, "-u", DRIVER, key[1], runtime_dir],
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # its own group and session: ended as one
                    pass_fds=(workdir.fd,) if PROC_FD else (),
                )

            return process_tree.spawn(popen, marker, kept=True)

        return table.obtain(key, start, ctx.config.tmp_dir)


def run_code(ctx: ToolContext, args: RunCodeArgs) -> dict[str, Any]:
    timeout = call_timeout(ctx.limits, args.timeout_s)
    session_id, outputs_dir = _session(ctx)
    key = _key(session_id, args.language, args.kernel)
    started = time.monotonic()
    kernel, _ = _obtain(ctx, key)
    if not kernel.executing.acquire(blocking=False):
        raise AgentToolError(
            "kernel_busy", f"The {key[1]} kernel {key[2]!r} is running another call; wait for it or use another kernel name."
        )
    try:
        collected, status, restarted = _execute(ctx, kernel, args.code, timeout)
    finally:
        kernel.touch()
        kernel.executing.release()
    images = _write_images(ctx, outputs_dir, key, collected.images)
    result: dict[str, Any] = {"status": status, **collected.output_fields()}
    result.update(
        images=images,
        error=collected.error,
        kernel={"name": key[2], "language": key[1]},
        kernel_restarted=restarted,
        duration_s=round(time.monotonic() - started, 3),
    )
    notes = []
    if status == "timeout" and not restarted:
        notes.append(f"Interrupted after {timeout:g} s; the kernel and its state are kept.")
    if restarted:
        notes.append(
            "The kernel died or did not answer its interrupt, and was ended: its state (variables, imports) "
            "is lost. The next call starts a fresh kernel."
        )
    if collected.images_dropped:
        notes.append(f"{collected.images_dropped} image(s) were not saved (more than {IMAGES_MAX}, or too large).")
    if len(images) < len(collected.images):
        notes.append("Some images could not be saved: the session's outputs directory is not writable.")
    if notes:
        result["note"] = " ".join(notes)
    return result


def _execute(ctx: ToolContext, kernel: Kernel, code: str, timeout: float) -> tuple[Collected, str, bool]:
    """Run `code`; (what it showed, status, whether the kernel was lost)."""
    limits = ctx.limits
    collected = Collected.of(limits.shell_output_cap_bytes, limits.output_cap_bytes)
    while True:  # what an earlier, interrupted call left behind is not this call's
        try:
            kernel.events.get_nowait()
        except queue.Empty:
            break
    if not kernel.send({"op": "execute", "code": code}):
        _table(ctx).stop(kernel)
        return collected, "kernel_died", True
    deadline = time.monotonic() + timeout
    interrupted_at: float | None = None
    while True:
        now = time.monotonic()
        cancelled = ctx.call is not None and ctx.call.cancelled
        if interrupted_at is None and (now >= deadline or cancelled):
            kernel.send({"op": "interrupt"})
            interrupted_at = now
        if interrupted_at is not None and now - interrupted_at >= INTERRUPT_GRACE_S:
            _table(ctx).stop(kernel)  # it did not answer its interrupt
            return collected, "timeout", True
        try:
            event = kernel.events.get(timeout=POLL_S)
        except queue.Empty:
            continue
        if event.get("ev") in ("died", "eof"):
            _table(ctx).stop(kernel)
            return collected, "kernel_died", True
        shown = collected.take(event)
        if shown is not None and ctx.on_output is not None:
            ctx.on_output(*shown)
        if collected.status is not None:
            if interrupted_at is not None:
                return collected, "timeout", False
            return collected, collected.status, False


def _write_images(
    ctx: ToolContext, outputs_dir: str | None, key: KernelKey, images: list[tuple[str, bytes]]
) -> list[dict[str, Any]]:
    """Each image into the session's outputs/ (created O_EXCL, no-follow): its path, mime, size."""
    if not images or outputs_dir is None:
        return []
    try:
        opened = ctx.sandbox.open_dir(outputs_dir, "/")
    except AgentToolError:
        return []
    written = []
    with opened:
        if not opened.root.writable:
            return []
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        for index, (mime, payload) in enumerate(images, 1):
            name = f"{key[2]}-{stamp}-{secrets.token_hex(3)}-{index}.{IMAGE_MIMES[mime]}"
            try:
                fd = os.open(name, _CREATE, 0o644, dir_fd=opened.fd)
            except OSError:
                continue
            try:
                with os.fdopen(fd, "wb") as file:
                    file.write(payload)
            except OSError:
                continue
            written.append({"path": f"{opened.path.rstrip('/')}/{name}", "mime": mime, "size": len(payload)})
    return written


def _select(ctx: ToolContext, args: KernelSelectArgs) -> tuple[KernelKey, Kernel | None]:
    session_id, _ = _session(ctx)
    key = _key(session_id, args.language, args.kernel)
    return key, _table(ctx).get(key)


def kernel_restart(ctx: ToolContext, args: KernelRestartArgs) -> dict[str, Any]:
    key, kernel = _select(ctx, args)
    if kernel is not None:
        _table(ctx).stop(kernel)
    fresh, _ = _obtain(ctx, key)
    return {"restarted": kernel is not None, "kernel": fresh.summary()}


def kernel_shutdown(ctx: ToolContext, args: KernelShutdownArgs) -> dict[str, Any]:
    key, kernel = _select(ctx, args)
    if kernel is None:
        raise AgentToolError("not_found", f"There is no {key[1]} kernel {key[2]!r} in this session.")
    _table(ctx).stop(kernel)
    return {"shut_down": True, "kernel": {"name": key[2], "language": key[1]}}


def kernel_list(ctx: ToolContext, args: KernelListArgs) -> dict[str, Any]:
    session_id, _ = _session(ctx)
    return {"kernels": [kernel.summary() for kernel in _table(ctx).of_session(session_id)]}
