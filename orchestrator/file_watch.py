"""A background thread that calls back when files under some paths change (watchfiles)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import watchfiles

from orchestrator.log import kv

log = logging.getLogger(__name__)

ChangeCallback = Callable[[set[Path]], None]


class FileWatcher:
    """Watches directories (recursively) and hands each batch of changed paths to a callback.

    `only` narrows the batch to the given files, which is how a single file is watched:
    editors replace files by rename, so the directory holding it is what gets watched.
    """

    def __init__(
        self,
        name: str,
        directories: Iterable[Path],
        on_change: ChangeCallback,
        *,
        only: Iterable[Path] | None = None,
        debounce_ms: int = 50,
        resolve: bool = True,
    ) -> None:
        self.name = name
        self._directories = [Path(d) for d in directories]
        self._on_change = on_change
        self._only = {Path(p).resolve() for p in only} if only is not None else None
        self._debounce_ms = debounce_ms
        # resolve=False hands over paths as reported: resolving a changed symlink would name
        # its target, not the place that changed.
        self._resolve = resolve
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, *, wait: bool = True) -> None:
        for directory in self._directories:
            directory.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.name}", daemon=True)
        self._thread.start()
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 5) -> bool:
        """Whether the watch is up (changes from now on are seen)."""
        return self._ready.wait(timeout=timeout)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            watcher = watchfiles.watch(
                *self._directories,
                stop_event=self._stop,
                debounce=self._debounce_ms,
                step=20,
                yield_on_timeout=True,
                rust_timeout=200,
                raise_interrupt=False,
            )
            for changes in watcher:
                self._ready.set()
                paths = {Path(p).resolve() if self._resolve else Path(p) for _, p in changes}
                if self._only is not None:
                    paths &= self._only
                if not paths:
                    continue
                try:
                    self._on_change(paths)
                except Exception:  # a bad callback must not kill the watcher
                    log.exception("file watch callback failed %s", kv(watcher=self.name))
        finally:
            self._ready.set()
