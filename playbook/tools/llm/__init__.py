"""``pb.llm_tool``: a tool over an LLM API in one of its dialects, one module per concern::

tool        llm_tool() and the LlmTool a user holds
engine      a call as one request: messages, the receipt's address, what a play reads back
dialects    each API's request body, key, answer and error bodies, behind one protocol
structured  an output model as a strict JSON schema, and answers validated by it
reask       one more request when an answer does not fit the schema
tokens      a call's tokens, estimated before it is sent
prices      what an answer's usage costs
endpoint    the limits each answer's headers announce, passed to the provider; refusals read
batch       OpenAI's Batch API, for mode="batch"
"""

from playbook.tools.llm.engine import LlmEngine, reply_of
from playbook.tools.llm.tool import LlmTool, llm_tool

__all__ = ["LlmEngine", "LlmTool", "llm_tool", "reply_of"]
