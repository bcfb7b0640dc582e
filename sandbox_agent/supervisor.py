"""The sandbox supervisor: PID 1 of a docker sandbox, out of the tenant's reach.

`python -m sandbox_agent.supervisor --lease FILE -- AGENT COMMAND...`

Everything in a sandbox runs as the tenant's uid, the agent included, so the tenant can call,
signal, trace and read its agent. What must hold whatever the tenant does lives here instead:
- The dead-man switch. The orchestrator renews a lease (an expiry time) in a root-owned file
  the sandbox can only read, for every sandbox it manages, as long as it lives. Once the lease
  has expired (no orchestrator renews it; a missing or garbled lease counts as expired), this
  process ends the container: SIGTERM to the agent, then SIGKILL to every process, then exit 0
  (a clean stop: the next call starts the same container again).
- Nothing in the sandbox can stop it: inside its PID namespace, PID 1 receives no signal it has
  no handler for (SIGKILL and SIGSTOP included), and the signals it waits for are acted on only
  when they carry no sender pid, as the engine's `docker stop` does. (A tenant can forge that
  with `rt_sigqueueinfo`; all it gains is a stop of its own agent, which it can do anyway: the
  lease, not a signal, ends the container.) It is not dumpable,
  so the same-uid tenant can neither ptrace it nor open its /proc files (memory, descriptors).
- The container's stdout is the engine's log pipe: only this process holds it. The agent's
  output reaches it through a pipe and is passed on within a byte budget, so a sandbox that
  floods its output spends its own CPU, never the engine's.
It also starts the agent, reaps orphaned zombies, forwards the engine's stop signal to the
agent and exits with the agent's status when the agent ends.

Standard library only, and little of it: it stays resident in every container.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import stat
import sys
import threading
import time
from dataclasses import dataclass

LEASE_READ_MAX = 256
PR_SET_DUMPABLE = 4
# A clean stop: `docker_spec.decide` starts the same container again on the next call.
EXPIRED_EXIT = 0
AGENT_STOP_GRACE_S = 2.0
# The engine's log gets at most this much of the sandbox's output: a burst, then a trickle.
OUTPUT_BURST_BYTES = 64 * 1024
OUTPUT_BYTES_PER_S = 1024
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
WAITED = {signal.SIGCHLD, *STOP_SIGNALS}


# --- deciding (pure) ------------------------------------------------------------------------


@dataclass(frozen=True)
class Lease:
    expires_at: float  # seconds since the epoch (the host's and the container's clock)
    check_s: float  # how often the supervisor looks


def dead_man_check_s(limit_s: float) -> float:
    """How often a dead-man switch looks: a tenth of its limit, within [0.1, 10] s."""
    return min(max(limit_s / 10, 0.1), 10.0)


def lease_text(expires_at: float, check_s: float) -> str:
    return json.dumps({"expires_at": expires_at, "check_s": check_s}) + "\n"


def parse_lease(raw: bytes) -> Lease | None:
    """The lease in `raw`, or None when it is not one (which counts as expired)."""
    try:
        body = json.loads(raw.decode("ascii"))
        expires_at, check_s = float(body["expires_at"]), float(body["check_s"])
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        return None
    if not (math.isfinite(expires_at) and math.isfinite(check_s)) or check_s <= 0:
        return None
    return Lease(expires_at, min(max(check_s, 0.1), 10.0))


def lease_expired(lease: Lease | None, now: float) -> bool:
    return lease is None or now >= lease.expires_at


class OutputBudget:
    """A token bucket of bytes: `take(n, now)` answers how many of `n` bytes may pass."""

    def __init__(self, burst: int = OUTPUT_BURST_BYTES, per_s: float = OUTPUT_BYTES_PER_S, now: float = 0.0) -> None:
        self.burst, self.per_s = burst, per_s
        self._tokens, self._at = float(burst), now

    def take(self, n: int, now: float) -> int:
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_s)
        self._at = now
        allowed = max(0, min(n, int(self._tokens)))
        self._tokens -= allowed
        return allowed


def exit_code(wait_status: int) -> int:
    """The shell's convention: the exit code, or 128 + the signal that ended the process."""
    code = os.waitstatus_to_exitcode(wait_status)
    return code if code >= 0 else 128 - code


# --- doing ----------------------------------------------------------------------------------


