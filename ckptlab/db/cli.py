"""The database's commands, shared by both processes: ``ckptlab db rebuild-rollups`` and
``ckptlab db check``.

``cli/main.py`` adds :data:`app` beside the worker's and the backend's apps. Exit codes: 0
success, 1 ``db check`` found corrupt rows, 2 bad input (one line on stderr).
"""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ckptlab.db.corrupt import corrupt_rows
from ckptlab.db.database import Database
from ckptlab.db.models import Experiment, Sweep
from ckptlab.db.rollups import attempts_with_steps, rebuild_rollups
from ckptlab.settings import get_settings

__all__ = ["app", "db_app", "PROGRESS_FROM_ROWS"]

app = typer.Typer(add_completion=False)
db_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Maintain the database.")
app.add_typer(db_app, name="db")
console = Console()

#: Work of at least this many step rows shows a progress bar (about two seconds' reading).
PROGRESS_FROM_ROWS = 200_000


@db_app.command("rebuild-rollups")
def rebuild_rollups_command(
    experiment: Annotated[
        int | None, typer.Option("--experiment", min=1, help="only this experiment's attempts (default: all)")
    ] = None,
) -> None:
    """Recompute the per-run rollups that series requests read, from the stored steps.

    ckptlab writes the rollup with each batch of steps; run this after storing steps another way (plain SQL,
    a restore). Each attempt's rollup is replaced in one transaction.
    """
    settings = get_settings()
    with Database(settings.resolved_database_url) as db:
        db.ensure_schema()
        with db.session() as session:
            if experiment is not None and session.get(Experiment, experiment) is None:
                sys.stderr.write(f"error: no experiment {experiment}\n")
                raise typer.Exit(2)
            todo = attempts_with_steps(session, experiment_id=experiment)
            rows = sum(n for _, _, n in todo)
            t0 = time.perf_counter()
            columns = (
                TextColumn("rolling up steps"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
            )
            with Progress(*columns, console=console, disable=rows < PROGRESS_FROM_ROWS) as progress:
                task = progress.add_task("steps", total=rows)
                rebuild_rollups(
                    session,
                    experiment_id=experiment,
                    attempts=todo,
                    progress=lambda n: progress.advance(task, n),
                )
    experiments = len({e for e, _, _ in todo})
    console.print(
        f"rolled up {rows:,} steps of {len(todo)} attempt(s) of {experiments} experiment(s) "
        f"in {time.perf_counter() - t0:.1f} s"
    )


@db_app.command("check")
def check_command() -> None:
    """List the stored experiments and sweeps that do not read back whole, one line each: table, id and what
    failed (invalid JSON, a date or an integer that is not one, a value of the wrong shape, a spec or summary
    that does not validate). The API serves such rows with "corrupt" saying the same.

    Exits 1 when it found any, 0 when every row reads back.
    """
    settings = get_settings()
    found, read = 0, dict.fromkeys(("experiments", "sweeps"), 0)
    with Database(settings.resolved_database_url) as db:
        db.ensure_schema()
        with db.session() as session:
            for table, row_id, corruption in corrupt_rows(session, Experiment, Sweep):
                read[table] += 1
                if corruption is not None:
                    found += 1
                    typer.echo(f"{table} {row_id}: {corruption.reason}")
    counts = f"{read['experiments']} experiment(s) and {read['sweeps']} sweep(s)"
    if found:
        typer.echo(f"{found} corrupt row(s) of {counts}")
        raise typer.Exit(1)
    typer.echo(f"no corrupt row: {counts} read back whole")
