"""The database: one :class:`Database` object per process holds the engine, the session
factory and the migrations, for SQLite (default) and PostgreSQL."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from filelock import FileLock
from sqlalchemy import ColumnElement, Engine, Executable, create_engine, event, func, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from ckptlab.db.models import utcnow

__all__ = [
    "Database",
    "make_engine",
    "migrate",
    "make_sessionmaker",
    "is_postgresql",
    "db_now",
    "raw_cursor",
    "placeholder",
    "SQLITE_BUSY_TIMEOUT_MS",
]

_MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
#: PostgreSQL advisory lock key held while migrating (any constant shared by all processes).
_MIGRATION_LOCK_KEY = 0x636B7074  # "ckpt"
#: How long one SQLite statement waits for another connection's write lock, ms.
SQLITE_BUSY_TIMEOUT_MS = 5000


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    # WAL lets the backend read while a worker writes steps; busy_timeout makes a writer
    # wait (ms) for the lock instead of failing at once. It is kept well below the lease
    # (60 s): a longer lock is retried by the caller (ckptlab.db.retry), whose deadline knows
    # the lease, instead of one statement blocking a heartbeat past it.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def read_json(text: str | bytes) -> Any:
    """A stored JSON value (every JSON column's deserializer): orjson, about four times as
    fast as ``json`` on a long run's summary (its step times: a 20,000-step paired run's is
    1.5 MB), and ``json`` for what orjson refuses (``NaN``, which ``json.dumps`` writes).

    Raises:
        json.JSONDecodeError: ``text`` is not JSON.
    """
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def make_engine(url: str) -> Engine:
    """Create an engine for ``url``, its JSON columns read by :func:`read_json`.

    SQLite files get WAL mode, a :data:`SQLITE_BUSY_TIMEOUT_MS` (5 s) busy timeout and foreign
    keys; their parent folder is created. Raises ``sqlalchemy.exc.ArgumentError`` for a malformed URL.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False}, json_deserializer=read_json)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, json_deserializer=read_json)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """A session factory whose objects stay readable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


def migrate(engine: Engine) -> None:
    """Upgrade the database behind ``engine`` to the newest Alembic revision.

    Idempotent; the same migrations serve SQLite and PostgreSQL. Processes that start at
    once are serialised: on PostgreSQL by a transaction-scoped advisory lock (workers on many
    hosts), on an SQLite file by a lock file beside it (``<file>.migrate.lock``,
    ``filelock``): SQLite's deferred transaction lets two processes both read "no revision"
    and the second's ``CREATE TABLE`` fail ("table experiments already exists": a backend
    and a worker started together on a fresh file, seen in CI).
    """
    from alembic import command

    cfg = _alembic_config()
    with _sqlite_file_lock(engine), engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def _sqlite_file_lock(engine: Engine) -> AbstractContextManager[Any]:
    """An exclusive lock on ``<database file>.migrate.lock`` for an SQLite file, else nothing."""
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        return nullcontext()
    return FileLock(f"{database}.migrate.lock")


def _alembic_config():
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    return cfg


def schema_is_current(engine: Engine) -> bool:
    """Whether the database behind ``engine`` is at the newest Alembic revision (a read of
    ``alembic_version``; no lock, no write)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    heads = set(ScriptDirectory.from_config(_alembic_config()).get_heads())
    with engine.connect() as conn:
        current = set(MigrationContext.configure(conn).get_current_heads())
    return current == heads


def is_postgresql(session: Session) -> bool:
    """Whether ``session`` talks to PostgreSQL (else SQLite)."""
    return session.get_bind().dialect.name == "postgresql"


def raw_cursor(session: Session, stmt: Executable) -> Any:
    """Execute ``stmt`` on the session's DBAPI connection (in its transaction) and return the
    raw cursor; the caller closes it.

    Skips SQLAlchemy's per-row result processing, which would double the time to read a
    million rows: rows come back as the driver's tuples (NULL as None).
    """
    conn = session.connection()
    compiled = stmt.compile(dialect=conn.dialect)
    params = compiled.construct_params()
    args: Any = tuple(params[k] for k in compiled.positiontup) if compiled.positional else params
    cur = conn.connection.dbapi_connection.cursor()
    cur.execute(str(compiled), args)
    return cur


def placeholder(session: Session) -> str:
    """The driver's positional parameter marker for hand-written SQL on ``session``'s
    connection: ``?`` for SQLite, ``%s`` for psycopg."""
    return "?" if session.get_bind().dialect.paramstyle == "qmark" else "%s"


def db_now(session: Session) -> datetime | ColumnElement[datetime]:
    """Now, from the database's clock on PostgreSQL (workers on many hosts compare their
    heartbeats against it), else from this process's clock (SQLite is one host's file)."""
    return func.now() if is_postgresql(session) else utcnow()


class Database:
    """The database of one process: engine, session factory and migrations.

    Args:
        url: SQLAlchemy URL (see :func:`make_engine`).

    Attributes:
        url: the URL given.
        engine: the SQLAlchemy engine (pooled; SQLite files in WAL mode).
        Session: the session factory (objects stay readable after commit).

    Use one per process and :meth:`dispose` it at exit (or use it as a context manager).
    Raises ``sqlalchemy.exc.ArgumentError`` for a malformed URL.
    """

    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        self.Session = make_sessionmaker(self.engine)

    def session(self) -> Session:
        """A new session (use as ``with db.session() as s:``)."""
        return self.Session()

    def migrate(self) -> None:
        """Upgrade to the newest revision (see :func:`migrate`)."""
        migrate(self.engine)

    def ensure_schema(self) -> bool:
        """Migrate only when the schema is not at the newest revision; returns whether it
        migrated. Processes call this at start, so migrations run once, not at every start."""
        if schema_is_current(self.engine):
            return False
        self.migrate()
        return True

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dispose()
