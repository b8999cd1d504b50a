"""``python -m ckptlab.worker.distributed.rank RANK WORLD INIT_METHOD THREADS PARENT FD``: one
rank of a sharded run (:func:`ckptlab.worker.distributed.launch.run_distributed` starts
them). The spec (JSON) is read from stdin; the rank joins the gloo group at ``INIT_METHOD``,
runs the engine on its wrapped model (:class:`ckptlab.worker.distributed.shard.Rank`),
checks the gradients against one process (:mod:`ckptlab.worker.distributed.gradcheck`) and
writes JSON lines on file descriptor ``FD``: ``["step", record]`` (rank 0's steps),
then ``["summary", summary]`` or ``["error", [sentence, oom_details_or_null, warnings]]``.
It dies with process ``PARENT`` (Linux ``PR_SET_PDEATHSIG``)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import traceback
from typing import Any, TextIO

__all__ = ["main"]


def _die_with(parent: int) -> None:
    """Linux: this process gets SIGKILL when the one that started it dies; exit at once when
    it is already gone."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(70)


def _send(out: TextIO, kind: str, body: Any) -> None:
    out.write(json.dumps([kind, body]) + "\n")
    out.flush()


def main(argv: list[str]) -> int:
    """Run the rank; returns its exit status (0 when it sent a summary or an error)."""
    rank, world, init_method, threads, parent, fd = argv
    rank, world, threads, parent, fd = int(rank), int(world), int(threads), int(parent), int(fd)
    _die_with(parent)
    out = os.fdopen(fd, "w")
    import torch
    import torch.distributed as dist

    from ckptlab.spec.experiment import ExperimentSpec
    from ckptlab.worker.distributed.gradcheck import check_sharded_gradients
    from ckptlab.worker.distributed.shard import Rank
    from ckptlab.worker.engine.run import run_experiment
    from ckptlab.worker.errors import RunError, RunOutOfMemory

    torch.set_num_threads(threads)
    spec = ExperimentSpec.model_validate_json(sys.stdin.read())
    me = Rank(rank=rank, world_size=world, spec=spec.distributed, device=torch.device("cpu"))
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        on_step = (lambda record: _send(out, "step", record)) if rank == 0 else None
        summary = run_experiment(spec, on_step=on_step, device="cpu", rank=me)
        me.close()
        if spec.verify_gradients:
            summary.sharded_gradients = check_sharded_gradients(spec, me)
        _send(out, "summary", summary.dump())
    except RunError as exc:
        details = exc.details if isinstance(exc, RunOutOfMemory) else None
        _send(out, "error", [me.explain(exc, spec.checkpoint.use_reentrant) or str(exc), details, exc.warnings])
    except Exception as exc:  # noqa: BLE001 - the rank's failure is the run's outcome
        traceback.print_exc()  # the whole of it to the run's log (stderr)
        text = me.explain(exc, spec.checkpoint.use_reentrant) or traceback.format_exception_only(exc)[-1].strip()
        _send(out, "error", [text, None, []])
    finally:
        me.close()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
