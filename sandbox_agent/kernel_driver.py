"""One code kernel, driven for the sandbox agent (docs/interpreter.md).

This file runs with the USER's python, not the agent's: the agent's own environment stays
free of Jupyter. It imports only the standard library, plus `jupyter_client` (which ipykernel
brings) for a python kernel. It talks to the agent over its stdin and a duplicate of its
stdout, one JSON object a line; the kernel and its children get /dev/null as stdout (what
they print reaches the agent through the Jupyter protocol, never as protocol lines).

    python3 kernel_driver.py python|bash RUNTIME_DIR

Agent -> driver: {"op": "execute", "code": str} (one at a time) and {"op": "interrupt"}
(any time). Driver -> agent: {"ev": "ready"} once, or {"ev": "fatal", "message"}; during an
execution {"ev": "stream", "name", "text"}, {"ev": "display", "data"}, {"ev": "result",
"data"}, {"ev": "error", "ename", "evalue", "traceback"}; then {"ev": "done", "status"}
or {"ev": "died"} when the kernel is gone.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import threading

# The agent's package is this script's directory: its modules must not shadow the user's.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

POLL_S = 0.2
STARTUP_TIMEOUT_S = 60.0
# A figure comes back at the size it was made (the inline backend's default crops it).
PYTHON_SETUP = (
    "try:\n"
    "    get_ipython().run_line_magic('config', \"InlineBackend.print_figure_kwargs = {'bbox_inches': None}\")\n"
    "except Exception:\n"
    "    pass\n"
)


class Channel:
    """The protocol's two ends: lines in from the agent, lines out on a private fd."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", encoding="utf-8", errors="surrogateescape", buffering=1)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 1)  # what a kernel or its children write to fd 1 never lands in the protocol
        os.close(devnull)
        self._lock = threading.Lock()
        self.executions: "queue.Queue[str | None]" = queue.Queue()
        self.on_interrupt = lambda: None

    def send(self, **event: object) -> None:
        line = json.dumps(event, ensure_ascii=False, default=str)
        with self._lock:
            self._out.write(line + "\n")
            self._out.flush()

    def read_forever(self) -> None:
        for line in sys.stdin:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("op") == "interrupt":
                self.on_interrupt()
            elif message.get("op") == "execute" and isinstance(message.get("code"), str):
                self.executions.put(message["code"])
        self.executions.put(None)  # the agent closed our stdin: time to go


# --- python: ipykernel through jupyter_client ---------------------------------------------------


def transport(runtime_dir: str) -> dict:
    """Unix sockets in the kernel's private directory (no TCP port on a loopback other sandboxes
    may share), unless their paths would pass the 107 bytes a socket's path may have (a deep
    data dir): then TCP on 127.0.0.1, where every message is still signed with the
    connection file's key (0600 in that private directory)."""
    prefix = os.path.join(runtime_dir, "kernel")
    if len(os.fsencode(prefix)) + len("-65535") <= 107:
        return {"transport": "ipc", "ip": prefix}
    return {"transport": "tcp", "ip": "127.0.0.1"}


