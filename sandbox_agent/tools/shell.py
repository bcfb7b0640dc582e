"""The `shell` tool: bash in the run's working directory, with a timeout that kills the whole
process tree and still returns the output so far (exit code 124, `timed_out: true`).

The working directory is resolved by the PathSandbox like any path, and the shell starts in
that very directory (through its fd), not in whatever the name points at a moment later.
What the answer shows of the output, and the spool of the rest, is tools/shell_output.py.
The answer says `output_complete: false` when a pipe did not reach its end (a process outside
the call still held it): the output shown is then not all the command wrote.

The shell itself is not confined by the PathSandbox: it runs as the sandbox's own uid (and
inside the container or mount namespace), which is what keeps users apart for it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from typing import Any

from sandbox_agent import process_tree
from sandbox_agent.errors import AgentToolError
from sandbox_agent.tools.context import ToolContext
from sandbox_agent.tools.shell_output import SpoolDir, StreamReader, render, share_budget
from sandbox_agent.wire import AgentLimits, ShellArgs

TIMEOUT_EXIT_CODE = 124  # like coreutils `timeout`
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PIPE_GRACE_S = 2.0
SHELL = shutil.which("bash") or "/bin/sh"
PROC_FD = os.path.isdir("/proc/self/fd")


def environment(ctx: ToolContext, cwd_shown: str, marker: str) -> dict[str, str]:
    config = ctx.config
    env = {
        "PATH": DEFAULT_PATH,
        "HOME": config.home,
        "TMPDIR": config.tmp_dir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "SHELL": SHELL,
        "TERM": "dumb",
    }
    env.update(config.shell_env)
    env["PWD"] = cwd_shown  # bash keeps it when it names the same directory as the real cwd
    env[process_tree.MARKER_ENV] = marker
    return env


def call_timeout(limits: AgentLimits, asked: float | None) -> float:
    """A call's own `timeout_s` (shell, run_code): the default when not given, refused above
    the maximum."""
    timeout = asked if asked is not None else limits.shell_timeout_s
    if timeout > limits.shell_timeout_max_s:
        raise AgentToolError(
            "invalid_arguments", f"timeout_s may be at most {limits.shell_timeout_max_s:g} seconds (got {timeout:g})."
        )
    return timeout


def shell(ctx: ToolContext, args: ShellArgs) -> dict[str, Any]:
    limits = ctx.limits
    timeout = call_timeout(limits, args.timeout_s)
    if "\x00" in args.command:
        raise AgentToolError("invalid_arguments", "The command contains a NUL byte.")
    marker = secrets.token_hex(12)
    with ctx.sandbox.open_dir(ctx.cwd, "/") as workdir:
        cwd = f"/proc/self/fd/{workdir.fd}" if PROC_FD else workdir.path
        env = environment(ctx, workdir.path, marker)
        started = time.monotonic()

        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                [SHELL, "-c", args.command],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group and session: killed as one
                pass_fds=(workdir.fd,) if PROC_FD else (),
            )

        try:
            proc, leader = process_tree.spawn(start, marker)
        except OSError as exc:
            raise AgentToolError("shell_failed", f"Could not start the shell: {exc}") from None
        shown_cwd = workdir.path
    assert proc.stdout is not None and proc.stderr is not None
    cap = limits.shell_output_cap_bytes
    spool = _spool_dir(ctx)
    readers = [
        StreamReader(proc.stdout, "stdout", cap, cap // 2, spool, ctx.on_output),
        StreamReader(proc.stderr, "stderr", cap, cap // 2, spool, ctx.on_output),
    ]
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
        if spool is not None:
            spool.close()
    for reader in readers:
        if not reader.is_alive():  # closing under a blocked reader would wait for it
            reader.stream.close()
    duration = time.monotonic() - started
    if timed_out:
        exit_code = TIMEOUT_EXIT_CODE
    elif returncode < 0:
        exit_code = 128 - returncode  # killed by a signal, as a shell would report it
    else:
        exit_code = returncode
    result: dict[str, Any] = {"exit_code": exit_code, **output_fields(readers, cap)}
    result.update(timed_out=timed_out, duration_s=round(duration, 3), cwd=shown_cwd)
    notes = []
    if not result["output_complete"]:
        notes.append(
            "The output is INCOMPLETE: a process outside this call still held its output pipe "
            f"{_PIPE_GRACE_S:g} s after the command ended, so only what arrived until then is shown."
        )
    if timed_out:
        notes.append(
            f"The command timed out after {timeout:g} s; its whole process tree was killed. "
            "The output up to that moment is shown."
        )
    elif leftovers:
        notes.append(
            f"{leftovers} background process(es) the command left running were stopped: "
            "processes do not outlive a shell call."
        )
    if notes:
        result["note"] = " ".join(notes)
    return result


def _spool_dir(ctx: ToolContext) -> SpoolDir | None:
    """The session's `shell-output/` directory the host named in the call's context, opened
    by the PathSandbox (no-follow, inside a writable root) when a stream first needs it."""
    context = ctx.call.context if ctx.call is not None else None
    output_dir = context.output_dir if context is not None else None
    if output_dir is None or ctx.limits.shell_spool_max_bytes == 0:
        return None

    def opener() -> tuple[int, str] | None:
        try:
            opened = ctx.sandbox.open_dir(output_dir, "/")
        except AgentToolError:
            return None
        if not opened.root.writable:
            opened.close()
            return None
        return opened.fd, opened.path  # SpoolDir closes the fd

    return SpoolDir(opener, ctx.limits.shell_spool_max_bytes)


def output_fields(readers: list[StreamReader], cap: int) -> dict[str, Any]:
    """stdout, stderr and what the model needs to know about them, within one budget."""
    shares = share_budget([reader.total for reader in readers], cap)
    fields: dict[str, Any] = {}
    cut_any = False
    for reader, share in zip(readers, shares):
        shown = render(bytes(reader.head), bytes(reader.tail), reader.total, share, reader.spool_path)
        name = reader.name_
        fields[name] = shown.text
        fields[f"{name}_bytes"] = reader.total
        if shown.binary:
            fields[f"{name}_binary"] = True
        if reader.spool_path is not None:
            fields[f"{name}_file"] = reader.spool_path
            if reader.spooled < reader.total:
                fields[f"{name}_file_bytes"] = reader.spooled  # the spool holds only the start
        cut_any |= shown.cut
    complete = all(reader.eof for reader in readers)
    fields["truncated"] = cut_any or not complete
    fields["output_complete"] = complete
    return fields
