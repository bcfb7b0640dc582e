"""Structured key=value logging. Anything about a run carries session=, owner=, runtime_user=."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from mounts.log_fields import kv

__all__ = ["LOG_FORMAT", "RunLogger", "configure_logging", "kv", "run_logger"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class RunLogger(logging.LoggerAdapter):
    """Appends the run's identity fields to every message."""

    def process(self, msg: str, kwargs: MutableMapping[str, Any]) -> tuple[str, MutableMapping[str, Any]]:
        return f"{msg} {kv(**self.extra)}", kwargs


def run_logger(logger: logging.Logger, *, session: str, owner: int, runtime_user: int, **more: Any) -> RunLogger:
    return RunLogger(logger, {"session": session, "owner": owner, "runtime_user": runtime_user, **more})


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format=LOG_FORMAT)
