"""Runs docs/mcp.md's OpenAI Agents SDK recipe (the file RECIPE) in an openai-agents venv: the
SDK's Runner with a scripted model (a `Model` of its interface, no LLM, tracing off, so nothing
leaves the machine) that asks for one shell call (COMMAND) per agent run, with the model call id
of each entry of CALL_IDS; prints, as JSON, each run's call id and the tool result the model was
shown (the shell result object)."""

import asyncio
import json
import os

from agents import Runner, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

set_tracing_disabled(True)
current_call_id = [""]


def output_text(output) -> str:
    """A function call output: a string, or a list of content items (the MCP tool's text)."""
    if isinstance(output, str):
        return output
    (text,) = [item["text"] for item in output if item.get("type") == "input_text"]
    return text


class ScriptedModel(Model):
    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs, tracing, **kwargs):
        items = input if isinstance(input, list) else []
        outputs = [item for item in items if isinstance(item, dict) and item.get("type") == "function_call_output"]
        if not outputs:
            call = ResponseFunctionToolCall(
                type="function_call", call_id=current_call_id[0], name="shell", arguments=json.dumps({"command": os.environ["COMMAND"]})
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text=output_text(outputs[-1]["output"]), annotations=[])
        reply = ResponseOutputMessage(id="msg_scripted", type="message", role="assistant", status="completed", content=[text])
        return ModelResponse(output=[reply], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the scripted model does not stream")


async def main() -> None:
    namespace = {"ORCH_URL": os.environ["ORCH_URL"], "BOT_TOKEN": os.environ["BOT_TOKEN"], "run_id": os.environ["RUN_ID"]}
    namespace["model"] = ScriptedModel()
    exec(compile(open(os.environ["RECIPE"]).read(), "docs/mcp.md", "exec"), namespace)
    shown = []
    async with namespace["server"]:
        for call_id in json.loads(os.environ["CALL_IDS"]):
            current_call_id[0] = call_id
            result = await Runner.run(namespace["agent"], "run the command")
            shown.append([call_id, json.loads(result.final_output)])
    print(json.dumps(shown))


asyncio.run(main())
