"""Run the demo provider in the foreground: `python -m playbook.demo --port 8787`.

Once it accepts connections it prints exactly one line to stdout,

    playbook demo provider listening on http://127.0.0.1:8787

so a parent process started with `--port 0` can read the URL. Ctrl-C or SIGTERM stop it
cleanly (exit status 0). Observe and steer it over HTTP: GET /_stats, POST /_reset,
POST /_configure with a JSON object of settings, POST /_restart {"down": seconds} to close
the port for that long (the process keeps running and serves again on the same port).
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import time
from collections.abc import Sequence

from playbook.demo.settings import APIS, DEMO_KEY, RETRY_AFTER_FORMATS

# (flag, setting, type, help) for every setting the command line exposes.
_OPTIONS: tuple[tuple[str, str, type, str], ...] = (
    ("--rps", "rps", float, "requests per second per API key (default: unlimited)"),
    ("--burst", "burst", int, "token bucket size per API key (default: 10)"),
    ("--window-limit", "window_limit", int, "requests per key per fixed window (default: unlimited)"),
    (
        "--window-seconds",
        "window_seconds",
        float,
        "fixed window length, windows aligned to its multiples (default: 1)",
    ),
    (
        "--max-in-flight",
        "max_in_flight",
        int,
        "requests per key answered at once; more get 429 without a hint (default: unlimited)",
    ),
    ("--quota", "quota", int, "requests per key per quota window (default: unlimited)"),
    ("--quota-reset", "quota_reset", float, "quota window in seconds (default: 3600)"),
    ("--latency", "latency", float, "seconds added to every /v1 response (default: 0)"),
    ("--fault-rate", "fault_rate", float, "share of /v1 requests answered with --fault-status (default: 0)"),
    ("--fault-status", "fault_status", int, "status of injected faults (default: 503)"),
    (
        "--fault-retry-after",
        "fault_retry_after",
        float,
        "Retry-After hint on injected faults (default: none)",
    ),
    (
        "--fault-every",
        "fault_every",
        int,
        "answer every Nth request past auth and limits with --fault-status (default: never)",
    ),
    ("--slow-rate", "slow_rate", float, "share of requests that sleep --slow-latency more (default: 0)"),
    ("--slow-latency", "slow_latency", float, "extra seconds for slow requests (default: 1)"),
    (
        "--malformed-rate",
        "malformed_rate",
        float,
        "share of 200 responses with a broken JSON body (default: 0)",
    ),
    ("--miss-rate", "miss_rate", float, "share of email lookups that find nothing (default: 0.2)"),
    ("--job-seconds", "job_seconds", float, "seconds an async job takes (default: 2)"),
    ("--seed", "seed", int, "seed for fault, slowness and malformed draws (default: 0)"),
    ("--chat-rpm", "chat_rpm", int, "chat completions requests per minute per key (default: unlimited)"),
    ("--chat-tpm", "chat_tpm", int, "chat completions tokens per minute per key (default: unlimited)"),
    (
        "--chat-bucket-seconds",
        "chat_bucket_seconds",
        float,
        "seconds of the chat limits one burst may use (default: 1)",
    ),
    (
        "--chat-invalid-json-rate",
        "chat_invalid_json_rate",
        float,
        "share of JSON chat answers sent as invalid JSON (default: 0)",
    ),
    ("--batch-seconds", "batch_seconds", float, "seconds a chat batch job takes to complete (default: 2)"),
    (
        "--batch-expired-rate",
        "batch_expired_rate",
        float,
        "share of Anthropic and Gemini batch requests left to expire unanswered (default: 0)",
    ),
    ("--anthropic-rpm", "anthropic_rpm", int, "Anthropic requests per minute per key (default: unlimited)"),
    (
        "--anthropic-itpm",
        "anthropic_itpm",
        int,
        "Anthropic input tokens per minute per key (default: unlimited)",
    ),
    (
        "--anthropic-otpm",
        "anthropic_otpm",
        int,
        "Anthropic output tokens per minute per key, max_tokens charged on arrival (default: unlimited)",
    ),
    ("--gemini-rpm", "gemini_rpm", int, "Gemini requests per minute window per key (default: unlimited)"),
    ("--gemini-tpm", "gemini_tpm", int, "Gemini input tokens per minute window per key (default: unlimited)"),
    ("--gemini-rpd", "gemini_rpd", int, "Gemini requests per day per key (default: unlimited)"),
    ("--gemini-day-seconds", "gemini_day_seconds", float, "length of Gemini's quota day (default: 86400)"),
    (
        "--azure-rpm",
        "azure_rpm",
        int,
        "Azure requests per minute per key, a sixth per 10 s window (default: unlimited)",
    ),
    (
        "--azure-tpm",
        "azure_tpm",
        int,
        "Azure tokens per minute per key, prompt + max_tokens on arrival (default: unlimited)",
    ),
    ("--azure-window-seconds", "azure_window_seconds", float, "Azure's enforcement window (default: 10)"),
    ("--bedrock-rpm", "bedrock_rpm", int, "Bedrock requests per minute per key (default: unlimited)"),
    ("--bedrock-tpm", "bedrock_tpm", int, "Bedrock tokens per minute per key (default: unlimited)"),
    (
        "--overload-seconds",
        "overload_seconds",
        float,
        "seconds overloaded at the start of each --overload-period (default: 0)",
    ),
    ("--overload-period", "overload_period", float, "seconds between overload bursts (default: none)"),
    ("--overload-rate", "overload_rate", float, "share of LLM requests answered as overloaded (default: 0)"),
    (
        "--local-slots",
        "local_slots",
        int,
        "local server mode: chat requests answered at once, no key asked (default: off)",
    ),
    ("--local-queue", "local_queue", int, "local server mode: requests waiting for a slot (default: 0)"),
    (
        "--local-service-seconds",
        "local_service_seconds",
        float,
        "local server mode: seconds a request holds its slot (default: 0)",
    ),
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m playbook.demo",
        description="Run playbook's deterministic demo enrichment provider on this machine.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=8787, help="port to bind; 0 picks a free one (default: 8787)"
    )
    parser.add_argument(
        "--api-key",
        dest="api_keys",
        action="append",
        metavar="KEY",
        help=f"accepted bearer key; repeat for several (default: {DEMO_KEY})",
    )
    parser.add_argument(
        "--retry-after-format", choices=RETRY_AFTER_FORMATS, help="how 429s hint when to retry"
    )
    parser.add_argument(
        "--quota-endpoint",
        dest="quota_endpoints",
        action="append",
        metavar="PREFIX",
        help="path prefix the quota applies to; repeat for several (default: all of /v1)",
    )
    parser.add_argument(
        "--overload-api",
        dest="overload_apis",
        action="append",
        choices=APIS,
        help="dialect the overload settings apply to; repeat for several (default: every one)",
    )
    for flag, dest, kind, text in _OPTIONS:
        parser.add_argument(flag, dest=dest, type=kind, help=text)
    return parser


def _flags(message: str) -> str:
    """A settings error as the command line says it: each setting named by its flag."""
    for flag, setting, _, _ in _OPTIONS:
        message = re.sub(rf"\b{setting}\b", flag, message)
    return message


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = vars(parser.parse_args(argv))
    host, port = args.pop("host"), args.pop("port")
    settings = {name: value for name, value in args.items() if value is not None}

    from playbook.demo.server import serve

    # Both stop signals raise KeyboardInterrupt and take the same clean path. SIGINT is set
    # explicitly because a shell starts background jobs with it ignored.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.default_int_handler)
    demo = None
    try:
        try:
            demo = serve(port=port, host=host, **settings)
        except (ValueError, OSError) as exc:
            parser.exit(2, f"{parser.prog}: error: {_flags(str(exc))}\n")
        print(f"playbook demo provider listening on {demo.url}", flush=True)
        while demo.running:
            time.sleep(0.5)
        return 1  # the server thread died on its own
    except KeyboardInterrupt:
        return 0
    finally:
        if demo is not None:
            demo.stop()


if __name__ == "__main__":
    sys.exit(main())
