"""The prediction process: ``python -m ckptlab.worker.predict`` run for one request, under
a time limit and a memory cap, without blocking the event loop.

The backend never imports torch: the worker's predictor runs in a child interpreter that
reads the request as JSON on stdin and writes one JSON line per target on stdout (its
``target``, its ``status``, succeeded with a ``summary`` and its memory ``timelines`` or
failed with an ``error``; exit 2 with one stderr line for a malformed request). :func:`run_child` talks to
it with asyncio's subprocess streams (no thread waits on it); :func:`outcomes` turns what it
said, or did not say, into one :class:`Outcome` per target.

**The memory cap** is ``RLIMIT_DATA`` (heap and private writable mappings; see
:mod:`ckptlab.worker.measure.hostmem` for why not ``RLIMIT_AS``: torch reserves far more
address space than it uses), set by a short bootstrap in the child before it imports the
predictor: ``preexec_fn`` would run Python between ``fork`` and ``exec`` in a server with
threads, which the standard library warns can deadlock. The child starts a session of its
own, so the time limit kills its whole process group, and on Linux it is killed when the
server dies (``PR_SET_PDEATHSIG``): a server killed hard leaves no prediction running.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ckptlab.analysis.timeline import TimelineFormatError
from ckptlab.analysis.timeline_rows import row_from_json
from ckptlab.backend.encoding import utf8_safe
from ckptlab.domain import Status
from ckptlab.summary import RunSummary

__all__ = ["CHILD_MODULE", "MAX_ANSWER_BYTES", "ChildRun", "Outcome", "child_argv", "run_child", "outcomes"]

#: The predictor's entry point (``python -m``); tests point it at a fake.
CHILD_MODULE = "ckptlab.worker.predict"
#: Longest line the child may write (one target's summary), bytes.
MAX_ANSWER_BYTES = 16 * 2**20
#: Bytes of the child's stderr kept (its end): where a crash says why.
STDERR_TAIL_BYTES = 16 * 1024
#: Longest error text stored, characters.
MAX_ERROR_CHARS = 2000

# Runs in the child before anything else: end with the server (Linux's PR_SET_PDEATHSIG, so
# a server killed hard leaves no prediction running past its time limit; already gone: exit),
# cap the data size (never above an administrator's hard limit), then run the module as
# ``python -m`` would.
_BOOTSTRAP = (
    "import ctypes, os, resource, runpy, signal, sys\n"
    "cap, parent, module = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != parent:\n"
    "    sys.exit(70)\n"
    "soft, hard = resource.getrlimit(resource.RLIMIT_DATA)\n"
    "resource.setrlimit(resource.RLIMIT_DATA, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))\n"
    "sys.argv = [module]\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)
_OUT_OF_MEMORY = ("MemoryError", "can't allocate memory", "not enough memory", "cannot allocate memory", "bad_alloc")


def child_argv(memory_bytes: int, module: str | None = None) -> list[str]:
    """The command line of a prediction process: this interpreter, the bootstrap that ties
    it to this process and caps its data size at ``memory_bytes`` (bytes), then ``module``
    (default :data:`CHILD_MODULE`)."""
    return [sys.executable, "-c", _BOOTSTRAP, str(int(memory_bytes)), str(os.getpid()), module or CHILD_MODULE]


@dataclass(frozen=True)
class ChildRun:
    """What one prediction process did.

    Attributes:
        lines: each stdout line with the seconds since the start at which it arrived.
        returncode: its exit status (negative: the signal that ended it); None if unknown.
        stderr: the end of its stderr (:data:`STDERR_TAIL_BYTES`), decoded.
        timed_out: it was killed at the time limit.
        overflow: it wrote a line over :data:`MAX_ANSWER_BYTES` (and was killed).
        elapsed_s: seconds from its start to its end.
    """

    lines: list[tuple[float, bytes]]
    returncode: int | None
    stderr: str
    timed_out: bool
    overflow: bool
    elapsed_s: float


@dataclass(frozen=True)
class Outcome:
    """How one target's prediction ended: ``status`` succeeded (with ``summary`` and the
    memory ``timelines`` its fake memory pass kept, as rows of ``prediction_timelines`` but
    the key: :func:`ckptlab.analysis.timeline_rows.row_from_json`), failed or timed_out (with
    one sentence in ``error``); ``elapsed_s`` its share of the process's seconds (from the
    previous answer, or the start, to its own)."""

    target: str
    status: Status
    summary: RunSummary | None
    error: str | None
    elapsed_s: float
    timelines: tuple[dict[str, Any], ...] = ()


async def _tail(stream: asyncio.StreamReader) -> bytes:
    """Read ``stream`` to its end, keeping its last :data:`STDERR_TAIL_BYTES`."""
    kept = b""
    while chunk := await stream.read(65536):
        kept = (kept + chunk)[-STDERR_TAIL_BYTES:]
    return kept


async def _talk(proc: asyncio.subprocess.Process, data: bytes, lines: list[tuple[float, bytes]], start: float) -> None:
    """Send the request, then gather stdout lines until the child closes it and exits."""
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(data)
        await proc.stdin.drain()
        proc.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # it exited without reading: its exit status and stderr say why
    while line := await proc.stdout.readline():
        lines.append((time.monotonic() - start, line))
    await proc.wait()


def _kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the child's process group (its own session), or the child alone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass


async def run_child(
    request: Mapping[str, Any], *, timeout_s: float, memory_bytes: int, module: str | None = None
) -> ChildRun:
    """Run a prediction process for ``request`` (sent as JSON on its stdin) and gather its
    answers; never raises for what the child does (a crash, a hang, garbage on stdout).

    Args:
        request: ``{"spec", "target" | "targets", "capacity_bytes"}``.
        timeout_s: seconds before the process (group) is killed.
        memory_bytes: its ``RLIMIT_DATA``, bytes.
        module: the module to run (default :data:`CHILD_MODULE`).

    Returns:
        A :class:`ChildRun`; the lines written before a kill are kept. When no process
        could be started, ``returncode`` is None and ``stderr`` says why.
    """
    data = json.dumps(request).encode()
    try:
        proc = await asyncio.create_subprocess_exec(
            *child_argv(memory_bytes, module),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            limit=MAX_ANSWER_BYTES,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    except OSError as exc:  # no interpreter, no process left (EAGAIN), no memory to fork
        return ChildRun([], None, f"{type(exc).__name__}: {exc}", False, False, 0.0)
    assert proc.stderr is not None
    start = time.monotonic()
    lines: list[tuple[float, bytes]] = []
    stderr = asyncio.create_task(_tail(proc.stderr))
    timed_out = overflow = False
    try:
        await asyncio.wait_for(_talk(proc, data, lines, start), timeout_s)
    except TimeoutError:
        timed_out = True
    except ValueError:  # a line over the stream's limit (asyncio.LimitOverrunError's wrapper)
        overflow = True
    finally:
        if proc.returncode is None:  # also when the request was cancelled: no orphan
            _kill(proc)
        await asyncio.shield(proc.wait())
    elapsed = time.monotonic() - start
    tail = (await stderr).decode(errors="replace")
    return ChildRun(lines, proc.returncode, tail, timed_out, overflow, elapsed)


def _text(value: Any) -> str | None:
    """A child's error as storable text: stripped, NULs dropped, unencodable characters
    escaped, at most :data:`MAX_ERROR_CHARS`; None when it is not a non-empty string."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = utf8_safe(value.replace("\x00", "").strip())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _answers(run: ChildRun, targets: Sequence[str]) -> dict[str, tuple[float, dict[str, Any]]]:
    """The first answer for each of ``targets`` among the child's lines, with its arrival
    time; other lines (a library's print, another target) are ignored."""
    found: dict[str, tuple[float, dict[str, Any]]] = {}
    for at, line in run.lines:
        try:
            answer = json.loads(line)
        except ValueError:  # not JSON, or not UTF-8
            continue
        if isinstance(answer, dict) and answer.get("target") in targets and answer["target"] not in found:
            found[answer["target"]] = (at, answer)
    return found


