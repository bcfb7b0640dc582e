"""The containers' seccomp profile: io_uring (a large kernel attack surface reachable without
any capability; this engine's default profile allows it) is denied, and so are the namespace
and kernel-facility calls the engine's default denies. Through the API, from a sandbox shell."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.api_calls import group_session, start_run, tool

pytestmark = pytest.mark.docker

# x86_64 and aarch64 share these numbers (the generic syscall table).
PROBE = """python3 - <<'PY'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
for name, number, args in (("io_uring_setup", 425, (1, params)), ("io_uring_enter", 426, (0, 0, 0, 0, None, 0)),
                           ("io_uring_register", 427, (0, 0, None, 0))):
    result = libc.syscall(number, *args)
    print(name, "ALLOWED" if result >= 0 else os.strerror(ctypes.get_errno()))
print("unshare", "ALLOWED" if libc.unshare(0x10000000) == 0 else os.strerror(ctypes.get_errno()))
PY"""


def test_item_seccomp_io_uring_is_denied_in_a_container(docker_client: TestClient) -> None:
    run = start_run(docker_client, group_session(docker_client), trigger="web")
    answer = tool(docker_client, run["run_id"], "shell", command=PROBE)
    assert answer["ok"], answer
    lines = dict(line.split(" ", 1) for line in answer["result"]["stdout"].splitlines())
    for name in ("io_uring_setup", "io_uring_enter", "io_uring_register"):
        assert lines[name] in ("Operation not permitted", "Function not implemented"), lines
    assert lines["unshare"] == "Operation not permitted", lines  # no user namespaces either


# What the engine's default profile denies or bounds, and the agent's memory: refused to a
# sandbox's own processes (x86_64 and aarch64 numbers where they differ are chosen at run time).
TENANT_PROBE = r"""AGENT=AGENT_PID python3 - <<'PY'
import ctypes, os, platform, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def outcome(result):
    return "ALLOWED" if result >= 0 else os.strerror(ctypes.get_errno())
try:
    socket.socket(40, socket.SOCK_STREAM).close()  # AF_VSOCK: the hypervisor, on a VM host
    print("vsock ALLOWED")
except OSError as exc:
    print("vsock", os.strerror(exc.errno))
libc.personality.argtypes = [ctypes.c_ulong]  # as the C library declares it
print("personality", outcome(libc.personality(0x0040000)))  # ADDR_NO_RANDOMIZE
print("personality_query", outcome(libc.personality(0xffffffff)))
memfd_secret = 447
print("memfd_secret", outcome(libc.syscall(memfd_secret, 0)))
agent = int(os.environ["AGENT"])
print("agent", open(f"/proc/{agent}/cmdline", "rb").read().split(b"\0")[:3])
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
result = libc.ptrace(PTRACE_ATTACH, agent, None, None)
print("ptrace", outcome(result))
if result == 0:
    os.waitpid(agent, 0)
    libc.ptrace(PTRACE_DETACH, agent, None, None)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(64)
try:
    address = int(open(f"/proc/{agent}/maps").readline().split("-")[0], 16)
except OSError:
    address = 0x400000
local, remote = iovec(ctypes.cast(buf, ctypes.c_void_p), 64), iovec(address, 64)
libc.process_vm_readv.restype = ctypes.c_ssize_t
print("process_vm_readv", outcome(libc.process_vm_readv(agent, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)))
for name in ("mem", "environ", "fd/0"):
    try:
        open(f"/proc/{agent}/{name}", "rb").close()
        print("open_" + name, "ALLOWED")
    except OSError as exc:
        print("open_" + name, os.strerror(exc.errno))
print("unix", socket.socket(socket.AF_UNIX).fileno() > 0, "inet6", socket.socket(socket.AF_INET6).fileno() > 0)
PY"""


def test_vsock_personality_memfd_secret_and_the_agents_memory_are_refused(docker_client: TestClient) -> None:
    run = start_run(docker_client, group_session(docker_client), trigger="web")
    # The call's shell is the agent's child: its parent is the agent.
    answer = tool(docker_client, run["run_id"], "shell", command=TENANT_PROBE.replace("AGENT_PID", "$PPID"))
    assert answer["ok"], answer
    lines = dict(line.split(" ", 1) for line in answer["result"]["stdout"].splitlines())
    assert "sandbox_agent" in lines["agent"], lines
    denied = "Operation not permitted"
    assert lines["vsock"] == denied, lines
    assert lines["personality"] == denied, lines
    assert lines["personality_query"] == "ALLOWED", lines  # reading it stays possible
    assert lines["memfd_secret"] == denied, lines
    assert lines["ptrace"] == denied, lines
    assert lines["process_vm_readv"] == denied, lines
    for name in ("mem", "environ", "fd/0"):
        assert lines["open_" + name] == "Permission denied", lines
    assert lines["unix"] == "True inet6 True", lines  # ordinary sockets still work


# The host kernel's device events (NETLINK_KOBJECT_UEVENT) are broadcast to every network
# namespace the initial user namespace owns, a container's included, and need no capability to
# hear: another user's loop image attached or resized, a veth pair made for a container. The
# sandbox listens while the host attaches a loop device of its own.
UEVENT_PROBE = r"""python3 - <<'PY'
import os, socket
try:
    listener = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 15)  # NETLINK_KOBJECT_UEVENT
    listener.bind((0, 1))
except OSError as exc:
    print("uevent", os.strerror(exc.errno))
else:
    listener.settimeout(4)
    try:
        print("uevent HEARD", listener.recv(4096).replace(b"\0", b" ")[:120])
    except TimeoutError:
        print("uevent OPEN")
route = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)  # NETLINK_ROUTE: interfaces, addresses
print("route", route.fileno() > 0)
PY"""


def _attach_a_loop_device(image: Path) -> None:
    """A host event any listener hears (a loop device's change), if the host has loop devices."""
    time.sleep(1.5)
    if shutil.which("losetup") is None:
        return
    image.write_bytes(b"\0" * 2**20)
    attached = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True)
    if attached.returncode == 0:
        time.sleep(0.3)
        subprocess.run(["losetup", "-d", attached.stdout.strip()], check=False)


def test_a_sandbox_does_not_hear_the_hosts_device_events(docker_client: TestClient, tmp_path: Path) -> None:
    run = start_run(docker_client, group_session(docker_client), trigger="web")
    host = threading.Thread(target=_attach_a_loop_device, args=(tmp_path / "loop.img",))
    host.start()
    try:
        answer = tool(docker_client, run["run_id"], "shell", command=UEVENT_PROBE)
    finally:
        host.join()
    assert answer["ok"], answer
    lines = dict(line.split(" ", 1) for line in answer["result"]["stdout"].splitlines())
    assert lines["uevent"] == "Operation not permitted", lines
    assert lines["route"] == "True", lines  # interfaces and addresses stay readable (getifaddrs)
