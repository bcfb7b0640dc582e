"""Runs docs/mcp.md's pydantic-ai recipe (the file RECIPE) in a pydantic-ai venv: a FunctionModel
asks for one shell call (COMMAND) per agent run, with the model call id of each entry of
CALL_IDS; prints, as JSON, each run's call id and the tool result the model was shown (the
shell result object)."""

import asyncio
import json
import os

from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel

current_call_id = [""]


def respond(messages, info):
    returned = [part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]
    if not returned:
        return ModelResponse(parts=[ToolCallPart("shell", {"command": os.environ["COMMAND"]}, tool_call_id=current_call_id[0])])
    content = returned[-1].content  # the call's structuredContent, or its text
    return ModelResponse(parts=[TextPart(content if isinstance(content, str) else json.dumps(content))])


async def main() -> None:
    namespace = {"ORCH_URL": os.environ["ORCH_URL"], "BOT_TOKEN": os.environ["BOT_TOKEN"], "run_id": os.environ["RUN_ID"]}
    namespace["model"] = FunctionModel(respond)
    exec(compile(open(os.environ["RECIPE"]).read(), "docs/mcp.md", "exec"), namespace)
    shown = []
    for call_id in json.loads(os.environ["CALL_IDS"]):
        current_call_id[0] = call_id
        result = await namespace["agent"].run("run the command")
        shown.append([call_id, json.loads(result.output)])
    print(json.dumps(shown))


asyncio.run(main())
