"""The two collaboration tools: `contact_session` and `reply_to_collaboration`.

Their arguments are only what the model may choose. Source session, source run and work
generation come from the trusted `ToolCall`; an argument trying to name them is refused.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mounts import ids
from orchestrator.collaboration.coordinator import REQUEST_ID, CollaborationService
from orchestrator.collaboration.records import MessageKind
from orchestrator.tools.registry import ToolCall, ToolPlace, ToolRegistry, ToolSpec


class ContactSessionArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: str = Field(
        ...,
        max_length=128,
        description="The session id to ask for help (a session of the same owner).",
        json_schema_extra={"pattern": ids.SESSION_ID_PATTERN},
    )
    message: str = Field(..., min_length=1, description="What you need, with the context the other session lacks.")

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        try:
            return ids.session_id(value, "target")
        except ids.InvalidIdentifier as exc:
            raise ValueError(exc.message) from None


class ReplyToCollaborationArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(
        ...,
        description="The request id (cr-…) from the delivery or from contact_session.",
        json_schema_extra={"pattern": f"^{REQUEST_ID.pattern}$"},
    )
    kind: Literal["progress", "clarification", "supplement", "reply"] = Field(
        ...,
        description=(
            "asked session: progress (a note, starts nothing), clarification (a question back), reply (the "
            "final answer); asking session: supplement (more information, or the answer to a clarification)"
        ),
    )
    message: str = Field(..., min_length=1)

    @field_validator("request_id")
    @classmethod
    def _request_id(cls, value: str) -> str:
        if not REQUEST_ID.fullmatch(value):
            raise ValueError("request_id must be a collaboration request id like cr-0123456789abcdef01234567")
        return value


CONTACT_DESCRIPTION = (
    "Ask another session of this owner for help. Returns at once with a request id; the other "
    "session works on it in its own run, and its answer comes back to this session as a later run. "
    "Do not wait, sleep or poll for the answer: continue with other work or end this run."
)
REPLY_DESCRIPTION = (
    "Answer a collaboration request this session received (kind reply, clarification or progress), "
    "or add information to one this session made (kind supplement). Only a reply or a clarification "
    "goes back to the asking session; a run that handles a request and ends without either fails it."
)


def register_collaboration_tools(registry: ToolRegistry, collaboration: CollaborationService) -> None:
    def contact(call: ToolCall) -> dict[str, Any]:
        args = call.arguments
        assert isinstance(args, ContactSessionArgs)
        return collaboration.contact(call.run, call.session, args.target, args.message, call.tool_call_id)

    def reply(call: ToolCall) -> dict[str, Any]:
        args = call.arguments
        assert isinstance(args, ReplyToCollaborationArgs)
        return collaboration.reply(
            call.run, call.session, args.request_id, MessageKind(args.kind), args.message, call.tool_call_id
        )

    # Both key their effect by (run, tool_call_id) themselves (policy.op_key): see ToolSpec.
    registry.register(
        ToolSpec("contact_session", CONTACT_DESCRIPTION, ContactSessionArgs, ToolPlace.HOST, contact, keyed_by_call_id=True)
    )
    registry.register(
        ToolSpec(
            "reply_to_collaboration", REPLY_DESCRIPTION, ReplyToCollaborationArgs, ToolPlace.HOST, reply,
            keyed_by_call_id=True,
        )
    )
