"""What a streamed answer (a shell call as SSE, an MCP request answered as a stream) holds of
the server's descriptor budget: the client's connection and the call into the sandbox, for as
long as the stream runs, charged to the run's runtime user. Over the user's share the answer
is a 429, over the pool a 503, both with a `code`, before anything runs."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from orchestrator.descriptors.budget import STREAM_COST, DescriptorHold, Feature
from orchestrator.errors import NotFound
from orchestrator.http.parts import ToolCallParts


async def hold_stream_descriptors(parts: ToolCallParts, run_id: str) -> DescriptorHold | None:
    """Raises DescriptorsRefused (nothing held). None for an unknown run: nothing will stream,
    and the caller refuses it as it always did."""
    try:
        run = await run_in_threadpool(parts.runs.get, run_id)
    except NotFound:
        return None
    return parts.descriptors.try_acquire(run.runtime_user_id, Feature.STREAMS, STREAM_COST)
