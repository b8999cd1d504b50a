"""The worker's commands: ``ckptlab run`` (one experiment in this process), ``ckptlab
predict`` (will a spec fit on a target? predicted in this process) and ``ckptlab worker``
(claim queued experiments until stopped).

The worker owns its signal policy: the first SIGTERM/SIGINT finishes running experiments
(rq's ``request_stop``), the second requeues them at once (``request_force_stop``).
Exit codes: 0 success, 1 the experiment failed, 2 bad input (one line on stderr).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from ckptlab.domain import Status
from ckptlab.settings import Settings, get_settings
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.summary import RunSummary

__all__ = ["app", "format_validation_error", "load_spec"]

app = typer.Typer(add_completion=False)
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


def load_spec(path: Path, prepare: Callable[[Any], Any] | None = None) -> ExperimentSpec:
    """Read and validate a spec file, ``prepare`` (if given) applied to its JSON first.
    Raises ``typer.Exit(2)`` with one line on any problem."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise _fail(f"spec file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(f"cannot read spec file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise _fail(f"{path} is not valid JSON: {exc}") from None
    try:
        return ExperimentSpec.model_validate(prepare(raw) if prepare and isinstance(raw, dict) else raw)
    except ValidationError as exc:
        raise _fail(format_validation_error(exc)) from None


def _settings() -> Settings:
    s = get_settings()
    s.data_dir.mkdir(parents=True, exist_ok=True)
    return s


def _mib(n: int | None) -> str:
    """Bytes as MiB with two decimals; a dash for a step without a memory reading."""
    return "-" if n is None else f"{n / 2**20:.2f}"


def _timing_line(summary: RunSummary) -> str:
    """``step 3.31 ms median (IQR 0.12, 95% CI 3.01-3.47) over 20 timed steps``."""
    t = summary.timing.get("step_ms")
    if not t:
        return f"step {summary.step_time_ms or 0:.2f} ms"
    where = "timed steps (tracker off)" if summary.timing_pass == "timed" else "memory steps"
    iqr = t.q3 - t.q1
    return f"step {t.median:.2f} ms median (IQR {iqr:.2f}, 95% CI {t.ci_low:.2f}-{t.ci_high:.2f}) over {t.n} {where}"


def _gradient_line(summary: RunSummary) -> str:
    """The gradient check in words: match, mismatch (the worst parameter), or not run."""
    if summary.gradient_verdict and summary.gradient_verdict.startswith("undetermined"):
        return f"gradients: {summary.gradient_verdict} (every reference gradient below 1e-20)"
    if summary.gradients_match is None:
        return "gradients: not compared (strategy none, or verify_gradients off)"
    if summary.gradients_match:
        return f"gradients: match an un-checkpointed step (max |diff| {summary.grad_max_abs_diff or 0:.2e})"
    group = summary.recompute_first_differing_group
    recompute = (
        f"; recomputation differs from the first forward from blocks {group['start']}-{group['end'] - 1} on"
        if group
        else ""
    )
    return (
        f"gradients: DIFFER from an un-checkpointed step in {summary.grad_mismatch_count} parameter(s); worst "
        f"{summary.grad_worst_param} (relative error {summary.grad_worst_rel_error or 0:.2e}){recompute}"
    )


@app.command()
def run(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC.json", help="experiment spec (JSON)")],
    json_out: Annotated[bool, typer.Option("--json", help="print the summary as JSON on the last line")] = False,
) -> None:
    """Run one experiment in this process, store it, and print its steps and summary."""
    spec = load_spec(spec_path)
    from ckptlab.db.database import make_engine, make_sessionmaker, migrate
    from ckptlab.db.store import create_experiment, get_experiment, list_steps
    from ckptlab.worker.progress_bar import RunProgressBar
    from ckptlab.worker.service.devices import default_worker_id
    from ckptlab.worker.service.slots import execute_experiment

    url = _settings().resolved_database_url
    engine = make_engine(url)
    migrate(engine)
    Session = make_sessionmaker(engine)
    with Session() as session:
        exp = create_experiment(session, spec=spec, status=Status.RUNNING, worker_id=default_worker_id())
    with RunProgressBar(Session, exp.id, exp.attempt, exp.spec, Console(stderr=True)):
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
            _mib(s.allocated_bytes),
            _mib(s.peak_allocated_bytes),
        )
    console.print(table)
    sm = exp.run_summary
    result = {"id": exp.id, "status": exp.status, **sm.dump(), "error": exp.error}
    if exp.status == Status.SUCCEEDED:
        console.print(
            f"activation {_mib(sm.activation_bytes)} MiB, peak {_mib(sm.peak_allocated_bytes)} MiB, "
            f"params without grad {sm.params_without_grad}"
        )
        saving = _saving_line(sm)
        if saving:
            console.print(saving, markup=False)
        console.print(_timing_line(sm))
        if sm.plan is not None:
            console.print(_plan_line(sm), markup=False)
        console.print(_gradient_line(sm), markup=False)
        if sm.memory_steps_run is not None and sm.memory_steps_requested is not None:
            if sm.memory_steps_run < sm.memory_steps_requested:
                console.print(
                    f"memory pass: {sm.memory_steps_run} of {sm.memory_steps_requested} steps "
                    "(the last two read the same bytes)"
                )
        if sm.peak_explanation:
            console.print(sm.peak_explanation, markup=False)
        for f in sm.findings:
            console.print(f"[yellow]warning[/yellow] {f.code}: {f.message}", highlight=False)
    else:
        console.print(f"[red]{exp.status}[/red]: {exp.error}")
    if json_out:
        sys.stdout.write(json.dumps(result) + "\n")
    if exp.status != Status.SUCCEEDED:
        raise typer.Exit(1)


