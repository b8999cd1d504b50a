"""Many open streams do not starve the API: a stream holds no database connection between
polls, and beyond the server's cap a new stream gets 503 with Retry-After."""

from __future__ import annotations

import threading
import time

import httpx

from tests.backend.conftest import running_experiment


def _hold_stream(url: str, opened: threading.Semaphore, stop: threading.Event) -> None:
    with httpx.Client(timeout=30) as c, c.stream("GET", url) as r:
        opened.release()
        for _ in r.iter_lines():
            if stop.is_set():
                return


def test_more_streams_than_pooled_connections_leave_the_api_answering(live_server, db_session):
    exp = running_experiment(db_session)  # never finishes: its streams stay open
    n = 25  # the pool holds 5 + 10 overflow connections
    opened, stop = threading.Semaphore(0), threading.Event()
    threads = [
        threading.Thread(
            target=_hold_stream, args=(f"{live_server}/api/experiments/{exp.id}/events", opened, stop), daemon=True
        )
        for _ in range(n)
    ]
    for t in threads:
        t.start()
    try:
        for _ in range(n):
            assert opened.acquire(timeout=20), "a stream did not open"
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            r = httpx.get(f"{live_server}/api/experiments/{exp.id}", timeout=10)
            times.append(time.perf_counter() - t0)
            assert r.status_code == 200
        assert max(times) < 2.0, times
    finally:
        stop.set()


def test_a_stream_over_the_cap_gets_503_with_retry_after(live_server_factory, db_session):
    url = live_server_factory(max_streams=2)
    exp = running_experiment(db_session)
    opened, stop = threading.Semaphore(0), threading.Event()
    threads = [
        threading.Thread(
            target=_hold_stream, args=(f"{url}/api/experiments/{exp.id}/events", opened, stop), daemon=True
        )
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    try:
        for _ in range(2):
            assert opened.acquire(timeout=20)
        r = httpx.get(f"{url}/api/experiments/{exp.id}/events", timeout=10)
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
        assert "streams" in r.json()["detail"]
        assert httpx.get(f"{url}/api/health", timeout=10).status_code == 200
    finally:
        stop.set()
