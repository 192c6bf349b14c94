"""Files and batches in OpenAI's shape: a JSONL of chat requests in, a JSONL of answers out.

A batch reads ``validating`` for the first tenth of its ``batch_seconds``, ``in_progress``
(its request counts growing) until they are over, then ``completed``. Nothing runs in the
background: the status is worked out from the clock whenever the batch is read, and the
answers, computed with the chat endpoint's own `complete` when the batch is created, are
published as output and error files the first time a read finds it finished. Cancelling
freezes the progress made so far; the batch reads ``cancelling`` for a tenth of its time,
then ``cancelled`` with the answers done by then.

Lines that cannot be answered (not JSON, another URL, a body the endpoint refuses) go to
the error file with a 400 in OpenAI's error shape; a file that is not a batch at all (not
UTF-8, empty, a custom_id twice) fails the whole batch with ``errors``.

`BatchStore` is not thread-safe: the demo state calls it under its lock, passing its clock's
`now` and the wall time.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from playbook.demo.chat import ChatRequestError, complete
from playbook.demo.fakedata import digest
from playbook.demo.wire import encode, openai_error

__all__ = ["ENDPOINTS", "Batch", "BatchStore", "Prepared", "StoredFile", "prepare"]

ENDPOINTS = ("/v1/chat/completions",)
MAX_LINES = 50_000
_VALIDATING = 0.1  # share of batch_seconds spent validating, and cancelling


@dataclass(slots=True)
class StoredFile:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int

    def doc(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.data),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }


@dataclass(frozen=True, slots=True)
class Prepared:
    """A batch's answers, worked out at creation: (line, custom_id, status, body) per request."""

    lines: tuple[tuple[int, Any, int, dict[str, Any]], ...] = ()
    failure: tuple[dict[str, Any], ...] = ()  # errors that fail the whole batch


