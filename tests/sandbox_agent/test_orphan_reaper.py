"""The agent reaps the orphans it adopts as they die, and never a child a Popen waits for
(finding 14: a fork-hopper's zombies, reaped only at a call's end, filled the sandbox's pids
within one call). A real agent process (child subreaper) runs the calls."""

from __future__ import annotations

import threading

from tests.sandbox_agent.conftest import LiveAgent

HOPS = 3000
# Every generation forks its successor and exits: each becomes the agent's zombie (the agent
# adopted it when its parent exited). The last one counts the agent's zombie children.
ZOMBIE_HOPPER = (
    "import os, sys\n"
    "agent = sys.argv[1]\n"
    f"for _ in range({HOPS}):\n"
    "    if os.fork(): os._exit(0)\n"
    "def zombie_child_of_agent(pid):\n"
    "    try: stat = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()\n"
    "    except OSError: return False\n"
    "    return stat[0] == 'Z' and stat[1] == agent\n"
    "found = sum(zombie_child_of_agent(p) for p in os.listdir('/proc') if p.isdigit())\n"
    "open('zombies.txt', 'w').write(str(found))\n"
)


def test_finding14_orphans_are_reaped_as_they_die_and_exit_codes_are_kept(live_agent: LiveAgent) -> None:
    cwd = str(live_agent.tree.workdir)
    (live_agent.tree.workdir / "hop.py").write_text(ZOMBIE_HOPPER)
    codes: list[int] = []

    def exits() -> None:
        for _ in range(20):
            codes.append(live_agent.client.call("shell", {"command": "exit 7"}, cwd=cwd)["exit_code"])

    beside = threading.Thread(target=exits)
    beside.start()
    command = (
        'rm -f zombies.txt; python3 hop.py "$PPID" & '
        "for i in $(seq 600); do [ -s zombies.txt ] && break; sleep 0.05; done; cat zombies.txt"
    )
    answer = live_agent.client.call("shell", {"command": command, "timeout_s": 60}, cwd=cwd)
    beside.join(60)
    assert answer["stdout"] != "", answer
    assert int(answer["stdout"]) < 50, f"{answer['stdout']} zombies piled up under the agent"
    assert codes == [7] * 20  # the reaper never took a shell's exit status from its Popen
