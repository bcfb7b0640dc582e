"""Runs docs/mcp.md's LangChain recipe (the file RECIPE) in a langchain venv: `create_agent` with a
scripted chat model that asks for one shell call (COMMAND) per agent run, with the model call id
of each entry of CALL_IDS; prints, as JSON, each run's call id and the tool result the model was
shown (the shell result object, from the tool message's text)."""

import ast
import asyncio
import json
import os

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult

current_call_id = [""]


class ScriptedModel(BaseChatModel):
    """No LLM: a tool call first, then the tool's answer as the reply."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools, **kwargs):
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        last = messages[-1]
        if isinstance(last, ToolMessage):
            assert last.status == "success", last.content
            (text,) = [block["text"] for block in last.content if block.get("type") == "text"]
            reply = AIMessage(content=text)
        else:
            call = {"name": "shell", "args": {"command": os.environ["COMMAND"]}, "id": current_call_id[0], "type": "tool_call"}
            reply = AIMessage(content="", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=reply)])


async def main() -> None:
    namespace = {"ORCH_URL": os.environ["ORCH_URL"], "BOT_TOKEN": os.environ["BOT_TOKEN"], "run_id": os.environ["RUN_ID"]}
    namespace["model"] = ScriptedModel()
    recipe = compile(open(os.environ["RECIPE"]).read(), "docs/mcp.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    await eval(recipe, namespace)  # the recipe awaits the tool list at its top level
    shown = []
    for call_id in json.loads(os.environ["CALL_IDS"]):
        current_call_id[0] = call_id
        state = await namespace["agent"].ainvoke({"messages": [{"role": "user", "content": "run the command"}]})
        shown.append([call_id, json.loads(state["messages"][-1].content)])
    print(json.dumps(shown))


asyncio.run(main())
