"""The ``ckptlab`` command line: ``up``, ``serve``, ``worker`` and ``run``.

Exit codes: 0 success, 1 the experiment failed, 2 bad input (one line on stderr).
The backend and worker are imported inside the commands that need them, so ``ckptlab``
itself imports neither torch nor FastAPI.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from ckptlab.settings import Settings, get_settings
from ckptlab.spec import ExperimentSpec

app = typer.Typer(
    help="Activation-checkpointing experiments: memory against recomputation time.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()


def _fail(message: str, code: int = 2) -> typer.Exit:
    """Print one line to stderr and return the Exit to raise."""
    sys.stderr.write(f"error: {message}\n")
    return typer.Exit(code)


def format_validation_error(exc: ValidationError) -> str:
    """One line naming every bad field: ``field.path: message; ...``."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "spec"
        parts.append(f"{loc}: {err['msg']}")
    return "invalid spec: " + "; ".join(parts)


def load_spec(path: Path) -> ExperimentSpec:
    """Read and validate a spec file. Raises ``typer.Exit(2)`` with one line on any problem."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise _fail(f"spec file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(f"cannot read spec file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise _fail(f"{path} is not valid JSON: {exc}") from None
    try:
        return ExperimentSpec.model_validate(raw)
    except ValidationError as exc:
        raise _fail(format_validation_error(exc)) from None


def _settings() -> Settings:
    s = get_settings()
    s.data_dir.mkdir(parents=True, exist_ok=True)
    return s


@app.command()
def run(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC.json", help="experiment spec (JSON)")],
    json_out: Annotated[bool, typer.Option("--json", help="print the summary as JSON on the last line")] = False,
) -> None:
    """Run one experiment in this process, store it, and print its steps and summary."""
    spec = load_spec(spec_path)
    from ckptlab.db.engine import make_engine, make_sessionmaker, migrate
    from ckptlab.db.store import create_experiment, get_experiment, list_steps
    from worker.service import default_worker_id, execute_experiment

    url = _settings().resolved_database_url
    engine = make_engine(url)
    migrate(engine)
    Session = make_sessionmaker(engine)
    with Session() as session:
        exp = create_experiment(session, spec=spec, status="running", worker_id=default_worker_id())
    execute_experiment(url, exp.id, exp.attempt)
    with Session() as session:
        exp = get_experiment(session, experiment_id=exp.id)
        steps = list_steps(session, experiment_id=exp.id)
    engine.dispose()

    table = Table(title=f"experiment {exp.id}: {spec.model.kind} {spec.checkpoint.strategy}")
    for col in ("step", "forward ms", "backward ms", "optimizer ms", "step ms", "allocated MiB", "peak MiB"):
        table.add_column(col, justify="right")
    for s in steps:
        table.add_row(
            str(s.step),
            f"{s.forward_ms:.1f}",
            f"{s.backward_ms:.1f}",
            f"{s.optimizer_ms:.1f}",
            f"{s.step_ms:.1f}",
            f"{s.allocated_bytes / 2**20:.2f}",
            f"{s.peak_allocated_bytes / 2**20:.2f}",
        )
    console.print(table)
    result = {"id": exp.id, "status": exp.status, **(exp.summary or {}), "error": exp.error}
    if exp.status == "succeeded":
        sm = exp.summary
        console.print(
            f"activation {sm['activation_bytes'] / 2**20:.2f} MiB, peak {sm['peak_allocated_bytes'] / 2**20:.2f} MiB, "
            f"step {sm['step_time_ms']:.1f} ms, params without grad {sm['params_without_grad']}"
        )
    else:
        console.print(f"[red]{exp.status}[/red]: {exp.error}")
    if json_out:
        sys.stdout.write(json.dumps(result) + "\n")
    if exp.status != "succeeded":
        raise typer.Exit(1)


@app.command()
def worker(
    once: Annotated[bool, typer.Option(help="exit when the queue is empty")] = False,
    devices: Annotated[
        str | None,
        typer.Option(help="comma-separated devices, one experiment at a time each: cpu, cuda:0,cuda:1 ..."),
    ] = None,
    cpu_slots: Annotated[int, typer.Option(min=1, help="concurrent experiments on cpu")] = 1,
) -> None:
    """Claim queued experiments and run them until SIGTERM / Ctrl-C.

    The first SIGTERM or SIGINT stops claiming and gives running experiments
    CKPTLAB_SHUTDOWN_GRACE_S to finish before they are killed and requeued; a second one
    requeues them at once. Devices default to every visible CUDA device, else cpu.
    """
    from worker.service import run_worker, slot_devices

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    s = _settings()
    device_list = [d for d in devices.split(",") if d.strip()] if devices is not None else None
    try:
        slot_devices(device_list, cpu_slots=cpu_slots)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    stop, kill = threading.Event(), threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if stop.is_set():
            logging.getLogger("ckptlab.worker").warning("second signal: requeueing running experiments now")
            kill.set()
        else:
            logging.getLogger("ckptlab.worker").warning(
                "%s: claiming nothing more; running experiments get %g s to finish",
                signal.Signals(signum).name,
                s.shutdown_grace_s,
            )
            stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    run_worker(
        database_url=s.resolved_database_url,
        stop_event=stop,
        kill_event=kill,
        poll_interval_s=s.poll_interval_s,
        exit_when_idle=once,
        devices=device_list,
        cpu_slots=cpu_slots,
        settings=s,
    )


def _serve(s: Settings) -> None:
    import uvicorn

    from backend.app import create_app

    uvicorn.run(create_app(s), host=s.host, port=s.port, log_level="warning")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="bind address (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="port (default 8000)")] = None,
) -> None:
    """Serve the REST API and the frontend."""
    s = _settings().model_copy(update={k: v for k, v in {"host": host, "port": port}.items() if v})
    console.print(f"ckptlab API on http://{s.host}:{s.port}")
    _serve(s)


@app.command()
def up(
    host: Annotated[str | None, typer.Option(help="bind address (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="port (default 8000)")] = None,
) -> None:
    """Start the backend and one worker on an embedded SQLite database under ./data."""
    s = _settings().model_copy(update={k: v for k, v in {"host": host, "port": port}.items() if v})
    from ckptlab.db.engine import make_engine, migrate

    engine = make_engine(s.resolved_database_url)
    migrate(engine)  # once, before two processes would race to do it
    engine.dispose()
    env = {**os.environ, "CKPTLAB_DATABASE_URL": s.resolved_database_url}
    worker_proc = subprocess.Popen([sys.executable, "-m", "ckptlab", "worker"], env=env)
    console.print(f"ckptlab is up: http://{s.host}:{s.port}  (database {s.resolved_database_url})")
    sys.stdout.flush()
    # uvicorn re-raises the SIGTERM it captured once it has shut down; make that an exit so
    # the finally below stops the worker instead of leaving it orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        _serve(s)
    finally:
        worker_proc.send_signal(signal.SIGTERM)
        try:
            # the worker gives a running experiment shutdown_grace_s, then requeues it
            worker_proc.wait(timeout=s.shutdown_grace_s + 10)
        except subprocess.TimeoutExpired:
            worker_proc.kill()


def main() -> None:
    """Console-script entry point."""
    app()
