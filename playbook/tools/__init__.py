"""Tools: the paid or slow things a play calls.  ``@pb.tool`` wraps a Python function,
``pb.http_tool`` describes an HTTP endpoint, ``pb.llm_tool`` a chat completions endpoint; all are
cached by receipts."""

from playbook.secrets import Secret, secret
from playbook.tools.base import NO_INPUT, CallEnv, Tool, tool
from playbook.tools.http import HttpTool, http_tool
from playbook.tools.llm import LlmTool, llm_tool

__all__ = [
    "NO_INPUT",
    "CallEnv",
    "HttpTool",
    "LlmTool",
    "Secret",
    "Tool",
    "http_tool",
    "llm_tool",
    "secret",
    "tool",
]