def _overhead_words(o: dict | None, *, scale: float = 1.0) -> str | None:
    """``+13% (95% CI +12% to +14%)`` from ``{estimate, low, high}`` in fractions
    (``scale=100``) or ``{estimate_pct, low_pct, high_pct}`` in %; None without one."""
    if not o:
        return None
    estimate, low, high = (o.get(k, o.get(f"{k}_pct")) for k in ("estimate", "low", "high"))
    if estimate is None:
        return None
    ci = f" (95% CI {scale * low:+.1f}% to {scale * high:+.1f}%)" if low is not None and high is not None else ""
    return f"{scale * estimate:+.1f}%{ci}"


def selective_words(plan: dict) -> str:
    """The blocks of an ``auto`` plan checkpointed under a selective policy, in words
    (``" (selective: block 3 save_matmuls)"``), or ``""`` where none is
    (``plan.selective_blocks``, issue 31)."""
    chosen = plan.get("selective_blocks") or {}
    if not chosen:
        return ""
    return (
        " (selective: " + ", ".join(f"block {b} {p}" for b, p in sorted(chosen.items(), key=lambda x: int(x[0]))) + ")"
    )


def _plan_line(sm: RunSummary) -> str:
    """Strategy auto's plan and its time side (issue 31): the blocks it checkpointed (those
    under a selective policy named: :func:`selective_words`), the step-time overhead the
    plan predicted (``plan.predicted_overhead``: fractions of the un-checkpointed step)
    against the one this run measured paired with an un-checkpointed copy in its process
    (``paired_overhead``, %)."""
    plan = sm.plan or {}
    predicted = _overhead_words(plan.get("predicted_overhead"), scale=100.0)
    paired = sm.paired_overhead.model_dump() if sm.paired_overhead is not None else None
    measured = _overhead_words(paired)
    return (
        f"auto plan: blocks {plan.get('checkpointed_blocks')} checkpointed{selective_words(plan)}; step-time overhead "
        f"{f'predicted {predicted}' if predicted else 'not predicted'}, "
        f"{f'measured paired {measured}' if measured else 'not measured paired'}"
    )


