"""Readers for docker-compose.yml and docker/*.Dockerfile, resolved against the real CLI
and settings (no Docker engine needed): shared by the compose and image tests."""

from __future__ import annotations

import json
import re
import shlex
import socket
import tomllib
from pathlib import Path

import typer

from ckptlab.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
CPU_OVERRIDE = ROOT / "docker" / "compose.cpu.yml"
DOCKERFILES = {"backend": ROOT / "docker" / "backend.Dockerfile", "worker": ROOT / "docker" / "worker.Dockerfile"}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
APP_SERVICES = ("backend", "worker")
DOCUMENTED_PG_URL = "postgresql+psycopg://ckptlab:ckptlab@postgres/ckptlab"


# --- helpers ------------------------------------------------------------------------------


_VAR = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\}")


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's variable interpolation for ``$$``, ``${X}``, ``${X-d}`` and ``${X:-d}``."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, default = m.group("name"), m.group("op"), m.group("default")
        if op == ":-":
            return env.get(name) or default
        if op == "-":
            return env[name] if name in env else default
        return env.get(name, "")

    return _VAR.sub(sub, value)


def service_env(service: dict, env: dict[str, str] | None = None) -> dict[str, str]:
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {k: interpolate(str(v), env or {}) for k, v in raw.items() if v is not None}


def as_list(value: str | list[str] | None) -> list[str] | None:
    if value is None or isinstance(value, list):
        return value
    return shlex.split(value)


def parse_dockerfile(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs: comments dropped, continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        word, _, rest = full.partition(" ")
        instructions.append((word.upper(), rest.strip()))
    assert not pending, f"{path.name}: dangling line continuation"
    return instructions


def dockerfile_exec_form(path: Path, instruction: str) -> list[str] | None:
    """The last ENTRYPOINT or CMD (the one in force), which must be in exec (JSON) form."""
    values = [rest for word, rest in parse_dockerfile(path) if word == instruction]
    if not values:
        return None
    value = json.loads(values[-1])  # shell form would run under /bin/sh -c and eat SIGTERM
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"{path.name} {instruction}: {value}"
    return value


def dockerfile_args(path: Path) -> dict[str, str]:
    """ARGs declared in the final stage (an ARG before FROM is not visible to RUN)."""
    args: dict[str, str] = {}
    for word, rest in parse_dockerfile(path):
        if word == "FROM":
            args = {}
        elif word == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default.strip().strip('"').strip("'")
    return args


def pip_installs(path: Path) -> list[str]:
    """The ``pip install ...`` commands of every RUN, one string each."""
    out = []
    for word, rest in parse_dockerfile(path):
        if word == "RUN":
            for part in re.split(r"&&|;", rest):
                if re.search(r"\bpip\d*(\.\d+)?\s+install\b", part):
                    out.append(part.strip())
    return out


def installed_extras(path: Path) -> set[str]:
    """Extras of the project itself (``pip install ".[a,b]"``) in a Dockerfile."""
    extras: set[str] = set()
    for cmd in pip_installs(path):
        for token in shlex.split(cmd):
            m = re.fullmatch(r"(?:\.|/src)\[([^\]]*)\]", token)
            if m:
                extras |= {e.strip() for e in m.group(1).split(",") if e.strip()}
    return extras


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() for r in requirements}


def effective_argv(name: str, compose: dict) -> tuple[list[str], list[str]]:
    """(entrypoint, command) a service runs: compose's keys over the Dockerfile's."""
    svc = compose["services"][name]
    entrypoint = as_list(svc.get("entrypoint")) or dockerfile_exec_form(DOCKERFILES[name], "ENTRYPOINT")
    command = as_list(svc.get("command")) or dockerfile_exec_form(DOCKERFILES[name], "CMD")
    assert entrypoint, f"{name}: no entrypoint"
    return entrypoint, command or []


def check_cli_invocation(argv: list[str]):
    """Resolve ``ckptlab SUB --opt value ...`` against the real typer app, as it would run."""
    group = typer.main.get_command(app)  # a click group (typer may vendor its own click)
    assert argv, "no subcommand"
    sub_name, args = argv[0], argv[1:]
    assert sub_name in group.commands, f"{sub_name!r} is not a ckptlab command ({sorted(group.commands)})"
    sub = group.commands[sub_name]
    known = {opt for p in sub.params for opt in (*p.opts, *getattr(p, "secondary_opts", []))}
    for token in args:
        if token.startswith("--"):
            opt = token.split("=", 1)[0]
            assert opt in known, f"ckptlab {sub_name} has no option {opt} (it has {sorted(known)})"
    # click's own parser: unknown options, missing values and bad types (--port x) raise here
    return sub.make_context(sub_name, list(args))


def published_ports(service: dict) -> list[tuple[str | None, str, str]]:
    """``(host_ip, published, target)`` for each port, short or long syntax."""
    out = []
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            out.append((port.get("host_ip"), str(port.get("published")), str(port["target"])))
            continue
        parts = str(port).split(":")
        if len(parts) == 3:
            out.append((parts[0], parts[1], parts[2]))
        elif len(parts) == 2:
            out.append((None, parts[0], parts[1]))
        else:
            out.append((None, "", parts[0]))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
