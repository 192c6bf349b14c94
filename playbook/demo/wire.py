"""The demo's JSON on the wire: one compact encoding, and OpenAI's error body.

Every OpenAI-compatible route (chat, files, batches) refuses with the same shape,
``{"error": {"message", "type", "param", "code"}}``, which the official SDK turns into its
typed exceptions (`BadRequestError`, `NotFoundError`, `RateLimitError`). Plain data only:
the modules that answer requests (app, batch_api) make responses of it, and nothing here
pulls in the server stack, so `import playbook.demo` stays cheap.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["encode", "openai_error"]

encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def openai_error(
    message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error body; `kind` is its "type"."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
