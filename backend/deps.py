"""FastAPI dependencies (``Annotated`` aliases, after the full-stack FastAPI template)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from ckptlab.backend.middleware import WRITE_METHODS
from ckptlab.backend.services.predictions import PredictionSlots
from ckptlab.backend.services.series import SeriesCache
from ckptlab.settings import Settings

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


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
SeriesCacheDep = Annotated[SeriesCache, Depends(get_series_cache)]
ExperimentId = Annotated[int, Path(ge=1, le=MAX_ID, description="experiment id", examples=[1])]
SweepId = Annotated[int, Path(ge=1, le=MAX_ID, description="sweep id", examples=[1])]
PredictionId = Annotated[int, Path(ge=1, le=MAX_ID, description="prediction id", examples=[1])]
PredictionSlotsDep = Annotated[PredictionSlots, Depends(get_prediction_slots)]

bearer = HTTPBearer(
    auto_error=False,
    description="Needed for writes (POST, PUT, PATCH, DELETE) when the server sets CKPTLAB_API_TOKEN.",
)


def require_write_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    """Reject a write request without ``Authorization: Bearer <token>`` when a token is set.

    Reads pass. The token is compared in constant time (``secrets.compare_digest``).

    Raises:
        HTTPException: 401 with ``WWW-Authenticate: Bearer`` for a missing or wrong token.
    """
    token = request.app.state.settings.api_token
    if token is None or request.method not in WRITE_METHODS:
        return
    given = credentials.credentials if credentials is not None else ""
    if not secrets.compare_digest(given.encode(), token.get_secret_value().encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="this server needs 'Authorization: Bearer <token>' for writes",
            headers={"WWW-Authenticate": "Bearer"},
        )