def prepare(data: bytes, endpoint: str, *, invalid_json_rate: float = 0.0) -> Prepared:
    """Answer every request line of a batch input file."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return _failed("invalid_file_format", "The batch input file is not UTF-8 text.")
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not numbered:
        return _failed("empty_file", "The batch input file is empty.")
    if len(numbered) > MAX_LINES:
        return _failed(
            "too_many_requests",
            f"The batch input file has {len(numbered)} requests; at most {MAX_LINES} are allowed.",
        )
    lines: list[tuple[int, Any, int, dict[str, Any]]] = []
    seen: dict[str, int] = {}
    for n, line in numbered:
        custom_id, status, body = _answer(line, endpoint, invalid_json_rate)
        if isinstance(custom_id, str) and custom_id in seen:
            message = f"The custom_id {custom_id!r} is used on line {seen[custom_id]} and line {n}; each request needs its own."
            return _failed("duplicate_custom_id", message, line=n, param="custom_id")
        if isinstance(custom_id, str):
            seen[custom_id] = n
        lines.append((n, custom_id, status, body))
    return Prepared(tuple(lines))


def _failed(code: str, message: str, *, line: int | None = None, param: str | None = None) -> Prepared:
    return Prepared(failure=({"code": code, "message": message, "param": param, "line": line},))


def _answer(line: str, endpoint: str, invalid_json_rate: float) -> tuple[Any, int, dict[str, Any]]:
    """(custom_id, status, body) for one request line."""
    try:
        request = json.loads(line)
    except ValueError:
        return None, 400, openai_error("This line is not parseable as valid JSON.", code="invalid_json_line")
    if not isinstance(request, dict):
        return (
            None,
            400,
            openai_error(
                "Each line must be a JSON object with custom_id, method, url and body.",
                code="invalid_request",
            ),
        )
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return (
            custom_id,
            400,
            openai_error(
                "Missing required parameter: 'custom_id'.",
                param="custom_id",
                code="missing_required_parameter",
            ),
        )
    if request.get("method") != "POST":
        return (
            custom_id,
            400,
            openai_error(
                f"Invalid method {request.get('method')!r}; only 'POST' is supported.", param="method"
            ),
        )
    if request.get("url") != endpoint:
        message = f"The URL {request.get('url')!r} does not match the batch's endpoint {endpoint!r}."
        return custom_id, 400, openai_error(message, param="url", code="invalid_url")
    try:
        return custom_id, 200, complete(request.get("body"), invalid_json_rate=invalid_json_rate)
    except ChatRequestError as exc:
        return custom_id, 400, exc.body()


@dataclass(slots=True)
class Batch:
    """One batch: its answers, prepared at creation, and where its clock stands."""

    id: str
    input_file_id: str
    endpoint: str
    metadata: dict[str, str] | None
    prepared: Prepared
    seconds: float  # batch_seconds when it was created
    born: float  # the state's clock at creation
    wall: float  # the wall time at creation
    cancelled: float | None = None  # the clock when cancel was asked
    output_file_id: str | None = None
    error_file_id: str | None = None
    published: bool = False
    done: tuple[int, int] = (0, 0)  # (completed, failed) when published
    usage: dict[str, int] = field(default_factory=dict)

    def stamp(self, after: float) -> int:
        """The Unix time `after` seconds past creation."""
        return int(self.wall + after)

    def progress(self, now: float) -> float:
        """Share of the requests answered by `now` (frozen at a cancel)."""
        at = now if self.cancelled is None else min(now, self.cancelled)
        start = self.seconds * _VALIDATING
        if self.seconds <= 0 or at - self.born >= self.seconds:
            return 1.0
        return max(0.0, (at - self.born - start) / (self.seconds - start))

    def status(self, now: float) -> str:
        elapsed = now - self.born
        validating = self.seconds * _VALIDATING
        if self.cancelled is not None:
            return "cancelling" if now - self.cancelled < validating else "cancelled"
        if elapsed < validating:
            return "validating"
        if self.prepared.failure:
            return "failed"
        return "in_progress" if elapsed < self.seconds else "completed"

    def counts(self, now: float) -> dict[str, int]:
        if self.prepared.failure:
            return {"total": 0, "completed": 0, "failed": 0}
        lines = self.prepared.lines
        if self.published:
            completed, failed = self.done
        else:
            share = self.progress(now) if now - self.born >= self.seconds * _VALIDATING else 0.0
            completed = math.floor(share * sum(1 for line in lines if line[2] == 200))
            failed = math.floor(share * sum(1 for line in lines if line[2] != 200))
        return {"total": len(lines), "completed": completed, "failed": failed}

    def doc(self, now: float) -> dict[str, Any]:
        """The batch object as OpenAI answers it."""
        status = self.status(now)
        validating = self.seconds * _VALIDATING
        stop = now if self.cancelled is None else min(now, self.cancelled)
        started = stop - self.born >= validating and not self.prepared.failure
        ended = {
            "completed_at": self.stamp(self.seconds) if status == "completed" else None,
            "finalizing_at": self.stamp(self.seconds) if status == "completed" else None,
            "failed_at": self.stamp(validating) if status == "failed" else None,
            "cancelling_at": None if self.cancelled is None else self.stamp(self.cancelled - self.born),
            "cancelled_at": self.stamp(stop - self.born + validating) if status == "cancelled" else None,
        }
        errors = (
            {"object": "list", "data": list(self.prepared.failure)}
            if self.prepared.failure and status == "failed"
            else None
        )
        model = next((body.get("model") for _, _, code, body in self.prepared.lines if code == 200), None)
        tokens = self.usage
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "model": model,
            "errors": errors,
            "input_file_id": self.input_file_id,
            "completion_window": "24h",
            "status": status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.stamp(0.0),
            "in_progress_at": self.stamp(validating) if started else None,
            "expires_at": self.stamp(86400.0),
            "expired_at": None,
            **ended,
            "request_counts": self.counts(now),
            "metadata": self.metadata,
            "usage": {
                "input_tokens": tokens.get("prompt_tokens", 0),
                "output_tokens": tokens.get("completion_tokens", 0),
                "total_tokens": tokens.get("prompt_tokens", 0) + tokens.get("completion_tokens", 0),
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }


class BatchStore:
    """The uploaded files and the batches, with ids unique to this store's `salt`."""

    __slots__ = ("_made", "_salt", "batches", "files")

    def __init__(self, salt: str = "") -> None:
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, Batch] = {}
        self._salt = salt
        self._made = 0

    def _id(self, prefix: str, name: str) -> str:
        self._made += 1
        return f"{prefix}{digest(prefix, self._salt, str(self._made), name):016x}"

    def add_file(self, filename: str, purpose: str, data: bytes, wall: float) -> StoredFile:
        stored = StoredFile(self._id("file-", filename), filename, purpose, data, int(wall))
        self.files[stored.id] = stored
        return stored

    def create(
        self,
        input_file_id: str,
        endpoint: str,
        metadata: dict[str, str] | None,
        prepared: Prepared,
        *,
        seconds: float,
        now: float,
        wall: float,
    ) -> Batch:
        batch = Batch(
            self._id("batch_", input_file_id), input_file_id, endpoint, metadata, prepared, seconds, now, wall
        )
        self.batches[batch.id] = batch
        return batch

    def cancel(self, batch: Batch, now: float) -> str | None:
        """Ask `batch` to stop; the status that forbids it, or None when it is cancelling."""
        status = batch.status(now)
        if status in ("validating", "in_progress"):
            batch.cancelled = now
            return None
        return None if status in ("cancelling", "cancelled") else status

    def listing(self, limit: int, after: str | None) -> tuple[list[Batch], bool]:
        """Batches newest first, `limit` of them after the one with id `after`."""
        newest = list(reversed(self.batches.values()))
        if after is not None:
            ids = [b.id for b in newest]
            newest = newest[ids.index(after) + 1 :] if after in ids else []
        return newest[:limit], len(newest) > limit

    def complete_due(self, now: float) -> list[dict[str, Any]]:
        """Publish the files of batches that finished by `now`; the chat answers they hold,
        so the caller can count their usage once."""
        answered: list[dict[str, Any]] = []
        for batch in self.batches.values():
            if not batch.published and batch.status(now) in ("completed", "cancelled"):
                answered += self._publish(batch, now)
        return answered

    def _publish(self, batch: Batch, now: float) -> list[dict[str, Any]]:
        counts = batch.counts(now)
        ok = [line for line in batch.prepared.lines if line[2] == 200][: counts["completed"]]
        bad = [line for line in batch.prepared.lines if line[2] != 200][: counts["failed"]]
        when = batch.wall + (now - batch.born)
        if ok:
            batch.output_file_id = self.add_file(
                f"{batch.id}_output.jsonl", "batch_output", _jsonl(batch.id, ok), when
            ).id
        if bad:
            batch.error_file_id = self.add_file(
                f"{batch.id}_error.jsonl", "batch_output", _jsonl(batch.id, bad), when
            ).id
        batch.published, batch.done = True, (len(ok), len(bad))
        answers = [body for _, _, _, body in ok]
        batch.usage = {
            "prompt_tokens": sum(a["usage"]["prompt_tokens"] for a in answers),
            "completion_tokens": sum(a["usage"]["completion_tokens"] for a in answers),
        }
        return answers


def _jsonl(batch_id: str, lines: list[tuple[int, Any, int, dict[str, Any]]]) -> bytes:
    out = []
    for n, custom_id, status, body in lines:
        request_id = f"req_{digest('request', batch_id, str(n)):016x}"
        response = {"status_code": status, "request_id": request_id, "body": body}
        out.append(
            encode(
                {
                    "id": f"batch_req_{digest('line', batch_id, str(n)):016x}",
                    "custom_id": custom_id,
                    "response": response,
                    "error": None,
                }
            )
        )
    return ("\n".join(out) + "\n").encode("utf-8")
