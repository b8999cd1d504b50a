"""A throwaway PostgreSQL cluster for tests and benchmarks (Debian's server binaries).

``initdb`` refuses to run as root, so as root the cluster is created and run as the
``postgres`` OS user (``runuser -u postgres --``). It listens on 127.0.0.1 on a free port
and on a unix socket in its own folder, trusts local connections, and trades durability for
speed (``fsync=off``): it is deleted when stopped.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

__all__ = ["PostgresCluster", "find_pg_bin"]


def find_pg_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` holding ``initdb``, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresCluster:
    """A started cluster; ``url`` reaches its ``postgres`` database as superuser ``postgres``.

    Args:
        pg_bin: folder of the server binaries (see :func:`find_pg_bin`).

    Raises:
        RuntimeError: the cluster did not initialise or start (with the server log).
    """

    def __init__(self, pg_bin: Path):
        self.pg_bin = pg_bin
        self.root = Path(tempfile.mkdtemp(prefix="ckptlab-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        opts = (
            f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "server.log"), "-w", "start")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.pg_bin / tool), *args]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            log = self.root / "server.log"
            raise RuntimeError(
                f"{tool} failed ({proc.returncode}): {proc.stderr or proc.stdout}"
                + (f"\n{log.read_text()}" if log.exists() else "")
            )

    def create_database(self) -> str:
        """Create an empty database; returns its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its folder."""
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
