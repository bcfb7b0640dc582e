"""The `shell` tool: bash in the run's working directory, with a timeout that kills the whole
process tree and still returns the output so far (exit code 124, `timed_out: true`).

The working directory is resolved by the PathSandbox like any path, and the shell starts in
that very directory (through its fd), not in whatever the name points at a moment later.
The shell itself is not confined by the PathSandbox: it runs as the sandbox's own uid (and
inside the container or mount namespace), which is what keeps users apart for it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import threading
import time
from typing import IO, Any

from sandbox_agent import process_tree
from sandbox_agent.errors import AgentToolError
from sandbox_agent.tools.context import ToolContext
from sandbox_agent.tools.output import cap_bytes
from sandbox_agent.wire import ShellArgs

TIMEOUT_EXIT_CODE = 124  # like coreutils `timeout`
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PIPE_GRACE_S = 2.0
_SHELL = shutil.which("bash") or "/bin/sh"
_PROC_FD = os.path.isdir("/proc/self/fd")


class _CappedReader(threading.Thread):
    """Drains a pipe to EOF, keeping the first `cap` bytes and counting the rest, so a chatty
    command never blocks on a full pipe."""

    def __init__(self, stream: IO[bytes], cap: int) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.cap = cap
        self.kept = bytearray()
        self.omitted = 0

    def run(self) -> None:
        try:
            while chunk := self.stream.read1(65536):  # type: ignore[attr-defined]
                room = self.cap - len(self.kept)
                if room > 0:
                    self.kept += chunk[:room]
                self.omitted += max(0, len(chunk) - max(room, 0))
        except (OSError, ValueError):
            pass


def _environment(ctx: ToolContext, cwd_shown: str, marker: str) -> dict[str, str]:
    config = ctx.config
    env = {
        "PATH": DEFAULT_PATH,
        "HOME": config.home,
        "TMPDIR": config.tmp_dir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "SHELL": _SHELL,
        "TERM": "dumb",
    }
    env.update(config.shell_env)
    env["PWD"] = cwd_shown  # bash keeps it when it names the same directory as the real cwd
    env[process_tree.MARKER_ENV] = marker
    return env


def shell(ctx: ToolContext, args: ShellArgs) -> dict[str, Any]:
    limits = ctx.limits
    timeout = args.timeout_s if args.timeout_s is not None else limits.shell_timeout_s
    if timeout > limits.shell_timeout_max_s:
        raise AgentToolError(
            "invalid_arguments", f"timeout_s may be at most {limits.shell_timeout_max_s:g} seconds (got {timeout:g})."
        )
    if "\x00" in args.command:
        raise AgentToolError("invalid_arguments", "The command contains a NUL byte.")
    marker = secrets.token_hex(12)
    with ctx.sandbox.open_dir(ctx.cwd, "/") as workdir:
        cwd = f"/proc/self/fd/{workdir.fd}" if _PROC_FD else workdir.path
        env = _environment(ctx, workdir.path, marker)
        started = time.monotonic()

        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                [_SHELL, "-c", args.command],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group and session: killed as one
                pass_fds=(workdir.fd,) if _PROC_FD else (),
            )

        try:
            proc, leader = process_tree.spawn(start, marker)
        except OSError as exc:
            raise AgentToolError("shell_failed", f"Could not start the shell: {exc}") from None
        shown_cwd = workdir.path
    assert proc.stdout is not None and proc.stderr is not None
    readers = [_CappedReader(proc.stdout, limits.output_cap_bytes), _CappedReader(proc.stderr, limits.output_cap_bytes)]
    try:
        if ctx.call is not None and not ctx.call.attach(leader):
            process_tree.kill_call(leader)  # cancelled while it was starting
        for reader in readers:
            reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        # On timeout: everything. After a normal exit: whatever it left in the background,
        # which would otherwise hold the pipes open and outlive the call.
        leftovers = process_tree.kill_call(leader)
        returncode = proc.wait()
        for reader in readers:
            reader.join(_PIPE_GRACE_S)
    finally:
        if ctx.call is not None:
            ctx.call.detach()
        process_tree.unregister(leader)
    for reader in readers:
        if not reader.is_alive():  # closing under a blocked reader would wait for it
            reader.stream.close()
    duration = time.monotonic() - started
    stdout, cut_out = cap_bytes(bytes(readers[0].kept), limits.output_cap_bytes, readers[0].omitted)
    stderr, cut_err = cap_bytes(bytes(readers[1].kept), limits.output_cap_bytes, readers[1].omitted)
    if timed_out:
        exit_code = TIMEOUT_EXIT_CODE
    elif returncode < 0:
        exit_code = 128 - returncode  # killed by a signal, as a shell would report it
    else:
        exit_code = returncode
    result: dict[str, Any] = {
        "exit_code": exit_code,
        "stdout": stdout,
        "stderr": stderr,
        "timed_out": timed_out,
        "truncated": cut_out or cut_err,
        "duration_s": round(duration, 3),
        "cwd": shown_cwd,
    }
    if timed_out:
        result["note"] = (
            f"The command timed out after {timeout:g} s; its whole process tree was killed. "
            "The output up to that moment is shown."
        )
    elif leftovers:
        result["note"] = (
            f"{leftovers} background process(es) the command left running were stopped: "
            "processes do not outlive a shell call."
        )
    return result
