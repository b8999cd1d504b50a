"""The FastAPI application: ``/api`` routes and the static frontend at ``/``."""

from __future__ import annotations

import math
from contextlib import asynccontextmanager
from importlib import resources
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from starlette.middleware.trustedhost import TrustedHostMiddleware

from ckptlab.backend.api import experiments, meta, plans, predictions, sweeps, timelines
from ckptlab.backend.deps import WRITE_METHODS, require_write_token
from ckptlab.backend.encoding import SafeJSONResponse
from ckptlab.backend.middleware import (
    MAX_JSON_DEPTH,
    AllowEveryMethod,
    BodySizeLimit,
    CatchErrors,
    StreamCap,
    StreamSlots,
    WriteGuard,
)
from ckptlab.backend.services.responses import BUSY_RESPONSE, SSE_MEDIA_TYPE
from ckptlab.backend.services.series import SeriesCache, series_warmer_task
from ckptlab.backend.services.streams import SharedPolls
from ckptlab.db.database import make_engine, make_sessionmaker, migrate
from ckptlab.db.reaper import reaper_task
from ckptlab.settings import Settings, get_settings

__all__ = ["create_app", "FRONTEND_DIR", "PLOTLY_JS"]

FRONTEND_DIR = Path(str(resources.files("ckptlab.frontend")))
PLOTLY_JS = Path(str(resources.files("plotly"))) / "package_data" / "plotly.min.js"


def _version() -> str:
    try:
        return version("ckptlab")
    except PackageNotFoundError:
        return "0+unknown"


_DESCRIPTION = """
Submit activation-checkpointing experiments and sweeps, follow them live (Server-Sent
Events), and read their per-step series, charts and exports.

- Inputs are validated: 422 names the field (``loc``); unknown fields are rejected; bodies
  over the server's ``max_request_bytes`` get 413, JSON nested deeper than {depth} levels
  422; unknown ids get 404.
- Writes (POST, PUT, PATCH, DELETE) send ``Content-Type: application/json`` when they send
  anything (else 415); a browser's write from another origin than the server's own or
  ``CKPTLAB_CORS_ORIGINS`` gets 403; a ``Host`` not in ``CKPTLAB_ALLOWED_HOSTS`` gets 400.
- A database too busy to answer (a lock held longer than the busy timeout) gets 503 with
  ``Retry-After``: send the same request again after that many seconds.
- When the server sets ``CKPTLAB_API_TOKEN``, writes (POST, PUT, PATCH, DELETE) need
  ``Authorization: Bearer <token>``; reads stay open, but for a run's log
  (``GET /api/experiments/{{id}}/log``: its traceback names the host's files).
- A stored row that does not read back (invalid JSON, a date that is not one) is served
  with ``corrupt`` saying what failed, never a 500 for the listing; an unexpected error is
  a 500 that leaves the connection open.
- Times are in ms, memory in bytes, timestamps in UTC.
"""


#: Seconds a client is told to wait after a 503 for a busy database (``Retry-After``).
DB_BUSY_RETRY_AFTER_S = 2


def _db_busy(request: Request, exc: Exception) -> JSONResponse:
    """The database could not be reached or stayed locked past its busy timeout (SQLite: 5 s,
    :data:`ckptlab.db.database.SQLITE_BUSY_TIMEOUT_MS`): nothing was written (the
    transaction rolled back), so the same request can be sent again. 503, not a 500."""
    return JSONResponse(
        {"detail": f"the database is busy or unreachable; nothing was changed: retry in {DB_BUSY_RETRY_AFTER_S} s"},
        status_code=503,
        headers={"Retry-After": str(DB_BUSY_RETRY_AFTER_S)},
    )