def read_lease(path: str) -> Lease | None:
    """The lease file: a plain file, read without following a link, bounded."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return parse_lease(os.read(fd, LEASE_READ_MAX))
    except OSError:
        return None
    finally:
        os.close(fd)


def make_undumpable() -> None:
    """No ptrace, no /proc/<pid>/mem, fd or environ for processes of the same uid."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def say(message: str) -> None:
    """One line of our own on the engine's log (stderr), outside the output budget."""
    try:
        os.write(2, f"sandbox-supervisor: {message}\n".encode())
    except OSError:
        pass


def relay_output(read_fd: int, budget: OutputBudget) -> None:
    """Pass the agent's output on to the engine's log within `budget`; the rest is read and
    dropped (the agent must never block on a full pipe), and the drop is reported."""
    dropped = 0
    while True:
        try:
            chunk = os.read(read_fd, 65536)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        allowed = budget.take(len(chunk), time.monotonic())
        dropped += len(chunk) - allowed
        if allowed and dropped and budget.take(80, time.monotonic()):
            say(f"{dropped} bytes of the sandbox's output were dropped")
            dropped = 0
        try:
            if allowed:
                os.write(2, chunk[:allowed])
        except OSError:
            pass
    if dropped:
        say(f"{dropped} bytes of the sandbox's output were dropped")


def start_agent(command: list[str], output_fd: int) -> int:
    pid = os.fork()
    if pid == 0:  # the agent: its output to our relay, no signal blocked, exec'd (dumpable again)
        try:
            os.dup2(output_fd, 1)
            os.dup2(output_fd, 2)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            os.execvp(command[0], command)
        except OSError as exc:
            say(f"the agent did not start: {exc}")
        finally:
            os._exit(127)
    return pid


class Supervisor:
    def __init__(self, lease_path: str, command: list[str]) -> None:
        self.lease_path = lease_path
        self.command = command
        self.agent_pid = 0
        self.agent_status: int | None = None

    def run(self) -> int:
        make_undumpable()
        signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)  # taken with sigtimedwait, never handled
        read_fd, write_fd = os.pipe()
        self.agent_pid = start_agent(self.command, write_fd)
        os.close(write_fd)
        relay = threading.Thread(target=relay_output, args=(read_fd, OutputBudget(now=time.monotonic())), daemon=True)
        relay.start()
        next_check = 0.0
        while self.agent_status is None:
            now = time.monotonic()
            if now >= next_check:
                lease = read_lease(self.lease_path)
                if lease_expired(lease, time.time()):
                    say("the orchestrator's lease has expired (no orchestrator renews it): ending the sandbox")
                    self.end_all()
                    return EXPIRED_EXIT
                assert lease is not None
                next_check = now + lease.check_s
            info = signal.sigtimedwait(WAITED, max(next_check - now, 0.01))
            if info is None:
                continue
            if info.si_signo == signal.SIGCHLD:
                self.reap()
            elif info.si_pid == 0:  # no sender pid (the engine; forgeable): stop the agent
                self.signal_agent(info.si_signo)
            # A stop signal from inside the sandbox with its pid is ignored; a forged one only
            # stops the tenant's own agent. Only the lease ends this container.
        self.kill_the_rest()
        relay.join(timeout=1)
        return exit_code(self.agent_status)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.agent_pid:
                self.agent_status = status

    def signal_agent(self, signo: int) -> None:
        try:
            os.kill(self.agent_pid, signo)
        except ProcessLookupError:
            pass

    def end_all(self) -> None:
        """SIGTERM to the agent (it cleans up), a short grace, then SIGKILL to everyone."""
        self.signal_agent(signal.SIGTERM)
        deadline = time.monotonic() + AGENT_STOP_GRACE_S
        while self.agent_status is None and time.monotonic() < deadline:
            if signal.sigtimedwait({signal.SIGCHLD}, max(deadline - time.monotonic(), 0.01)) is not None:
                self.reap()
        self.kill_the_rest()

    def kill_the_rest(self) -> None:
        """SIGKILL to every process of the container. kill(-1) only as PID 1 of a PID namespace,
        where it means exactly that; anywhere else (a test run on a host) it would reach every
        process of the uid outside: there only the agent is killed."""
        try:
            os.kill(-1 if os.getpid() == 1 else self.agent_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.reap()


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "--lease" or argv[2] != "--":
        say("usage: python -m sandbox_agent.supervisor --lease FILE -- COMMAND...")
        return 64
    return Supervisor(argv[1], argv[3:]).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
