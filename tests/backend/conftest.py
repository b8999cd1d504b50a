"""Fixtures and helpers for the API tests: app factories, stored runs, a live server, SSE."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from ckptlab.db import queue, store
from ckptlab.db.models import Experiment
from ckptlab.settings import Settings
from ckptlab.summary import RunSummary
from tests.factories import make_spec


@pytest.fixture
def make_client(settings: Settings) -> Iterator[Callable[..., TestClient]]:
    """``make_client(**overrides)``: a client of an app whose settings get ``overrides``
    (same database as the ``client`` fixture)."""
    clients: list[TestClient] = []

    def make(**overrides: Any) -> TestClient:
        from ckptlab.backend.app import create_app

        c = TestClient(create_app(Settings(**{**settings.model_dump(), **overrides})))
        c.__enter__()
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.__exit__(None, None, None)


def step_record(step: int, **values: Any) -> dict[str, Any]:
    """A step record as a worker writes it (every field set; ``values`` override)."""
    rec = {
        "step": step,
        "forward_ms": 1.0,
        "backward_ms": 2.0,
        "optimizer_ms": 0.5,
        "step_ms": 3.5,
        "allocated_bytes": 1000,
        "peak_allocated_bytes": 2000,
        "reserved_bytes": None,
        "loss": 1.0 / step,
    }
    rec.update(values)
    return rec


def running_experiment(session: Session, **spec_overrides: Any) -> Experiment:
    """A stored experiment in ``running``, attempt 1, as if a worker had claimed it."""
    return store.create_experiment(session, spec=make_spec(**spec_overrides), status="running", worker_id="test:1")


def add_steps(session: Session, exp: Experiment, steps: range | list[int], **values: Any) -> None:
    """Store steps of ``exp``'s current attempt, one commit."""
    store.add_steps(
        session, experiment_id=exp.id, attempt=exp.attempt, records=[step_record(s, **values) for s in steps]
    )


def finish_next(session: Session, experiment_id: int, summary: dict[str, Any]) -> None:
    """Claim the next queued experiment (it must be ``experiment_id``) and finish it
    ``succeeded`` with ``summary``, as a worker would."""
    exp = queue.claim_next(session, worker_id="test:1")
    assert exp is not None and exp.id == experiment_id, (exp and exp.id, experiment_id)
    queue.finish_experiment(
        session, experiment_id=experiment_id, status="succeeded", summary=RunSummary.model_validate(summary)
    )


@dataclass
class Event:
    """One Server-Sent Event."""

    event: str
    id: str | None
    data: dict[str, Any]


def parse_sse(text: str) -> list[Event]:
    """The events of a ``text/event-stream`` body (comments and pings skipped)."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value
        if "data" in fields:
            events.append(Event(fields.get("event", "message"), fields.get("id"), json.loads(fields["data"])))
    return events


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def live_server_factory(settings: Settings) -> Iterator[Callable[..., str]]:
    """``live_server_factory(**overrides)``: the API with ``overrides`` applied to its
    settings, served by uvicorn on 127.0.0.1 in a thread (real sockets, so streams arrive as
    they are sent); returns the base URL. Every server stops at the end of the test."""
    from ckptlab.backend.app import create_app

    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(**overrides: Any) -> str:
        port = _free_port()
        app = create_app(Settings(**{**settings.model_dump(), **overrides}))
        # Open streams would hold a graceful shutdown for its whole wait: 1 s is plenty here.
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.monotonic() + 20
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def live_server(live_server_factory: Callable[..., str]) -> str:
    """The API with the test's settings, served by uvicorn (see :func:`live_server_factory`)."""
    return live_server_factory()
