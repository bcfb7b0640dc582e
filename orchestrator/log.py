"""Structured key=value logging. Anything about a run carries session=, owner=, runtime_user=."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def kv(**fields: Any) -> str:
    """`a=1 b="two words"`: values with spaces or quotes are quoted."""
    parts = []
    for key, value in fields.items():
        text = "null" if value is None else str(value)
        if text == "" or any(c in text for c in ' "=\n'):
            text = '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
        parts.append(f"{key}={text}")
    return " ".join(parts)


class RunLogger(logging.LoggerAdapter):
    """Appends the run's identity fields to every message."""

    def process(self, msg: str, kwargs: MutableMapping[str, Any]) -> tuple[str, MutableMapping[str, Any]]:
        return f"{msg} {kv(**self.extra)}", kwargs


def run_logger(logger: logging.Logger, *, session: str, owner: int, runtime_user: int, **more: Any) -> RunLogger:
    return RunLogger(logger, {"session": session, "owner": owner, "runtime_user": runtime_user, **more})


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format=LOG_FORMAT)
