"""Retrying database calls that failed for a passing reason (locked, unreachable).

A locked SQLite file (``database is locked``) and a PostgreSQL server that restarts or
drops the connection raise ``OperationalError`` / ``InterfaceError``; those are retried
with exponential back-off (tenacity). Errors of the statement itself (integrity, syntax)
are not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from tenacity import Retrying, before_sleep_log, retry_if_exception, stop_before_delay, wait_exponential

__all__ = ["is_transient", "with_retry"]

log = logging.getLogger("ckptlab.db")

T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    """Whether a database error may go away by itself (lock, lost connection, server restart)."""
    if isinstance(exc, (OperationalError, InterfaceError)):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def with_retry(Session: sessionmaker[Session], fn: Callable[[Session], T], *, deadline_s: float = 60.0) -> T:
    """Call ``fn(session)`` in a fresh session, retrying transient errors; returns its result.

    Args:
        Session: the session factory.
        fn: the work; it must commit what it changes and be safe to run again after a
            transient failure (a failed attempt's transaction is rolled back).
        deadline_s: start no try later than this many seconds after the first (default 60;
            0: one try). Back-off doubles from 50 ms up to 2 s between tries. The last try
            may still run past it, by as long as one statement waits (the SQLite busy
            timeout, 5 s).

    Raises:
        The last transient error once the next try would start after ``deadline_s``; any
        other error at once.
    """

    def once() -> T:
        with Session() as session:
            return fn(session)

    retrying = Retrying(
        retry=retry_if_exception(is_transient),
        wait=wait_exponential(multiplier=0.05, max=2.0),
        stop=stop_before_delay(deadline_s),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )
    return retrying(once)
