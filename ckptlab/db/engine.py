"""Engine creation and migrations for SQLite (default) and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

__all__ = ["make_engine", "migrate", "make_sessionmaker"]

_MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
#: PostgreSQL advisory lock key held while migrating (any constant shared by all processes).
_MIGRATION_LOCK_KEY = 0x636B7074  # "ckpt"


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    # WAL lets the backend read while a worker writes steps; busy_timeout makes a writer
    # wait (ms) for the lock instead of failing at once.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def make_engine(url: str) -> Engine:
    """Create an engine for ``url``.

    SQLite files get WAL mode, a 10 s busy timeout and foreign keys; their parent folder is
    created. Raises ``sqlalchemy.exc.ArgumentError`` for a malformed URL.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """A session factory whose objects stay readable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


def migrate(engine: Engine) -> None:
    """Upgrade the database behind ``engine`` to the newest Alembic revision.

    Idempotent; the same migrations serve SQLite and PostgreSQL. On PostgreSQL a
    transaction-scoped advisory lock serialises workers on many hosts that start at once.
    """
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
