"""Settings for every ckptlab process, read from ``CKPTLAB_*`` environment variables."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings"]


class Settings(BaseSettings):
    """One settings class for the backend, the worker and the CLI.

    Args:
        database_url: SQLAlchemy URL (``CKPTLAB_DATABASE_URL``). Default: a SQLite file
            ``ckptlab.db`` under ``data_dir``. PostgreSQL:
            ``postgresql+psycopg://user:pass@host/db``.
        data_dir: folder for the SQLite file and artifacts (default ``./data``).
        host: address the backend binds (default ``127.0.0.1``: local only).
        port: backend port (default 8000).
        poll_interval_s: how long an idle worker sleeps between claims, seconds (default 0.5).
    """

    model_config = SettingsConfigDict(env_prefix="CKPTLAB_", extra="ignore")

    database_url: str | None = None
    data_dir: Path = Path("data")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    poll_interval_s: float = Field(0.5, gt=0)

    @property
    def resolved_database_url(self) -> str:
        """The database URL; the default SQLite file lives under ``data_dir``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'ckptlab.db').resolve()}"


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read once from the environment."""
    return Settings()
