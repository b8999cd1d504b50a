"""Live streams of steps and status changes as Server-Sent Events (sse-starlette).

Each stream polls the database every ``sse_poll_interval_s`` (default 0.15 s) in a worker
thread, with a fresh session per poll (a long-lived SQLite read transaction would never see
new commits), so an open stream holds no pooled connection between polls. At most
``max_streams`` streams are open per server; beyond, 503 with ``Retry-After``, answered
before the route is reached (:class:`ckptlab.backend.middleware.StreamCap`). Streams of one
scope share their polls (:class:`SharedPolls`); each step's JSON is encoded once, in the
polling thread, and the events after a cursor are framed once and written as one chunk to
every stream at that place (:meth:`_Poll.step_frames`); at most :data:`POLL_THREADS` polls
(and stream routes' first reads, :func:`read_once`) run at once, so REST routes keep their
threads. A comment line every 15 s keeps idle connections alive. Events (their ``data`` as
JSON Schema: :data:`EVENT_DATA`):

- ``step``: ``{"experiment_id", "attempt", "step", "forward_ms", ..., "loss", "loss_nonfinite"}``
- ``status``: ``{"experiment_id", "status", "attempt", "error"}``, on connect and on every
  change (a retried experiment shows its new ``attempt``).
- ``progress`` (sweeps only): ``{"total", "finished", "counts", "eta_s", "eta_text"}`` after status changes.
- ``end``: ``{"reason": "finished"}`` once every experiment has finished and its last step
  was sent; the server then closes the stream (clients should stop reconnecting).

Every event id is ``"<cursor>:<digest>"``: ``cursor`` is the largest step row id sent so far
(monotonic) and ``digest`` a hash of the experiments' (id, status, attempt) as last sent.
Reconnecting with ``Last-Event-ID`` resumes after the cursor and resends status events only
when the statuses changed meanwhile. On SQLite every step is delivered exactly once and in
order; on PostgreSQL steps of *different* experiments of a sweep committed out of id order
could be skipped by the cursor (those of one experiment never are).
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import json
import math
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import Depends, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import WithJsonSchema
from sqlalchemy.orm import Session, sessionmaker
from sse_starlette import EventSourceResponse, ServerSentEvent

from ckptlab.backend.services.queries import ExperimentState, StepRow, experiment_states, steps_after
from ckptlab.backend.services.sweeps import Progress, sweep_progress
from ckptlab.domain import FINISHED_STATUSES, SERIES_METRICS, Status

__all__ = [
    "SharedPolls",
    "Cursor",
    "parse_last_event_id",
    "cursor_from_header",
    "LAST_EVENT_ID_PATTERN",
    "StreamRequest",
    "StreamDep",
    "event_stream",
    "read_once",
    "EVENT_TYPES",
    "EVENT_DATA",
]

LAST_EVENT_ID_PATTERN = r"^\d{1,19}(:[0-9a-f]{0,32})?$"
#: An optional cursor parameter's schema: a string when it is sent (not ``anyOf [string,
#: null]``: a header or query parameter cannot be null, and a client would send "null").
_CURSOR_SCHEMA = WithJsonSchema({"type": "string", "pattern": LAST_EVENT_ID_PATTERN})
EVENT_TYPES = ("step", "status", "progress", "end")
_INT, _NUMBER = {"type": "integer"}, {"type": ["number", "null"]}
#: The JSON ``data`` of each event type, as JSON Schema (the streams' OpenAPI entry:
#: :data:`ckptlab.backend.services.responses.SSE_RESPONSE`).
EVENT_DATA: dict[str, dict[str, Any]] = {
    "step": {
        "type": "object",
        "description": "a step of a run: times in ms, memory in bytes (null: not measured or not finite)",
        "required": ["experiment_id", "attempt", "step"],
        "properties": {"experiment_id": _INT, "attempt": _INT, "step": _INT} | dict.fromkeys(SERIES_METRICS, _NUMBER),
    },
    "status": {
        "type": "object",
        "required": ["experiment_id", "status", "attempt", "error"],
        "properties": {
            "experiment_id": _INT,
            "status": {"enum": [s.value for s in Status]},
            "attempt": _INT,
            "error": {"type": ["string", "null"]},
        },
    },
    "progress": {
        "type": "object",
        "description": "a sweep's progress, after its status events",
        "required": ["total", "finished", "counts", "eta_s", "eta_text"],
        "properties": {
            "total": _INT,
            "finished": _INT,
            "counts": {"type": "object", "additionalProperties": _INT},
            "eta_s": _NUMBER,
            "eta_text": {"type": "string"},
        },
    },
    "end": {"type": "object", "required": ["reason"], "properties": {"reason": {"const": "finished"}}},
}
_MAX_CURSOR = 2**63 - 1
#: Steps read per poll; a stream catching up reads again at once.
BATCH = 1000
#: Polls running at once in worker threads, whatever the number of streams: the rest wait
#: on the event loop, so the threads (and database connections) that REST routes and
#: ``/api/health`` need stay free at the stream cap (``bench/bench_streams.py``).
POLL_THREADS = 4
_limiters: dict[int, anyio.CapacityLimiter] = {}


def _poll_limiter() -> anyio.CapacityLimiter:
    """The poll threads' limiter of the running event loop (one per loop: a limiter is
    bound to the loop that first uses it)."""
    loop = id(asyncio.get_running_loop())
    limiter = _limiters.get(loop)
    if limiter is None:
        if len(_limiters) > 16:
            _limiters.clear()
        limiter = _limiters[loop] = anyio.CapacityLimiter(POLL_THREADS)
    return limiter


@dataclass(frozen=True)
class Cursor:
    """Where a client is: the last step row id it got and the digest of the statuses it saw."""

    step_id: int = 0
    digest: str = ""

    def event_id(self) -> str:
        """The SSE event id encoding this cursor."""
        return f"{self.step_id}:{self.digest}"


def parse_last_event_id(value: str | None) -> Cursor:
    """The cursor a ``Last-Event-ID`` header names (a fresh cursor for None or empty).

    Raises:
        ValueError: the value is not ``<step id>[:<hex digest>]`` or the id is over 2**63-1.
    """
    if not value:
        return Cursor()
    if not re.fullmatch(LAST_EVENT_ID_PATTERN, value):
        raise ValueError("Last-Event-ID must look like '<step id>:<hex digest>'")
    step, _, digest = value.partition(":")
    if int(step) > _MAX_CURSOR:
        raise ValueError("Last-Event-ID step id is too large")
    return Cursor(int(step), digest)


def cursor_from_header(value: str | None) -> Cursor:
    """:func:`parse_last_event_id` for a route: a bad header becomes a 422 naming it.

    Raises:
        fastapi.exceptions.RequestValidationError: the header is malformed.
    """
    try:
        return parse_last_event_id(value)
    except ValueError as exc:
        raise RequestValidationError(
            [{"type": "value_error", "loc": ["header", "last-event-id"], "msg": str(exc), "input": value}]
        ) from None


def _digest(states: Sequence[ExperimentState]) -> str:
    text = ";".join(f"{s.id},{s.status},{s.attempt}" for s in states)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _step_data(row: StepRow) -> dict[str, Any]:
    # JSON has no inf/nan: a non-finite time or size reads as null (as in the JSON API).
    data = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.data.items()}
    return {"experiment_id": row.experiment_id, "attempt": row.attempt, **data}


def _encode(data: dict[str, Any]) -> str:
    return json.dumps(data, allow_nan=False, default=str, separators=(",", ":"))


def _status_data(s: ExperimentState) -> dict[str, Any]:
    return {"experiment_id": s.id, "status": s.status, "attempt": s.attempt, "error": s.error}


def _event(kind: str, data: dict[str, Any], cursor: Cursor) -> ServerSentEvent:
    return ServerSentEvent(data=_encode(data), event=kind, id=cursor.event_id())


@dataclass
class _Poll:
    """One poll's result, shared by every stream of its scope. ``encoded`` holds each step's
    ``data`` JSON, encoded once in the polling thread; ``frames`` caches the wire bytes of
    the step events after a cursor, for a status digest (streams at the same place share
    them: the same bytes go to every stream that wants them)."""

    states: list[ExperimentState]
    steps: list[StepRow]
    progress: Progress | None
    truncated: bool = False  # the step query hit BATCH: more steps follow
    encoded: list[str] = field(default_factory=list)
    frames: dict[tuple[int, str], tuple[bytes, int, int]] = field(default_factory=dict)

    def step_frames(self, after: int, digest: str) -> tuple[bytes, int, int]:
        """The step events after row ``after`` as one SSE chunk (``id``, ``event``,
        ``data`` lines as :class:`sse_starlette.ServerSentEvent` writes them), the last row
        id in it (``after`` when none) and the number of events. Built once per (cursor,
        digest) on the event loop."""
        key = (after, digest)
        hit = self.frames.get(key)
        if hit is None:
            start = bisect.bisect_right(self.steps, after, key=lambda r: r.id)
            parts = [
                f"id: {row.id}:{digest}\r\nevent: step\r\ndata: {data}\r\n\r\n"
                for row, data in zip(self.steps[start:], self.encoded[start:], strict=True)
            ]
            last = self.steps[-1].id if start < len(self.steps) else after
            hit = ("".join(parts).encode(), last, len(parts))
            if len(self.frames) < 64:
                self.frames[key] = hit
        return hit


@dataclass(frozen=True)
class StreamRequest:
    """What a stream route needs from its request.

    Attributes:
        sessions: the app's session factory (one short session per poll; the route checks
            the experiment or sweep with a short session of its own, so an open stream
            holds no pooled connection).
        cursor: where the client resumes (from ``Last-Event-ID``).
        poll_interval_s: the server's ``sse_poll_interval_s``.
        include_steps: the ``steps`` query flag.
        shared: the server's shared polls (None: each stream polls on its own).
    """

    sessions: sessionmaker[Session]
    cursor: Cursor
    poll_interval_s: float
    include_steps: bool
    shared: SharedPolls | None = None


async def stream_request(
    request: Request,
    last_event_id: Annotated[
        str | None,
        Header(
            pattern=LAST_EVENT_ID_PATTERN,
            description="resume after this event id (browsers send it when they reconnect)",
        ),
        _CURSOR_SCHEMA,
    ] = None,
    steps: Annotated[bool, Query(description="send step events (false: statuses and progress only)")] = True,
    last_event_id_query: Annotated[
        str | None,
        Query(
            alias="last_event_id",
            pattern=LAST_EVENT_ID_PATTERN,
            description="resume after this event id when the header cannot be set (a new EventSource); "
            "the Last-Event-ID header wins",
        ),
        _CURSOR_SCHEMA,
    ] = None,
) -> StreamRequest:
    """The :class:`StreamRequest` of a stream route (a 422 names a malformed Last-Event-ID).

    The cursor comes from the ``Last-Event-ID`` header (a browser's own reconnection) or else
    the ``last_event_id`` query parameter (a client that opens a new stream to resume). A
    coroutine: it waits on nothing, and a worker thread would make it wait behind busy ones."""
    return StreamRequest(
        sessions=request.app.state.sessionmaker,
        cursor=cursor_from_header(last_event_id or last_event_id_query),
        poll_interval_s=request.app.state.settings.sse_poll_interval_s,
        include_steps=steps,
        shared=request.app.state.shared_polls,
    )


StreamDep = Annotated[StreamRequest, Depends(stream_request)]


class SharedPolls:
    """Streams that watch the same scope share one database poll per interval, whatever
    their cursors: 200 browsers tailing one sweep cost one poll, not 200.

    An entry holds the statuses and the steps after some cursor ``base`` (the lowest asked
    for). A stream whose cursor is at or past ``base`` takes the entry's steps after its
    own cursor; one further behind polls from its cursor, and that lower window replaces
    the entry, so laggards and the live tail share again at the next interval instead of
    each polling on its own (which on a busy host would never let them catch up). A poll
    that hit its row limit is marked ``truncated``: every stream then treats it as a full
    batch and polls again before it sends statuses or the end.

    Lookups and waiting happen on the event loop; only the poll itself runs in a worker
    thread, so waiting streams hold no thread the API's other routes need.

    Args:
        ttl_s: how long a poll is reused, seconds (the poll interval).
    """

    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self._results: dict[tuple, tuple[float, int, Any]] = {}
        self._inflight: dict[tuple, tuple[int, asyncio.Future]] = {}

    async def get(self, key: tuple, after: int, compute: Callable[[int], Any]) -> Any:
        """The poll for ``key`` covering steps after ``after``: a fresh shared one when its
        window starts at or before ``after``, else ``compute(after)`` run once (in a
        thread) for every stream asking meanwhile."""
        now = time.monotonic()
        hit = self._results.get(key)
        if hit is not None and now - hit[0] < self.ttl_s and hit[1] <= after:
            return hit[2]
        pending = self._inflight.get(key)
        if pending is not None and pending[0] <= after:
            return await asyncio.shield(pending[1])
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._inflight[key] = (after, future)
        try:
            result = await anyio.to_thread.run_sync(compute, after, limiter=_poll_limiter())
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc if isinstance(exc, Exception) else RuntimeError("poll cancelled"))
                future.exception()  # retrieved: no "never retrieved" warning when nobody waits
            raise
        finally:
            if self._inflight.get(key, (None, None))[1] is future:
                del self._inflight[key]
        if len(self._results) > 1024:  # forget scopes no stream watches any more
            self._results = {k: v for k, v in self._results.items() if now - v[0] < 10 * self.ttl_s}
        self._results[key] = (time.monotonic(), after, result)
        future.set_result(result)
        return result


T = TypeVar("T")


async def read_once(stream: StreamRequest, read: Callable[[Session], T]) -> T:
    """``read(session)`` with a short session of its own, in a poll thread (at most
    :data:`POLL_THREADS` at once): a stream route's check that what it streams exists. Not
    in the API's thread pool: 200 streams opening at once would keep its 40 threads
    contending with the event loop for the GIL, and every request waiting on the loop, the
    refusals over the cap too (``bench/bench_stream_burst.py``)."""

    def run() -> T:
        with stream.sessions() as session:  # short: an open stream holds no pooled connection
            return read(session)

    return await anyio.to_thread.run_sync(run, limiter=_poll_limiter())


def event_stream(
    stream: StreamRequest,
    *,
    experiment_ids: Callable[[Session], list[int]],
    sweep_id: int | None = None,
    scope: tuple | None = None,
) -> EventSourceResponse:
    """An SSE response streaming steps and status changes of some experiments.

    Args:
        stream: the request's cursor, poll interval and step flag (:data:`StreamDep`).
        experiment_ids: reads the experiments to watch (the sweep's, or one id).
        sweep_id: the sweep, for ``progress`` events (default None: one experiment).
        scope: what is watched, e.g. ``("sweep", 3)``: streams of the same scope share
            their polls (:class:`SharedPolls`). Default: no sharing.
    """
    sessions, cursor, include_steps = stream.sessions, stream.cursor, stream.include_steps
    poll_interval_s = stream.poll_interval_s

    def poll(after: int, known: dict[int, tuple[str, int]] | None) -> _Poll:
        # Statuses first, then steps: a finished status read here guarantees that its
        # experiment's last steps (committed before the status) are read below. Steps are
        # read for every experiment when ``known`` is None, else only for those running or
        # whose status changed since it was last sent (they may have written final steps).
        with sessions() as session:
            states = experiment_states(session, experiment_ids=experiment_ids(session))
            pairs = [
                (s.id, s.attempt)
                for s in states
                if s.attempt > 0
                and (known is None or s.status == Status.RUNNING or known.get(s.id) != (s.status, s.attempt))
            ]
            steps = steps_after(session, attempts=pairs, after_id=after, limit=BATCH) if include_steps else []
            # counted from the statuses sent with it: a run finishing after they were read is
            # neither sent nor counted until the next poll
            progress = (
                sweep_progress(session, sweep_ids=[sweep_id], statuses={sweep_id: [s.status for s in states]})[sweep_id]
                if sweep_id is not None
                else None
            )
        # Encoded here, in the polling thread, once for every stream that shares this poll.
        return _Poll(states, steps, progress, len(steps) >= BATCH, [_encode(_step_data(r)) for r in steps])

    async def shared_poll(after: int, known: dict[int, tuple[str, int]] | None) -> _Poll:
        if scope is None or stream.shared is None:
            return await anyio.to_thread.run_sync(poll, after, known, limiter=_poll_limiter())
        # Shared: read steps of every started experiment (known=None); each stream takes
        # the steps after its own cursor from the shared window (_Poll.step_frames).
        return await stream.shared.get((scope, include_steps), after, lambda a: poll(a, None))

    async def _events() -> AsyncIterator[ServerSentEvent]:
        step_id, digest = cursor.step_id, cursor.digest
        known: dict[int, tuple[str, int]] = {}  # statuses the client has been sent
        full, resumed = True, False
        while True:
            result = await shared_poll(step_id, None if full else dict(known))
            chunk, step_id, _count = result.step_frames(step_id, digest)
            if chunk:
                yield chunk  # every new step in one write, encoded once per scope and place
            full = result.truncated
            if full:
                continue  # catch up on steps first; statuses follow the steps they end
            current = {s.id: (s.status, s.attempt) for s in result.states}
            if not resumed:
                resumed = True
                if _digest(result.states) == digest:
                    known = dict(current)  # a resumed client already saw these statuses
            changed = [s for s in result.states if known.get(s.id) != current[s.id]]
            if changed:
                digest, known = _digest(result.states), current
                for s in changed:
                    yield _event("status", _status_data(s), Cursor(step_id, digest))
                if result.progress is not None:
                    p = result.progress
                    data = {"total": p.total, "finished": p.finished, "counts": p.counts}
                    data |= {"eta_s": p.eta_s, "eta_text": p.eta_text}
                    yield _event("progress", data, Cursor(step_id, digest))
            if all(s.status in FINISHED_STATUSES for s in result.states):
                yield _event("end", {"reason": "finished"}, Cursor(step_id, digest))
                return
            await anyio.sleep(poll_interval_s)

    return EventSourceResponse(_events(), ping=15, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
