"""The `expose_port` tool: a preview link to a port the runtime user's sandbox listens on."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.previews.model import PreviewRecord
from orchestrator.previews.service import PreviewService
from orchestrator.tools.registry import ToolCall, ToolPlace, ToolRegistry, ToolSpec


class ExposePortArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    port: int = Field(..., ge=1, le=65535, description="The port your server listens on inside the sandbox (127.0.0.1).")
    ttl_s: int | None = Field(None, gt=0, description="How long the link lives, in seconds (default: the server's).")


def preview_answer(previews: PreviewService, record: PreviewRecord) -> dict[str, Any]:
    """The wire shape of a preview (the tool's result, and the API's answer)."""
    return {"preview_id": record.preview_id, "url": previews.link(record), "port": record.port, "expires_at": record.expires_at}


def register_preview_tools(registry: ToolRegistry, previews: PreviewService) -> None:
    def expose_port(call: ToolCall) -> dict[str, Any]:
        arguments = call.arguments
        assert isinstance(arguments, ExposePortArgs)
        record = previews.create(call.run, arguments.port, arguments.ttl_s, actor=f"run:{call.run.run_id}")
        return preview_answer(previews, record)

    registry.register(
        ToolSpec(
            "expose_port",
            "Make a link people in the chat can open to see what a server in your sandbox serves (a dev server, a "
            "page you built): start it listening on 127.0.0.1:<port> (e.g. `python3 -m http.server 8000` as a "
            "background process), then call this with the port. Returns the URL and when it expires; until the "
            "server listens the link answers 503.",
            ExposePortArgs,
            ToolPlace.HOST,
            expose_port,
        )
    )
