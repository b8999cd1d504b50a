"""The FastAPI application: ``/api`` routes and the static frontend at ``/``."""

from __future__ import annotations

from contextlib import asynccontextmanager
from importlib import resources
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy import text

from backend.api import experiments
from backend.deps import SessionDep
from backend.schemas import Health
from ckptlab.db.engine import make_engine, make_sessionmaker, migrate
from ckptlab.settings import Settings, get_settings

__all__ = ["create_app", "FRONTEND_DIR", "PLOTLY_JS"]

FRONTEND_DIR = Path(str(resources.files("frontend")))
PLOTLY_JS = Path(str(resources.files("plotly"))) / "package_data" / "plotly.min.js"


def _version() -> str:
    try:
        return version("ckptlab")
    except PackageNotFoundError:
        return "0+unknown"


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app for ``settings`` (default: from the environment).

    The database is migrated to the newest revision at start-up.
    """
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = make_engine(settings.resolved_database_url)
        migrate(engine)
        app.state.engine = engine
        app.state.sessionmaker = make_sessionmaker(engine)
        yield
        engine.dispose()

    app = FastAPI(
        title="ckptlab",
        version=_version(),
        summary="Activation-checkpointing experiments: memory against recomputation time.",
        lifespan=lifespan,
    )
    api = APIRouter(prefix="/api")
    api.include_router(experiments.router)

    @api.get("/health", response_model=Health, tags=["meta"], summary="Liveness and database check")
    def health(session: SessionDep) -> Health:
        session.execute(text("SELECT 1"))
        return Health(database=session.get_bind().dialect.name, version=_version())

    app.include_router(api)

    @app.get("/static/plotly.min.js", include_in_schema=False)
    def plotly_js() -> FileResponse:
        return FileResponse(PLOTLY_JS, media_type="text/javascript")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(FRONTEND_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=FRONTEND_DIR), name="static")
    return app