def run_python(channel: Channel, runtime_dir: str) -> None:
    try:
        from jupyter_client.manager import KernelManager
    except ImportError as exc:
        channel.send(ev="fatal", message=f"This python has no jupyter_client/ipykernel ({exc}).", missing="ipykernel")
        return
    try:
        import ipykernel  # noqa: F401 - only to say clearly what is missing
    except ImportError as exc:
        channel.send(ev="fatal", message=f"This python has no ipykernel ({exc}).", missing="ipykernel")
        return
    manager = KernelManager(
        kernel_name="python3", connection_file=os.path.join(runtime_dir, "kernel.json"), **transport(runtime_dir)
    )
    try:
        # History in memory: IPython's default commits every cell to a SQLite file in the
        # home directory, which cost about 4 ms of each call (bench/run_code.py).
        manager.start_kernel(cwd=os.getcwd(), env=dict(os.environ), extra_arguments=["--HistoryManager.hist_file=:memory:"])
        client = manager.client()
        client.start_channels()
        client.wait_for_ready(timeout=STARTUP_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - any failure to start is told, not raised
        channel.send(ev="fatal", message=f"The python kernel did not start: {type(exc).__name__}: {exc}")
        try:
            manager.shutdown_kernel(now=True)
        except Exception:  # noqa: BLE001
            pass
        return
    channel.on_interrupt = manager.interrupt_kernel
    _execute_python(client, manager, PYTHON_SETUP, None)
    channel.send(ev="ready", pid=manager.provisioner.process.pid if manager.provisioner else None)
    try:
        while True:
            code = channel.executions.get()
            if code is None:
                break
            if not _execute_python(client, manager, code, channel):
                channel.send(ev="died")
                break
    finally:
        try:
            manager.shutdown_kernel(now=True)
        except Exception:  # noqa: BLE001
            pass


def _execute_python(client, manager, code: str, channel: "Channel | None") -> bool:  # type: ignore[no-untyped-def]
    """Run one cell, forwarding its messages; False when the kernel died meanwhile."""
    msg_id = client.execute(code, store_history=channel is not None, allow_stdin=False)
    status = "ok"
    idle = False
    while not idle:
        try:
            message = client.get_iopub_msg(timeout=POLL_S)
        except queue.Empty:
            if not manager.is_alive():
                return False
            continue
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = message["msg_type"], message["content"]
        if kind == "status" and content.get("execution_state") == "idle":
            idle = True
        elif channel is None:
            continue
        elif kind == "stream":
            channel.send(ev="stream", name=content.get("name", "stdout"), text=content.get("text", ""))
        elif kind in ("display_data", "update_display_data"):
            channel.send(ev="display", data=content.get("data", {}))
        elif kind == "execute_result":
            channel.send(ev="result", data=content.get("data", {}))
        elif kind == "error":
            status = "error"
            channel.send(
                ev="error", ename=content.get("ename", ""), evalue=content.get("evalue", ""),
                traceback=content.get("traceback", []),
            )  # fmt: skip
    if channel is not None:
        channel.send(ev="done", status=status)
    return True


# --- bash: one shell that keeps its cwd and variables ------------------------------------------


def run_bash(channel: Channel, runtime_dir: str) -> None:
    token = os.urandom(8).hex()
    shell = subprocess.Popen(
        ["bash", "--noprofile", "--norc"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own group: an interrupt reaches what it runs
    )
    assert shell.stdin is not None and shell.stdout is not None and shell.stderr is not None
    done: "queue.Queue[int]" = queue.Queue()
    marker = f"\x01{token} ".encode()

    def pump(stream, name: str) -> None:  # type: ignore[no-untyped-def]
        for line in iter(stream.readline, b""):
            at = line.find(marker)
            if at >= 0:
                if at:
                    channel.send(ev="stream", name=name, text=line[:at].decode("utf-8", "replace"))
                if name == "stdout":
                    done.put(int(line[at + len(marker) :].strip() or b"1"))
                continue
            channel.send(ev="stream", name=name, text=line.decode("utf-8", "replace"))

    for stream, name in ((shell.stdout, "stdout"), (shell.stderr, "stderr")):
        threading.Thread(target=pump, args=(stream, name), daemon=True).start()

    def interrupt() -> None:
        try:
            os.killpg(shell.pid, signal.SIGINT)
        except OSError:
            pass

    channel.on_interrupt = interrupt
    cell = os.path.join(runtime_dir, "cell.sh")
    # An interrupt stops the cell (`return` ends the sourced file), not this shell, which goes
    # on to the marker line.
    shell.stdin.write(b"trap 'echo interrupted >&2; return 130 2>/dev/null' INT\n")
    shell.stdin.flush()
    channel.send(ev="ready", pid=shell.pid)
    while True:
        code = channel.executions.get()
        if code is None:
            break
        with open(cell, "w", encoding="utf-8", errors="surrogateescape") as file:
            file.write(code + "\n")
        # `source`: cwd and exported variables stay in this shell; /dev/null: the cell's
        # commands never read the lines meant for the shell.
        line = f"source {cell} </dev/null\nprintf '\\001{token} %d\\n' $?\n"
        try:
            shell.stdin.write(line.encode())
            shell.stdin.flush()
        except OSError:
            channel.send(ev="died")
            break
        code_status = None
        while code_status is None:
            try:
                code_status = done.get(timeout=POLL_S)
            except queue.Empty:
                if shell.poll() is not None:
                    break
        if code_status is None:
            channel.send(ev="died")
            break
        if code_status != 0:
            channel.send(ev="error", ename="ExitStatus", evalue=str(code_status), traceback=[])
        channel.send(ev="done", status="ok" if code_status == 0 else "error")
    try:
        os.killpg(shell.pid, signal.SIGKILL)
    except OSError:
        pass


def main() -> None:
    language, runtime_dir = sys.argv[1], sys.argv[2]
    # Interrupts are for the kernel, not for us. A handler, not SIG_IGN: an ignored signal
    # would stay ignored in the kernel we start.
    signal.signal(signal.SIGINT, lambda *_: None)
    channel = Channel()
    threading.Thread(target=channel.read_forever, daemon=True).start()
    if language == "bash":
        run_bash(channel, runtime_dir)
    else:
        run_python(channel, runtime_dir)


if __name__ == "__main__":
    main()