def _saving_line(sm: RunSummary) -> str | None:
    """What checkpointing saved: the run's activations (its RNG states left out, as the
    experiment page counts them) against the same forward without checkpointing (the
    gradient check's reference forward, ``reference_activation_bytes``); None without one."""
    ref = sm.reference_activation_bytes
    if not ref or sm.activation_bytes is None:
        return None
    own = sm.activation_bytes - (sm.rng_state_bytes or 0)
    return (
        f"checkpointing saved {_mib(ref - own)} MiB of activations: {_mib(own)} MiB kept instead of "
        f"{_mib(ref)} MiB without it ({100 * (own / ref - 1):+.0f}%, measured on a reference forward)"
    )


def _parse_capacity(capacity: str | None) -> int | None:
    """``--capacity`` as bytes (digits, ``_`` allowed). Raises ``typer.Exit(2)`` with one line
    when it is not a whole number above 0."""
    from ckptlab.prediction.targets import MAX_CAPACITY_BYTES

    if capacity is None:
        return None
    try:
        value = int(capacity.replace("_", ""), 10)
    except ValueError:
        value = 0
    if value <= 0 or value > MAX_CAPACITY_BYTES:
        raise _fail(f"--capacity: expected a whole number of bytes above 0 (at most 2**50), got {capacity!r}")
    return value


def _prediction_lines(sm: RunSummary) -> list[str]:
    """The prediction's figures below its table: peak phase, categories at the peak, the
    auto plan, method and error bound, notes."""
    info = sm.prediction
    lines = []
    if sm.peak_phase:
        lines.append(f"peak in {sm.peak_phase}")
    if sm.memory_at_peak:
        parts = ", ".join(f"{k} {_mib(v)} MiB" for k, v in sorted(sm.memory_at_peak.items(), key=lambda kv: -kv[1]))
        lines.append(f"at the peak: {parts}")
    if sm.plan:
        blocks = sm.plan.get("checkpointed_blocks")
        lines.append(
            f"auto plan: checkpoint blocks {blocks}{selective_words(sm.plan)}, predicted peak "
            f"{_mib(sm.predicted_peak_bytes)} MiB"
            f" under a budget of {_mib(sm.budget_bytes)} MiB"
        )
    if sm.peak_explanation:
        lines.append(sm.peak_explanation)
    if info is not None:
        if info.fixed_bytes is not None:
            lines.append(f"fixed (parameters, gradients, optimizer state): {_mib(info.fixed_bytes)} MiB")
        if info.sdpa_backend:
            lines.append(f"attention: the {info.sdpa_backend} backend of scaled_dot_product_attention")
        lines.append(f"method: {info.method}; error bound: {info.error_bound}")
        lines += [f"note: {n}" for n in info.notes]
    return lines


def _prediction_table(sm: RunSummary, title: str) -> Table:
    """Peak allocated, reserved, device used and capacity (MiB, bytes) and the verdict."""
    info = sm.prediction
    table = Table(title=title)
    table.add_column("")
    table.add_column("MiB", justify="right")
    table.add_column("bytes", justify="right")
    rows = [("peak allocated", sm.peak_allocated_bytes)]
    if info is not None:
        rows += [
            ("reserved (allocator)", info.peak_reserved_bytes),
            ("device used (+ context)", info.device_used_bytes),
            ("capacity", info.capacity_bytes),
        ]
    for name, value in rows:
        table.add_row(name, _mib(value), "-" if value is None else f"{value:,}")
    if info is not None and info.fits is not None:
        verdict = "[green]fits[/green]" if info.fits else "[red]does not fit[/red]"
        margin = info.margin_bytes
        table.add_row(verdict, _mib(margin), "-" if margin is None else f"{margin:,} margin")
    return table


