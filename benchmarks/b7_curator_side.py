"""B7's curator contender, run in curator's own virtualenv (see ``b7_curator``): it must not import
playbook, whose test dependencies curator's (litellm and more) would change.

Reads a JSON job on stdin: ``url`` (the demo's base URL), ``model``, ``prompts``, ``max_tokens``
and ``backend_params`` (curator's own, as its docs give them for Anthropic); runs curator's
Anthropic backend over the prompts and prints one JSON line: rows answered, rows failed, wall
seconds, and the token limits curator read from the server's headers.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time


def main() -> int:
    job = json.load(sys.stdin)
    # Offline: litellm ships the tokenizer curator's Anthropic backend counts with (cl100k_base),
    # which tiktoken would otherwise download; litellm's price map is read from the package too.
    import litellm  # noqa: F401 - sets TIKTOKEN_CACHE_DIR to its bundled tokenizers on import
    from litellm.litellm_core_utils import default_encoding

    os.environ.setdefault("TIKTOKEN_CACHE_DIR", os.path.dirname(default_encoding.__file__) + "/tokenizers")
    from bespokelabs import curator

    class Summarise(curator.LLM):
        def prompt(self, row: dict) -> str:
            return row["prompt"]

        def parse(self, row: dict, response: str) -> dict:
            return {"prompt": row["prompt"], "summary": response}

    with tempfile.TemporaryDirectory(prefix="pb-b7-curator-") as work:
        llm = Summarise(
            model_name=job["model"],
            backend="anthropic",
            generation_params={"max_tokens": job["max_tokens"]},
            backend_params={"base_url": job["url"] + "/v1", **job["backend_params"]},
        )
        processor = llm._request_processor
        heard = processor.header_based_max_tokens_per_minute  # read from a first call's headers
        start = time.perf_counter()
        out = llm([{"prompt": p} for p in job["prompts"]], working_dir=work)
        seconds = time.perf_counter() - start
        answered = [s for s in out.dataset["summary"] if s]
    print(
        json.dumps(
            {
                "ok": len(answered),
                "failed": len(job["prompts"]) - len(answered),
                "seconds": seconds,
                "heard_input_tpm": heard.input if heard is not None else None,
                "heard_output_tpm": heard.output if heard is not None else None,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