def _data_error(request: Request, exc: Exception) -> JSONResponse:
    """The database refused a value (out of range, wrong type): the input's fault, not a 500."""
    return JSONResponse({"detail": f"the database refused a value: {type(exc).__name__}"}, status_code=422)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 (``{"detail": [{"loc", "msg", "type", "input"}]}``), safe for inputs that
    JSON cannot hold (a NaN the body parser let through is echoed as the string "nan")."""
    return SafeJSONResponse({"detail": _json_safe(jsonable_encoder(exc.errors()))}, status_code=422)


def _integrity_error(request: Request, exc: Exception) -> JSONResponse:
    """A constraint was violated (duplicate or dangling reference): a conflict, not a 500."""
    return JSONResponse({"detail": "the request conflicts with stored data (a database constraint)"}, status_code=409)


def _openapi_reads_need_no_token(app: FastAPI) -> None:
    """Show the bearer requirement on write operations and on the reads that need the token
    (those that document a 401: :func:`ckptlab.backend.deps.require_token`) only, and nowhere
    when the server sets no token; other reads stay open."""
    default = app.openapi
    token = app.state.settings.api_token is not None

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = default()
            for ops in schema.get("paths", {}).values():
                for method, op in ops.items():
                    if not isinstance(op, dict) or method.upper() in WRITE_METHODS:
                        continue
                    if not (token and "401" in op.get("responses", {})):
                        op.pop("security", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app for ``settings`` (default: from the environment).

    The database is migrated to the newest revision at start-up. With ``api_token`` set,
    writes need ``Authorization: Bearer <token>``; with ``cors_origins`` set, CORS is on for
    those origins (it is off by default); bodies over ``max_request_bytes`` get 413. A
    ``Host`` outside ``settings.trusted_hosts`` gets 400 and a cross-site or non-JSON write
    403 / 415 (:class:`ckptlab.backend.middleware.WriteGuard`), with or without a token.

    Args:
        settings: the settings to serve with. Default: :func:`ckptlab.settings.get_settings`.
    """
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = make_engine(settings.resolved_database_url)
        migrate(engine)
        app.state.engine = engine
        app.state.sessionmaker = make_sessionmaker(engine)
        app.state.series_cache = SeriesCache(settings.series_cache_bytes)
        app.state.shared_polls = SharedPolls(ttl_s=settings.sse_poll_interval_s)
        # Side tasks: requeue experiments of lost workers; keep running series warm. A pass
        # that raises is logged and the loop goes on (restart), so the API keeps serving.
        tasks = [reaper_task(app.state.sessionmaker, settings, restart=True)]
        if settings.series_warm_interval_s > 0:
            tasks.append(
                series_warmer_task(
                    app.state.sessionmaker, app.state.series_cache, interval_s=settings.series_warm_interval_s
                )
            )
        app.state.side_tasks = [t.start() for t in tasks]
        # The OpenAPI document, built once before the first request: the method and stream
        # middlewares route by it, and building it on a first request cost ~300 ms
        # (bench/bench_timeline.py: a fresh process's first timeline read 387 ms).
        app.openapi()
        yield
        for t in tasks:
            t.stop()
        engine.dispose()

    # Swagger UI and ReDoc assets come from the fastapi-offline package, not a CDN.
    app = FastAPIOffline(
        title="ckptlab",
        version=_version(),
        summary="Activation-checkpointing experiments: memory against recomputation time.",
        description=_DESCRIPTION.format(depth=MAX_JSON_DEPTH),
        lifespan=lifespan,
        default_response_class=SafeJSONResponse,
    )
    app.state.settings = settings
    auth = [Depends(require_write_token)] if settings.api_token is not None else []
    api = APIRouter(prefix="/api", dependencies=auth, responses=BUSY_RESPONSE)
    api.include_router(experiments.router)
    api.include_router(timelines.router)
    api.include_router(timelines.prediction_router)
    api.include_router(sweeps.router)
    api.include_router(plans.router)
    api.include_router(predictions.router)
    api.include_router(meta.router)

    app.include_router(api)

    @app.get("/static/plotly.min.js", include_in_schema=False)
    def plotly_js() -> FileResponse:
        return FileResponse(PLOTLY_JS, media_type="text/javascript")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(FRONTEND_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=FRONTEND_DIR), name="static")
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(DataError, _data_error)
    app.add_exception_handler(IntegrityError, _integrity_error)
    app.add_exception_handler(OperationalError, _db_busy)
    # Innermost: an exception no handler took is a 500 that ends there (no reset connection).
    app.add_middleware(CatchErrors)
    # Then the stream cap: a stream over it is refused before any work for it (no routing).
    app.state.stream_slots = StreamSlots(settings.max_streams)
    app.add_middleware(
        StreamCap, slots=app.state.stream_slots, openapi=lambda: app.openapi(), media_type=SSE_MEDIA_TYPE
    )
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
        )
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(AllowEveryMethod, openapi=lambda: app.openapi())
    # Outermost last: a foreign Host is refused before anything else (DNS rebinding), then
    # cross-site and non-JSON writes (CSRF).
    app.add_middleware(WriteGuard, allowed_origins=settings.cors_origins)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=settings.trusted_hosts, www_redirect=False)
    _openapi_reads_need_no_token(app)
    return app
