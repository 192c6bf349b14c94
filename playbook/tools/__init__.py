"""Tools: the paid or slow things a play calls.  ``@pb.tool`` wraps a Python function,
``pb.http_tool`` describes an HTTP endpoint, ``pb.llm_tool`` a chat completions endpoint; all are
cached by receipts.  What a user holds is a :class:`Tool` (:mod:`.tool`); what the call pipeline
asks of it is its engine's (:mod:`.protocol`, reached through :func:`~.tool.engine_of`)."""

from playbook.secrets import Secret, secret
from playbook.tools.http import HttpTool, http_tool
from playbook.tools.llm import LlmTool, llm_tool
from playbook.tools.protocol import NO_INPUT, CallEnv
from playbook.tools.tool import Tool, engine_of, tool

__all__ = [
    "NO_INPUT",
    "CallEnv",
    "HttpTool",
    "LlmTool",
    "Secret",
    "Tool",
    "engine_of",
    "http_tool",
    "llm_tool",
    "secret",
    "tool",
]
