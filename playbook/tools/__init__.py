"""Tools: the paid or slow things a play calls.  ``@pb.tool`` wraps a Python function,
``pb.http_tool`` describes an HTTP endpoint, ``pb.llm_tool`` a chat completions endpoint; all are
cached by receipts."""

from .base import NO_INPUT, CallEnv, Tool, current_fingerprint, tool
from .http import HttpTool, http_tool
from .llm import LlmTool, llm_tool
from .secrets import Secret, secret

__all__ = ["NO_INPUT", "CallEnv", "HttpTool", "LlmTool", "Secret", "Tool", "current_fingerprint", "http_tool", "llm_tool", "secret", "tool"]
