"""Deciding a session's skill links (pure).

`runtime/{uid}/{sid}/skills/{name}` is an absolute symlink to the user's view (system skills)
or to `userskills/{uid}/{name}` (personal skills). The directory belongs to the sandbox user,
who may put things there too: only symlinks that point into the user's own skill places are
ours to replace or remove.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkChanges:
    create: tuple[tuple[str, str], ...]  # (name, target): new or pointing elsewhere
    remove: tuple[str, ...]  # managed links whose skill is gone or failed


def is_managed_target(target: str, managed_roots: Iterable[str]) -> bool:
    return any(target.startswith(root.rstrip("/") + "/") for root in managed_roots)


def plan_link_changes(
    desired: Mapping[str, str], existing: Mapping[str, str], managed_roots: Iterable[str]
) -> LinkChanges:
    """`existing` maps the names of the symlinks now in the directory to their targets."""
    roots = tuple(managed_roots)
    create = tuple(sorted((name, target) for name, target in desired.items() if existing.get(name) != target))
    remove = tuple(
        sorted(name for name, target in existing.items() if name not in desired and is_managed_target(target, roots))
    )
    return LinkChanges(create, remove)