@app.command()
def predict(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC.json", help="experiment spec (JSON)")],
    target: Annotated[
        str | None, typer.Option(metavar="NAME", help="the device: cpu, or a GPU of the targets table")
    ] = None,
    capacity: Annotated[
        str | None, typer.Option(metavar="BYTES", help="the device's memory instead of the target's, bytes")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the prediction as JSON on the last line")] = False,
) -> None:
    """Predict one training step of a spec on a target (will it fit?), store it, print it.

    Runs in this process with fake tensors (no real memory, no GPU needed). Exit codes: 0 the
    prediction succeeded (whether or not the run fits), 1 it failed, 2 bad input.
    """
    from ckptlab.prediction.budget import with_default_budget
    from ckptlab.prediction.targets import get_target, target_names

    if target is None:
        raise _fail(f"--target: missing; expected one of {', '.join(target_names())}")
    try:
        chosen = get_target(target)
    except ValueError as exc:
        raise _fail(f"--target: {exc}") from None
    capacity_bytes = _parse_capacity(capacity)
    spec = load_spec(spec_path, lambda raw: with_default_budget(raw, chosen, capacity_bytes))
    from ckptlab.worker.predict_api import predict_and_store

    result = predict_and_store(
        spec, chosen, capacity_bytes=capacity_bytes, database_url=_settings().resolved_database_url
    )
    title = f"prediction {result.id}: {spec.model.kind} {spec.checkpoint.strategy} on {chosen.name} ({chosen.label})"
    if result.status == Status.SUCCEEDED:
        console.print(_prediction_table(result, title))
        for line in _prediction_lines(result):
            console.print(line, markup=False, highlight=False)
    else:
        console.print(f"{title}\n[red]{result.status}[/red]: ", end="")
        console.print(result.error, markup=False, highlight=False)
    if json_out:
        sys.stdout.write(json.dumps(result.model_dump(mode="json", exclude={"database_url"})) + "\n")
    if result.status != Status.SUCCEEDED:
        raise typer.Exit(1)


@app.command()
def worker(
    once: Annotated[bool, typer.Option(help="exit when the queue is empty")] = False,
    devices: Annotated[
        str | None,
        typer.Option(help="comma-separated devices, one experiment at a time each: cpu, cuda:0,cuda:1 ..."),
    ] = None,
    cpu_slots: Annotated[
        int | None, typer.Option(min=1, help="concurrent experiments on cpu (default: cpu_count // 4, at least 1)")
    ] = None,
    cpu_threads: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="torch threads per cpu experiment (default: CKPTLAB_WORKER_CPU_THREADS, else cpu_count // cpu_slots)",
        ),
    ] = None,
) -> None:
    """Claim queued experiments and run them until SIGTERM / Ctrl-C.

    The first SIGTERM or SIGINT stops claiming and gives running experiments
    CKPTLAB_SHUTDOWN_GRACE_S to finish before they are killed and requeued; a second one
    requeues them at once. Devices default to every visible CUDA device, else cpu; cpu
    gets one slot per 4 cores, and each cpu experiment its share of the cores as torch threads.
    """
    from ckptlab.worker.service.devices import default_cpu_slots, slot_devices
    from ckptlab.worker.service.slots import run_worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    s = _settings()
    device_list = [d for d in devices.split(",") if d.strip()] if devices is not None else None
    cpu_slots = default_cpu_slots() if cpu_slots is None else cpu_slots
    try:
        slot_devices(device_list, cpu_slots=cpu_slots)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    stop, kill = threading.Event(), threading.Event()
    log = logging.getLogger("ckptlab.worker")

    def request_stop(signum: int) -> None:
        """First signal: claim nothing more; running experiments get the grace period."""
        log.warning(
            "%s: claiming nothing more; running experiments get %g s to finish",
            signal.Signals(signum).name,
            s.shutdown_grace_s,
        )
        stop.set()

    def request_force_stop(signum: int) -> None:
        """Second signal: kill and requeue running experiments now (after rq)."""
        log.warning("second signal (%s): requeueing running experiments now", signal.Signals(signum).name)
        kill.set()

    def on_signal(signum: int, _frame: object) -> None:
        (request_force_stop if stop.is_set() else request_stop)(signum)

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
        cpu_threads=cpu_threads,
        settings=s,
    )
