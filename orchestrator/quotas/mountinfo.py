"""Reading /proc/self/mountinfo: which of our images and binds are mounted (pure parsing apart
from the one read), so a restarted orchestrator adopts them and never mounts twice."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MountEntry:
    mount_id: int
    device: str  # "major:minor"
    root: str  # the directory of the filesystem mounted here ("/" or "/home" for a bind)
    mount_point: Path
    fstype: str
    source: str


def _unescape(text: str) -> str:
    # The kernel writes space, tab, newline and backslash as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text


def parse_mountinfo(text: str) -> list[MountEntry]:
    entries = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-")
            entries.append(
                MountEntry(
                    mount_id=int(fields[0]),
                    device=fields[2],
                    root=_unescape(fields[3]),
                    mount_point=Path(_unescape(fields[4])),
                    fstype=fields[sep + 1],
                    source=_unescape(fields[sep + 2]),
                )
            )
        except (ValueError, IndexError):
            continue  # a line we do not understand is not one of ours
    return entries


def read_mounts() -> list[MountEntry]:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        return parse_mountinfo(f.read())


def top_mount_at(entries: list[MountEntry], path: Path) -> MountEntry | None:
    """What is visible at `path`: the last mount on it (mounts stack)."""
    found = None
    for entry in entries:
        if entry.mount_point == path:
            found = entry
    return found
