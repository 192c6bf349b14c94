"""A live IPython kernel for tests: run a cell, read its output, its error or a value."""

from __future__ import annotations

import textwrap
from typing import Any

__all__ = ["Kernel"]


class Kernel:
    """A live kernel: run code, get its stdout, error or displayed value."""

    def __init__(self, kc: Any) -> None:
        self.kc = kc

    def run(self, code: str, *, answer: str | None = None) -> dict[str, Any]:
        """Run a cell; ``answer``: what the user types when the cell asks (``input()``), the
        questions it asked in ``out["asked"]`` (without it, the cell cannot ask)."""
        out: dict[str, Any] = {
            "stdout": "",
            "stderr": "",
            "error": None,
            "value": None,
            "asked": [],
            "shown": [],
        }

        def hook(msg: dict[str, Any]) -> None:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out[content["name"]] += content["text"]
            elif kind == "error":
                out["error"] = (content["ename"], content["evalue"], content["traceback"])
            elif kind == "execute_result":
                out["value"] = content["data"].get("text/plain")
            elif kind == "display_data":
                out["shown"].append(content["data"])

        def asked(msg: dict[str, Any]) -> None:
            out["asked"].append(msg["content"]["prompt"])
            self.kc.input(answer)

        reply = self.kc.execute_interactive(
            textwrap.dedent(code),
            timeout=60,
            output_hook=hook,
            allow_stdin=answer is not None,
            stdin_hook=asked,
        )
        out["status"] = reply["content"]["status"]
        # What IPython sends to its pager (`%%play?`), as text.
        out["page"] = "".join(
            p["data"].get("text/plain", "")
            for p in reply["content"].get("payload", [])
            if p.get("source") == "page"
        )
        return out

    def value(self, expr: str) -> Any:
        got = self.run(f"print(repr({expr}))")
        assert got["error"] is None, got["error"]
        return eval(got["stdout"])
