"""JSON responses of the demo's HTTP surface, encoded once and compactly."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from playbook.demo.wire import encode

__all__ = ["json_response"]


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(encode(obj).encode("utf-8"), status, headers, media_type="application/json")
