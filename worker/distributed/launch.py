"""A sharded run (``spec.distributed``: DDP or FSDP2 over ``world_size`` ranks): one process
per rank, each measured by its own live-tensor tracker, the run's figures the worst rank's.

On CPU the ranks are processes of this machine (``python -m ckptlab.worker.distributed.rank``:
a run's own process is a daemon, which ``multiprocessing`` may not give children) joined by
gloo over a rendezvous file: ``init_device_mesh("cpu", ...)`` (pytorch/pytorch#132471), so a
4-rank run works on a 2-core host, oversubscribed (each rank gets ``cpu_count // world_size``
threads, at least one) and slower. Rank 0 streams its steps; each rank sends its summary
when done. A rank that fails ends the run with its error ("rank k: ..."); one that exits
without answering (killed, crashed) ends it with "rank k exited (signal 9)"
(:class:`ckptlab.worker.errors.RankLost`: the worker requeues such a run like a lost
worker's while attempts are left); either way every other rank is stopped. Each rank dies
with the process that started it (Linux ``PR_SET_PDEATHSIG``), so a killed run leaves no
rank behind.

Example usage::

    from ckptlab.spec.experiment import ExperimentSpec
    from ckptlab.worker.distributed import run_distributed

    spec = ExperimentSpec.model_validate({
        "model": {"kind": "mlp", "depth": 4, "width": 256}, "batch_size": 8, "device": "cpu",
        "checkpoint": {"strategy": "per_block"},
        "distributed": {"kind": "fsdp2", "world_size": 2},
    })
    summary = run_distributed(spec)
    print([r.peak_allocated_bytes for r in summary.ranks], summary.sharded_gradients.match)

Known limitations:
    - CPU ranks only (gloo); a spec with device ``cuda`` fails saying so.
    - Timed steps are not paired with an un-checkpointed copy (it would need collectives
      of its own): the timing is the rank's step times, unpaired.
    - Strategy ``auto`` plans on rank 0 as for one process (parameters, gradients and
      optimizer state counted whole, not sharded): its plan is safe but may checkpoint more
      than a sharded run needs.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.summary import RankFigures, RunSummary
from ckptlab.worker.engine.training import resolve_device
from ckptlab.worker.errors import RankLost, RunError, RunOutOfMemory

__all__ = ["run_distributed", "combine", "RANK_MODULE"]

#: Summary fields that are one rank's memory: the run reports the worst rank's.
_RANK_FIELDS = tuple(f for f in RankFigures.model_fields if f != "rank")
_MEMORY_FIELDS = (*_RANK_FIELDS, "activation_bytes_at_peak", "recompute_peak_bytes", "peak_explanation")
#: Seconds between looks at the ranks while none has a message.
_POLL_S = 0.2


def run_distributed(
    spec: ExperimentSpec,
    *,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    device: str | None = None,
) -> RunSummary:
    """Run a sharded ``spec`` on ``spec.distributed.world_size`` ranks; returns the summary.

    Args:
        spec: a validated spec whose ``distributed.kind`` is ``ddp`` or ``fsdp2``.
        on_step: called with each of rank 0's step records as it ends.
        device: overrides ``spec.device``.

    Returns:
        Rank 0's summary with the worst rank's memory figures (``worst_rank``: the rank with
        the highest peak), ``ranks`` (every rank's peak, phase, activations and categories),
        ``world_size``, ``global_batch_size`` and, with ``verify_gradients``,
        ``sharded_gradients`` (:mod:`ckptlab.worker.distributed.gradcheck`).

    Raises:
        RunOutOfMemory: a rank ran out of memory ("rank k: ...").
        RankLost: a rank exited on a signal without a summary.
        RunError: a rank failed or exited without answering; CUDA was asked for.
    """
    world = spec.distributed.world_size
    if resolve_device(device or spec.device).type != "cpu":
        raise RunError("sharded runs run on CPU ranks (gloo) for now; use device 'cpu'")
    folder = tempfile.mkdtemp(prefix="ckptlab-ranks-")
    threads = max(1, (os.cpu_count() or 1) // world)
    payload = json.dumps(spec.model_dump(mode="json")).encode()
    ranks: list[subprocess.Popen] = []
    pipes: list[int] = []
    try:
        for r in range(world):
            read_end, write_end = os.pipe()
            pipes.append(read_end)
            argv = [sys.executable, "-m", RANK_MODULE, str(r), str(world), f"file://{folder}/rendezvous"]
            argv += [str(threads), str(os.getpid()), str(write_end)]
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, pass_fds=(write_end,))
            os.close(write_end)
            proc.stdin.write(payload)
            proc.stdin.close()
            ranks.append(proc)
        summaries = _collect(ranks, pipes, on_step)
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
        for proc in ranks:
            proc.wait()
        for fd in pipes:
            os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
    return combine(summaries, spec)


#: The module each rank runs (``python -m``).
RANK_MODULE = "ckptlab.worker.distributed.rank"


def _collect(ranks: list[subprocess.Popen], pipes: list[int], on_step) -> dict[int, RunSummary]:
    """Every rank's summary, streaming rank 0's steps; raises the first failure. Each rank
    writes JSON lines ``[kind, body]`` on its own pipe (see :mod:`ckptlab.worker.distributed.rank`)."""
    done: dict[int, RunSummary] = {}
    buffers = {fd: b"" for fd in pipes}
    with selectors.DefaultSelector() as sel:
        for r, fd in enumerate(pipes):
            sel.register(fd, selectors.EVENT_READ, r)
        while len(done) < len(ranks):
            for key, _ in sel.select(timeout=_POLL_S):
                r, fd = key.data, key.fd
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    sel.unregister(fd)
                    continue
                *lines, buffers[fd] = (buffers[fd] + chunk).split(b"\n")
                for line in lines:
                    _handle(r, json.loads(line), done, on_step, ranks)
            _raise_dead(ranks, done)
            for r, proc in enumerate(ranks):
                if r not in done and proc.poll() is not None and pipes[r] not in sel.get_map():
                    cls = RankLost if -proc.returncode in _LOST_SIGNALS else RunError
                    raise cls(f"rank {r} exited ({_exit_text(proc.returncode)}) without a summary")
    return done


def _handle(rank: int, message: list, done: dict[int, RunSummary], on_step, ranks: list[subprocess.Popen]) -> None:
    kind, body = message
    if kind == "step":
        if on_step is not None:
            on_step(body)
    elif kind == "summary":
        done[rank] = RunSummary.model_validate(body)
    else:
        _raise_dead(ranks, done, wait_s=_DEAD_PEER_WAIT_S)  # a peer's death is the cause, its error the effect
        text, details, warnings = body
        cls = RunOutOfMemory if details is not None else RunError
        raise cls(f"rank {rank}: {text}", warnings=warnings, details=details)


#: How long a rank's error waits for a peer's exit status: when a rank is killed, the others
#: fail in their next collective ("connection closed") at about the time it is reaped.
_DEAD_PEER_WAIT_S = 2.0


def _raise_dead(ranks: list[subprocess.Popen], done: dict[int, RunSummary], wait_s: float = 0.0) -> None:
    """Raise for a rank that a signal ended without a summary, waiting up to ``wait_s`` for
    one; return when there is none. Of several, one ended from outside (:data:`_LOST_SIGNALS`)
    is named before one that crashed: a killed rank's peers abort in their next collective
    (gloo: SIGABRT), the kill the cause and the aborts its effect (rank 0's abort was once
    reported for rank 1's ``kill -9``); then the lowest rank."""
    deadline = time.monotonic() + wait_s
    while True:
        dead = [
            (-proc.returncode not in _LOST_SIGNALS, r, proc.returncode)
            for r, proc in enumerate(ranks)
            if r not in done and proc.poll() is not None and proc.returncode < 0
        ]
        if dead:
            crashed, r, code = min(dead)
            cls = RunError if crashed else RankLost
            raise cls(f"rank {r} exited ({_exit_text(code)}) without a summary")
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)


#: Signals that end a rank from outside (``kill -9``, the kernel's OOM killer, a host
#: shutting down): the run is lost, not failed (:class:`ckptlab.worker.errors.RankLost`). A
#: crash of the rank's own (SIGSEGV, SIGABRT) fails the run.
_LOST_SIGNALS = (signal.SIGKILL, signal.SIGTERM)


def _exit_text(code: int) -> str:
    """``exit code 1``, or ``signal 9`` for a process a signal ended."""
    return f"signal {-code}" if code < 0 else f"exit code {code}"


def combine(summaries: dict[int, RunSummary], spec: ExperimentSpec) -> RunSummary:
    """The run's summary from its ranks' (see :func:`run_distributed`'s Returns)."""
    worst = max(summaries, key=lambda r: (summaries[r].peak_allocated_bytes or 0, -r))
    figures = [RankFigures.of(r, s) for r, s in sorted(summaries.items())]
    out = summaries[0].model_copy(deep=True)
    for field in _MEMORY_FIELDS:
        setattr(out, field, getattr(summaries[worst], field))
    if out.host_load is not None:  # a rank's CPU share counts its waits in collectives: loads only
        out.host_load = out.host_load.model_copy(update={"cpu_share": None})
    out.world_size = spec.distributed.world_size
    out.global_batch_size = spec.batch_size * spec.distributed.world_size
    out.worst_rank = worst
    out.ranks = figures
    return out
