"""What a sandbox runs to look for a secret: its environment, every file it can read under
the given roots (`--mounts`: every mount point it has, but /, /proc, /sys and /dev), and the
environment and command line of every process it sees. The secret travels base64-encoded, so
the search's own command line does not hold it."""

from __future__ import annotations

import base64
import shlex

SEARCH_SCRIPT = r"""
import base64, os, sys
secret = base64.b64decode(sys.argv[1])
found, searched = [], 0
if secret in "\\0".join(f"{k}={v}" for k, v in os.environ.items()).encode():
    found.append("env")
roots = [r for r in sys.argv[2:] if r != "--mounts"]
if "--mounts" in sys.argv[2:]:
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    roots += [p for p in points if p != "/" and not p.startswith(("/proc", "/sys", "/dev"))]
for root in roots:
    for top, dirs, files in os.walk(root, onerror=lambda e: None):
        if top.startswith(("/proc", "/sys")):
            dirs[:] = []
            continue
        for name in files:
            path = os.path.join(top, name)
            try:
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                with open(path, "rb") as f:
                    searched += 1
                    if secret in f.read():
                        found.append("file " + path)
            except OSError:
                pass
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        for part in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    if secret in f.read():
                        found.append(f"proc {pid} {part}")
            except OSError:
                pass
print("GITHUB_TOKEN=" + os.environ.get("GITHUB_TOKEN", ""))
print(f"searched {searched} files in {len(roots)} roots: " + ("FOUND " + repr(found) if found else "nothing found"))
"""


def sandbox_search(secret: str, roots: list[str]) -> str:
    encoded = base64.b64encode(secret.encode()).decode()
    return " ".join(["python3", "-c", shlex.quote(SEARCH_SCRIPT), encoded, *map(shlex.quote, roots)])
