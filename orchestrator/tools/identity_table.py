"""Which identity each tool acts as. One table, one place.

Container tools run in the runtime user's sandbox. Host tools in RUNTIME_SCOPED_TOOLS read
or write per-user directories and act as the runtime user; every other host tool acts as
the session owner. In `owner` mode the runtime user is the owner, so everything goes there.
"""

from __future__ import annotations

from enum import Enum

from orchestrator.identity import RunIdentity
from sandbox_agent.wire import CONTAINER_TOOL_NAMES


class ActingIdentity(str, Enum):
    RUNTIME = "runtime"
    OWNER = "owner"


CONTAINER_TOOLS = CONTAINER_TOOL_NAMES  # declared with the wire models the agent validates
RUNTIME_SCOPED_TOOLS = frozenset({"dump_user_messages", "expose_port", "publish_artifact", "send_file", "send_image"})
OWNER_SCOPED_TOOLS = frozenset(
    {
        "list_conversations",
        "read_conversation",
        "session_search",
        "contact_session",
        "reply_to_collaboration",
    }
)

TOOL_IDENTITY: dict[str, ActingIdentity] = {
    **{name: ActingIdentity.RUNTIME for name in CONTAINER_TOOLS | RUNTIME_SCOPED_TOOLS},
    **{name: ActingIdentity.OWNER for name in OWNER_SCOPED_TOOLS},
}


def acting_user_for(tool: str, identity: RunIdentity) -> int:
    try:
        acting = TOOL_IDENTITY[tool]
    except KeyError:
        raise KeyError(f"tool {tool!r} has no row in the identity table") from None
    return identity.runtime_user_id if acting is ActingIdentity.RUNTIME else identity.owner_user_id
