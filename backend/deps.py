"""FastAPI dependencies (``Annotated`` aliases, after the full-stack FastAPI template)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

__all__ = ["SessionDep", "get_session"]


def get_session(request: Request) -> Iterator[Session]:
    """A database session for one request, closed afterwards."""
    with request.app.state.sessionmaker() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]