def _timelines(answer: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The memory timelines a succeeded answer carries, checked; none when any is malformed
    or two name one step (the prediction stands without them: its timeline reads as absent)."""
    raw = answer.get("timelines")
    try:
        rows = tuple(row_from_json(r) for r in raw) if isinstance(raw, list) else ()
    except TimelineFormatError:
        return ()
    return rows if len({r["step"] for r in rows}) == len(rows) else ()


def _answered(answer: dict[str, Any]) -> tuple[Status, RunSummary | None, str | None]:
    """The status, summary and error one answer line states."""
    said = answer.get("status")
    if said == Status.SUCCEEDED:
        raw = answer.get("summary")
        if not isinstance(raw, dict):
            return Status.FAILED, None, "the prediction process answered succeeded without a summary"
        try:
            return Status.SUCCEEDED, RunSummary.model_validate(raw), None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return Status.FAILED, None, _text(f"the predicted summary does not validate: {where}: {first['msg']}")
    if said == Status.FAILED:
        return Status.FAILED, None, _text(answer.get("error")) or "the prediction failed without saying why"
    return Status.FAILED, None, _text(f"the prediction process answered an unknown status {said!r}")


def _unanswered(run: ChildRun, timeout_s: float, memory_bytes: int) -> tuple[Status, str]:
    """The status and sentence of a target the process never answered for."""
    if run.timed_out:
        return Status.TIMED_OUT, f"timed out after {timeout_s:g} s"
    if run.overflow:
        return Status.FAILED, f"the prediction process wrote an answer over {MAX_ANSWER_BYTES} bytes"
    last = next((ln.strip() for ln in reversed(run.stderr.splitlines()) if ln.strip()), "")
    code = run.returncode
    if code is None:
        how = "could not be started"
    else:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    error = f"the prediction process {how} before answering" + (f": {last}" if last else "")
    if any(word in run.stderr for word in _OUT_OF_MEMORY):
        error += f" (it reached its memory cap, CKPTLAB_PREDICTION_MEMORY_BYTES = {memory_bytes} bytes)"
    return Status.FAILED, _text(error) or error


def outcomes(run: ChildRun, targets: Sequence[str], *, timeout_s: float, memory_bytes: int) -> list[Outcome]:
    """One :class:`Outcome` per target, in ``targets``' order, from what the process said.

    A target without an answer is ``timed_out`` ("timed out after N s") when the time limit
    killed the process, else ``failed`` with the process's exit status and the last line of
    its stderr (exit 2: the request was malformed; a memory error names the cap).

    Args:
        run: the process's :class:`ChildRun`.
        targets: the targets asked for.
        timeout_s: the time limit it ran under, seconds (for the sentence).
        memory_bytes: its memory cap, bytes (for the sentence).
    """
    found = _answers(run, targets)
    results: dict[str, Outcome] = {}
    previous = 0.0
    for target, (at, answer) in sorted(found.items(), key=lambda item: item[1][0]):
        status, summary, error = _answered(answer)
        kept = _timelines(answer) if status == Status.SUCCEEDED else ()
        results[target] = Outcome(target, status, summary, error, round(at - previous, 3), kept)
        previous = at
    rest = round(max(run.elapsed_s - previous, 0.0), 3)
    for target in targets:
        if target not in results:
            status, error = _unanswered(run, timeout_s, memory_bytes)
            results[target] = Outcome(target, status, None, error, rest)
    return [results[t] for t in targets]
