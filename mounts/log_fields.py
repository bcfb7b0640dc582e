"""key=value log fields for `mounts` (the same format as `orchestrator.log.kv`; `mounts`
does not depend on `orchestrator`)."""

from __future__ import annotations

from typing import Any


def kv(**fields: Any) -> str:
    parts = []
    for key, value in fields.items():
        text = "null" if value is None else str(value)
        if text == "" or any(c in text for c in ' "=\n'):
            text = '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
        parts.append(f"{key}={text}")
    return " ".join(parts)
