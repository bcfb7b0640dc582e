"""The process_* tools: the agent side of background processes (sandbox_agent/processes.py).

Every call names its session in the call's context (the host always does); a process is
found only within it. The output spool goes into the session's `shell-output/` directory
that the host names, opened no-follow by the PathSandbox inside a writable root.
"""

from __future__ import annotations

import fcntl
import subprocess
import termios
from typing import Any

from sandbox_agent import process_tree
from sandbox_agent.errors import AgentToolError
from sandbox_agent.processes import ManagedProcess, ProcessTable, announce_exit, output_answer
from sandbox_agent.tools.context import ToolContext
from sandbox_agent.tools.shell import PROC_FD, SHELL, environment
from sandbox_agent.wire import (
    PROCESS_READ_MAX_BYTES,
    ProcessListArgs,
    ProcessOutputArgs,
    ProcessResizeArgs,
    ProcessSignalArgs,
    ProcessStartArgs,
    ProcessWriteArgs,
)

DEFAULT_COLS, DEFAULT_ROWS = 80, 24


def _table(ctx: ToolContext) -> ProcessTable:
    if ctx.processes is None:
        raise AgentToolError("unsupported", "This sandbox agent runs no background processes.")
    return ctx.processes


def _session(ctx: ToolContext) -> tuple[str, str | None, str | None]:
    context = ctx.call.context if ctx.call is not None else None
    if context is None or not context.session_id:
        raise AgentToolError("invalid_request", "Background processes belong to a session; the call named none.")
    return context.session_id, context.run_id, context.output_dir


def _with_exit(ctx: ToolContext, proc: ManagedProcess, answer: dict[str, Any]) -> dict[str, Any]:
    if announce_exit(proc):
        answer["exit_new"] = True  # the host audits the exit once, on this answer
    answer["running_processes"] = _table(ctx).running_count()
    return answer


def process_start(ctx: ToolContext, args: ProcessStartArgs) -> dict[str, Any]:
    table = _table(ctx)
    session_id, run_id, output_dir = _session(ctx)
    if output_dir is None:
        raise AgentToolError("invalid_request", "The call named no directory for the process's output.")
    spool = ctx.sandbox.open_dir(output_dir, "/")
    if not spool.root.writable:
        spool.close()
        raise AgentToolError("read_only", "The session's output directory is not writable.", path=output_dir)
    spool_dir = (spool.fd, spool.path)
    pty = (args.cols or DEFAULT_COLS, args.rows or DEFAULT_ROWS) if args.pty else None
    try:
        with ctx.sandbox.open_dir(args.cwd or ".", ctx.cwd) as workdir:
            env = environment(ctx, workdir.path, "")
            env.update(args.env or {})
            if pty is not None:
                env["TERM"] = "xterm-256color"

            def popen(fds: dict[str, int], marker: str) -> subprocess.Popen[bytes]:
                env[process_tree.MARKER_ENV] = marker  # the tree's third trace (process_tree.py)
                return subprocess.Popen(
                    [SHELL, "-c", args.command],
                    cwd=f"/proc/self/fd/{workdir.fd}" if PROC_FD else workdir.path,
                    env=env,
                    stdin=fds["stdin"],
                    stdout=fds["stdout"],
                    stderr=fds["stderr"],
                    start_new_session=True,  # its own group and session: signalled and killed as one
                    pass_fds=(workdir.fd,) if PROC_FD else (),
                    preexec_fn=_controlling_tty if pty is not None else None,
                )

            proc = table.start(
                command=args.command, session_id=session_id, run_id=run_id, spool_dir=spool_dir, popen=popen, pty=pty
            )
            spool_dir = None  # type: ignore[assignment]  # the table owns it now
            shown_cwd = workdir.path
    finally:
        if spool_dir is not None:
            spool.close()
    return {
        "process_id": proc.process_id,
        "pid": proc.popen.pid,
        "started_at": proc.started_at,
        "cwd": shown_cwd,
        "pty": proc.pty,
        "spool_file": proc.spool_path,
        "running_processes": table.running_count(),
    }


def _controlling_tty() -> None:
    # In the child, after setsid(): the PTY on fd 0 becomes its controlling terminal, so ^C
    # written to it interrupts and a resize reaches it (SIGWINCH).
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def process_output(ctx: ToolContext, args: ProcessOutputArgs) -> dict[str, Any]:
    session_id, _, _ = _session(ctx)
    proc = _table(ctx).get(session_id, args.process_id)
    since = args.since or 0
    if args.wait_s and proc.running:
        proc.ring.wait(since, args.wait_s)
    answer = output_answer(proc, since, args.max_bytes or PROCESS_READ_MAX_BYTES)
    return _with_exit(ctx, proc, answer)


def process_write(ctx: ToolContext, args: ProcessWriteArgs) -> dict[str, Any]:
    session_id, _, _ = _session(ctx)
    proc = _table(ctx).get(session_id, args.process_id)
    data = args.data.encode("utf-8", "surrogateescape")
    written = _table(ctx).write(proc, data, args.close_stdin)
    answer: dict[str, Any] = {"process_id": proc.process_id, "written": written}
    if written < len(data):
        answer["note"] = f"Only {written} of {len(data)} bytes were taken: the process is not reading its input."
    return _with_exit(ctx, proc, answer)


def process_resize(ctx: ToolContext, args: ProcessResizeArgs) -> dict[str, Any]:
    session_id, _, _ = _session(ctx)
    proc = _table(ctx).get(session_id, args.process_id)
    _table(ctx).resize(proc, args.cols, args.rows)
    return _with_exit(ctx, proc, {"process_id": proc.process_id, "cols": args.cols, "rows": args.rows})


def process_signal(ctx: ToolContext, args: ProcessSignalArgs) -> dict[str, Any]:
    session_id, _, _ = _session(ctx)
    proc = _table(ctx).get(session_id, args.process_id)
    delivered = _table(ctx).signal(proc, args.signal)
    if args.signal == "KILL" and delivered:
        proc.finished.wait(5.0)  # the answer then tells the exit, and nothing of the group is left
    answer: dict[str, Any] = {"process_id": proc.process_id, "signal": args.signal, "delivered": delivered}
    answer.update(running=proc.running, exit_code=None if proc.running else proc.exit_code)
    return _with_exit(ctx, proc, answer)


def process_list(ctx: ToolContext, args: ProcessListArgs) -> dict[str, Any]:
    session_id, _, _ = _session(ctx)
    table = _table(ctx)
    items = []
    for proc in table.of_session(session_id):
        item = proc.summary()
        if announce_exit(proc):
            item["exit_new"] = True
        items.append(item)
    return {"processes": items, "running_processes": table.running_count()}
