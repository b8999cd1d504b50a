"""FastAPI dependencies (``Annotated`` aliases, after the full-stack FastAPI template)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Query, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BeforeValidator
from sqlalchemy.orm import Session

from ckptlab.backend.middleware import WRITE_METHODS
from ckptlab.backend.services.predictions import PredictionSlots
from ckptlab.backend.services.series import SeriesCache
from ckptlab.settings import Settings
from ckptlab.summary import PER_STEP_FIELDS

__all__ = [
    "SessionDep",
    "SettingsDep",
    "SeriesCacheDep",
    "PredictionSlotsDep",
    "ExperimentId",
    "SweepId",
    "PredictionId",
    "MAX_ID",
    "get_session",
    "get_settings",
    "require_write_token",
    "require_token",
    "require_token_for_computed_reads",
    "ComputedReadDep",
    "TokenDep",
    "WRITE_METHODS",
]

#: Largest id a path accepts (SQLite and PostgreSQL integers are 64-bit); larger ones get 422.
MAX_ID = 2**63 - 1


def get_session(request: Request) -> Iterator[Session]:
    """A database session for one request, closed afterwards."""
    with request.app.state.sessionmaker() as session:
        yield session


def get_settings(request: Request) -> Settings:
    """The settings the app was created with."""
    return request.app.state.settings


def get_series_cache(request: Request) -> SeriesCache:
    """The app's cache of per-step series."""
    return request.app.state.series_cache


async def get_prediction_slots(request: Request) -> PredictionSlots:
    """The app's cap on concurrent prediction processes (``prediction_slots``), made on first
    use (a coroutine: it runs on the event loop, so two first requests cannot both make one)."""
    slots = getattr(request.app.state, "prediction_slots", None)
    if slots is None:
        slots = request.app.state.prediction_slots = PredictionSlots(request.app.state.settings.prediction_slots)
    return slots


def digits(value: Any) -> Any:
    """An id in a path as the OpenAPI document states it, an integer: decimal digits only
    (pydantic also reads ``" 8"``, ``"+8"``, ``"8_0"`` and ``"8\\x85"`` as 8 or 80).

    Raises:
        ValueError: a text that is not decimal digits.
    """
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError("an id is written in decimal digits only")
    return value


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
SeriesCacheDep = Annotated[SeriesCache, Depends(get_series_cache)]
ExperimentId = Annotated[int, Path(ge=1, le=MAX_ID, description="experiment id", examples=[1]), BeforeValidator(digits)]
SweepId = Annotated[int, Path(ge=1, le=MAX_ID, description="sweep id", examples=[1]), BeforeValidator(digits)]
PredictionId = Annotated[int, Path(ge=1, le=MAX_ID, description="prediction id", examples=[1]), BeforeValidator(digits)]
PredictionSlotsDep = Annotated[PredictionSlots, Depends(get_prediction_slots)]
#: ``?per_step=false`` on the experiments list and on one sweep: each summary without its per-step lists
#: (:data:`ckptlab.summary.PER_STEP_FIELDS`), served by :func:`ckptlab.backend.encoding.json_without_per_step`.
PerStepQuery = Annotated[
    bool,
    Query(
        description="false: each summary without its per-step lists ("
        + ", ".join(PER_STEP_FIELDS)
        + "), which grow with the run's timed steps; GET /api/experiments/{id} has them"
    ),
]

bearer = HTTPBearer(
    auto_error=False,
    description="Needed for writes (POST, PUT, PATCH, DELETE) and for a run's log (GET /api/experiments/{id}/log) "
    "when the server sets CKPTLAB_API_TOKEN.",
)


async def require_write_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    """Reject a write request without ``Authorization: Bearer <token>`` when a token is set.

    Reads pass. The token is compared in constant time (``secrets.compare_digest``). A
    coroutine (it waits on nothing): it runs first on every route, and a worker thread
    would make it wait behind the busy ones (a stream refused at the cap answers at once).

    Raises:
        HTTPException: 401 with ``WWW-Authenticate: Bearer`` for a missing or wrong token.
    """
    if request.method in WRITE_METHODS:
        _check_token(request, credentials, "writes")


async def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    """Reject a request, a read too, without ``Authorization: Bearer <token>`` when a token is
    set: for reads only the operator should make (a run's traceback, with the host's file
    paths). Without a token every request passes, as for writes.

    Raises:
        HTTPException: 401 with ``WWW-Authenticate: Bearer`` for a missing or wrong token.
    """
    _check_token(request, credentials, "this read")


def _check_token(request: Request, credentials: HTTPAuthorizationCredentials | None, what: str) -> None:
    """The token check (constant-time, ``secrets.compare_digest``); a no-op without a token.

    Raises:
        HTTPException: 401 with ``WWW-Authenticate: Bearer`` for a missing or wrong token.
    """
    token = request.app.state.settings.api_token
    if token is None:
        return
    given = credentials.credentials if credentials is not None else ""
    if not secrets.compare_digest(given.encode(), token.get_secret_value().encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail=f"this server needs 'Authorization: Bearer <token>' for {what}",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def require_token_for_computed_reads(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    """With ``CKPTLAB_PROTECT_READS`` (``settings.protect_reads``) and a token set, reject a
    read that computes (a comparison, a sweep's results, charts and recommendation, a plan,
    an export) without the token; without it every such read passes. Cheap reads (lists,
    one experiment, steps, series, streams) stay open either way.

    Raises:
        HTTPException: 401 with ``WWW-Authenticate: Bearer`` for a missing or wrong token.
    """
    if request.app.state.settings.protect_reads:
        _check_token(request, credentials, "this read (CKPTLAB_PROTECT_READS)")


#: A route dependency: the token is needed for this route whatever its method (:func:`require_token`).
TokenDep = Depends(require_token)
#: A route dependency for reads that compute: the token is needed with ``CKPTLAB_PROTECT_READS``.
ComputedReadDep = Depends(require_token_for_computed_reads)
