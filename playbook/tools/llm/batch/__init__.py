"""The batch interfaces an LLM tool in ``mode="batch"`` submits its calls to, one module per
provider behind one protocol (:mod:`.api`)::

    openai     OpenAI's Batch API: an uploaded JSON Lines file, a batch over it
    anthropic  Anthropic's Message Batches
    gemini     Gemini's batch mode (batchGenerateContent, inlined requests)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from playbook.tools.llm.batch.anthropic import AnthropicBatches
from playbook.tools.llm.batch.api import BatchApi, Job, Member, NotYet, custom_id
from playbook.tools.llm.batch.gemini import GeminiBatches
from playbook.tools.llm.batch.openai import OpenAiBatches

if TYPE_CHECKING:
    from playbook.tools.llm.engine import LlmEngine

__all__ = [
    "BATCHED",
    "AnthropicBatches",
    "BatchApi",
    "GeminiBatches",
    "Job",
    "Member",
    "NotYet",
    "OpenAiBatches",
    "batches_of",
    "custom_id",
]

# The dialects whose providers take batches (llm_tool(mode="batch") refuses the others).
BATCHED = ("openai", "anthropic", "gemini")
_APIS: dict[str, type[OpenAiBatches] | type[AnthropicBatches] | type[GeminiBatches]] = {
    "openai": OpenAiBatches,
    "anthropic": AnthropicBatches,
    "gemini": GeminiBatches,
}


def batches_of(tool: LlmEngine) -> BatchApi:
    """The batch interface of the tool's provider, by the tool's dialect."""
    return _APIS[tool.dialect.name](tool)
