"""Live streams of steps and status changes as Server-Sent Events (sse-starlette).

Each stream polls the database every ``sse_poll_interval_s`` (default 0.15 s) in a worker
thread, with a fresh session per poll (a long-lived SQLite read transaction would never see
new commits). Events:

- ``step``: ``{"experiment_id", "attempt", "step", "forward_ms", ..., "loss", "loss_nonfinite"}``
- ``status``: ``{"experiment_id", "status", "attempt", "error"}``, on connect and on every
  change (a retried experiment shows its new ``attempt``).
- ``progress`` (sweeps only): ``{"total", "finished", "counts"}`` after status changes.
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

import hashlib
import json
import math
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
from fastapi import Depends, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.orm import Session, sessionmaker
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from ckptlab.db.models import FINISHED_STATUSES
from ckptlab.db.queries import ExperimentState, StepRow, experiment_states, steps_after
from ckptlab.db.sweeps import Progress, sweep_progress

__all__ = [
    "Cursor",
    "parse_last_event_id",
    "cursor_from_header",
    "LAST_EVENT_ID_PATTERN",
    "StreamRequest",
    "StreamDep",
    "event_stream",
    "EVENT_TYPES",
]

LAST_EVENT_ID_PATTERN = r"^\d{1,19}(:[0-9a-f]{0,32})?$"
EVENT_TYPES = ("step", "status", "progress", "end")
_MAX_CURSOR = 2**63 - 1
#: Steps read per poll; a stream catching up reads again at once.
BATCH = 1000


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


def _status_data(s: ExperimentState) -> dict[str, Any]:
    return {"experiment_id": s.id, "status": s.status, "attempt": s.attempt, "error": s.error}


def _event(kind: str, data: dict[str, Any], cursor: Cursor) -> ServerSentEvent:
    return ServerSentEvent(
        data=json.dumps(data, allow_nan=False, default=str, separators=(",", ":")), event=kind, id=cursor.event_id()
    )


@dataclass
class _Poll:
    states: list[ExperimentState]
    steps: list[StepRow]
    progress: Progress | None


@dataclass(frozen=True)
class StreamRequest:
    """What a stream route needs from its request.

    Attributes:
        sessions: the app's session factory (one short session per poll).
        cursor: where the client resumes (from ``Last-Event-ID``).
        poll_interval_s: the server's ``sse_poll_interval_s``.
        include_steps: the ``steps`` query flag.
    """

    sessions: sessionmaker[Session]
    cursor: Cursor
    poll_interval_s: float
    include_steps: bool


def stream_request(
    request: Request,
    last_event_id: Annotated[
        str | None,
        Header(
            pattern=LAST_EVENT_ID_PATTERN,
            description="resume after this event id (browsers send it when they reconnect)",
        ),
    ] = None,
    steps: Annotated[bool, Query(description="send step events (false: statuses and progress only)")] = True,
) -> StreamRequest:
    """The :class:`StreamRequest` of a stream route (a 422 names a malformed Last-Event-ID)."""
    return StreamRequest(
        sessions=request.app.state.sessionmaker,
        cursor=cursor_from_header(last_event_id),
        poll_interval_s=request.app.state.settings.sse_poll_interval_s,
        include_steps=steps,
    )


StreamDep = Annotated[StreamRequest, Depends(stream_request)]


def event_stream(
    stream: StreamRequest,
    *,
    experiment_ids: Callable[[Session], list[int]],
    sweep_id: int | None = None,
) -> EventSourceResponse:
    """An SSE response streaming steps and status changes of some experiments.

    Args:
        stream: the request's cursor, poll interval and step flag (:data:`StreamDep`).
        experiment_ids: reads the experiments to watch (the sweep's, or one id).
        sweep_id: the sweep, for ``progress`` events (default None: one experiment).
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
                and (known is None or s.status == "running" or known.get(s.id) != (s.status, s.attempt))
            ]
            steps = steps_after(session, attempts=pairs, after_id=after, limit=BATCH) if include_steps else []
            progress = sweep_progress(session, sweep_ids=[sweep_id])[sweep_id] if sweep_id is not None else None
            return _Poll(states, steps, progress)

    async def generate() -> AsyncIterator[ServerSentEvent]:
        step_id, digest = cursor.step_id, cursor.digest
        known: dict[int, tuple[str, int]] = {}  # statuses the client has been sent
        full, resumed = True, False
        while True:
            result = await run_in_threadpool(poll, step_id, None if full else dict(known))
            for row in result.steps:
                step_id = row.id
                yield _event("step", _step_data(row), Cursor(step_id, digest))
            full = len(result.steps) >= BATCH
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
                    yield _event("progress", data, Cursor(step_id, digest))
            if all(s.status in FINISHED_STATUSES for s in result.states):
                yield _event("end", {"reason": "finished"}, Cursor(step_id, digest))
                return
            await anyio.sleep(poll_interval_s)

    return EventSourceResponse(generate(), ping=15, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
