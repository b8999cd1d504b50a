"""Settings for every ckptlab process, read from ``CKPTLAB_*`` environment variables."""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from ckptlab.domain import NOISE_THRESHOLD_PCT

__all__ = [
    "Settings",
    "get_settings",
    "host_memory_bytes",
    "host_has_nvidia_gpu",
    "default_worker_memory_bytes",
    "WORKER_MEMORY_SHARE",
]

#: The share of the host's RAM one experiment may use by default: the rest is left to the
#: worker, the other slots' children, the database and the backend, so a run that climbs
#: slowly ends ``oom`` at its cap before the host runs short.
WORKER_MEMORY_SHARE = 0.75


def host_memory_bytes() -> int:
    """This host's RAM, bytes (``SC_PAGE_SIZE * SC_PHYS_PAGES``); 2**40 where unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**40


def host_has_nvidia_gpu() -> bool:
    """Whether this host has an NVIDIA GPU its driver lists (``/proc/driver/nvidia/gpus``: no
    torch, no NVML needed)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def default_worker_memory_bytes() -> int:
    """``worker_memory_bytes``'s default: :data:`WORKER_MEMORY_SHARE` of
    :func:`host_memory_bytes`, bytes."""
    return int(host_memory_bytes() * WORKER_MEMORY_SHARE)


class Settings(BaseSettings):
    """One settings class for the backend, the worker and the CLI.

    Args:
        database_url: SQLAlchemy URL (``CKPTLAB_DATABASE_URL``). Default: a SQLite file
            ``ckptlab.db`` under ``data_dir``. PostgreSQL:
            ``postgresql+psycopg://user:pass@host/db``.
        data_dir: folder for the SQLite file and artifacts (default ``./data``).
        host: address the backend binds (default ``127.0.0.1``: local only).
        port: backend port (default 8000).
        poll_interval_s: how long an idle worker sleeps between claims, seconds (default 0.5).
        default_timeout_s: kill an experiment whose spec sets no ``timeout_s`` after this many
            seconds and record it ``timed_out`` (``CKPTLAB_DEFAULT_TIMEOUT_S``, default 3600).
        lease_s: a running experiment whose worker has not committed a heartbeat for this
            many seconds is requeued by the reaper (an in-process ``ckptlab.profile`` run is
            failed instead; ``CKPTLAB_LEASE_S``, default 60). Workers
            heartbeat every ``lease_s / 3`` seconds and retry a failed heartbeat until shortly
            before the lease runs out, so a database stall (a lock, a restart) shorter than
            ``lease_s - lease_s / 3`` loses no work; keep it well above the SQLite busy
            timeout (5 s, :mod:`ckptlab.db.database`).
        max_attempts: a lost experiment already claimed this many times is marked ``failed``
            with error "worker lost" instead of being requeued (``CKPTLAB_MAX_ATTEMPTS``,
            default 3).
        worker_cpu_threads: torch threads per CPU slot of a worker
            (``CKPTLAB_WORKER_CPU_THREADS``; ``ckptlab worker --cpu-threads``). Default: the
            host's cores split between the CPU slots, ``max(1, cpu_count // cpu_slots)``.
        timing_cpu_threads: torch threads of a CPU run's timing pass
            (``CKPTLAB_TIMING_CPU_THREADS``; 0: the run's own). Default 1, as
            ``torch.utils.benchmark.Timer``'s ``num_threads``: OpenMP threads that wait at a
            barrier for a sibling the scheduler preempted make multi-threaded step times a
            lottery on a busy host; with two threads per run, paired timing found a +36%
            recomputation overhead in 1 run of 3, with one in 10 of 10 (issue 19,
            docs/benchmarks.md). The memory pass keeps the run's threads (bytes do not
            depend on them).
        record_timeline: record the memory timeline of a CPU run's first and peak steps
            (``CKPTLAB_RECORD_TIMELINE``, default on; issue 34): every allocation and free
            the live-tensor tracker counts, stored per run. Off: no timeline, and the
            memory pass runs without its hooks.
        shutdown_grace_s: on SIGTERM / SIGINT a worker lets its running experiments finish for
            this many seconds, then kills and requeues them (``CKPTLAB_SHUTDOWN_GRACE_S``,
            default 30).
        api_token: when set (``CKPTLAB_API_TOKEN``), every write request to the API (POST,
            PUT, PATCH, DELETE) needs ``Authorization: Bearer <token>``; reads stay open.
            Default: unset (no token needed; keep ``host`` at 127.0.0.1 then).
        cors_origins: origins (``scheme://host[:port]``) allowed to call the API from a
            browser besides the server's own (``CKPTLAB_CORS_ORIGINS``, comma-separated or a
            JSON list): CORS is on for them and their writes pass the same-origin check
            (:class:`ckptlab.backend.middleware.WriteGuard`). Default: none, CORS off.
        allowed_hosts: ``Host`` header values (without port) the API answers
            (``CKPTLAB_ALLOWED_HOSTS``, comma-separated or a JSON list; ``*.example.com``
            matches subdomains; ``*`` turns the check off). Others get 400, which stops DNS
            rebinding (Starlette's ``TrustedHostMiddleware``). Default: :attr:`host`,
            ``localhost``, ``127.0.0.1`` and ``[::1]``; add the names people browse to when
            the server is reached from other machines.
        worker_memory_bytes: host memory one experiment (one rank of a sharded run) may
            use, bytes (``CKPTLAB_WORKER_MEMORY_BYTES``; default: 75% of this host's RAM,
            :data:`WORKER_MEMORY_SHARE`, leaving the rest to the worker, the database and
            the backend). A worker runs each child under a data-size cap a little above it
            (or above a CPU spec's ``memory_limit_bytes`` when lower; see
            :mod:`ckptlab.worker.measure.hostmem`), so exhaustion is recorded ``oom``; the
            API rejects specs whose parameters, gradients and optimizer state alone exceed
            it, and those whose peak's lower bound from the shapes (activations included,
            :func:`ckptlab.spec.limits.estimate_peak_floor`) does (set it on the backend to
            the workers' figure).
        auto_runs_on_cpu: a spec with device ``auto`` runs on a worker's CPU, so its
            activations are host memory and count against ``worker_memory_bytes`` at submit
            (``CKPTLAB_AUTO_RUNS_ON_CPU``; default: true unless this host has an NVIDIA GPU,
            :func:`host_has_nvidia_gpu`; set false on a backend whose workers have GPUs, where
            ``auto`` runs on the device). ``cpu`` specs and sharded runs (CPU ranks) are always
            counted; ``cuda`` specs never.
        protect_reads: with ``api_token`` set, the reads that compute (a comparison, a
            sweep's results, charts and recommendation, a plan, the experiments export) need
            the token too (``CKPTLAB_PROTECT_READS``, default false: reads are open, and each
            of those is cheap now, its statistics stored or remembered; issue 33).
        check_model_entry_points: the API answers 422 for a ``custom`` model whose name is
            not an installed ``ckptlab.models`` entry point of its own environment
            (``CKPTLAB_CHECK_MODEL_ENTRY_POINTS``, default true; read from package metadata,
            nothing imported), and for a ``torchvision`` model when torchvision does not
            import in its environment (checked once in a child interpreter). Turn it off
            when the API runs without the workers' model packages.
        allowed_model_targets: ``python`` model targets (``package.module:factory``, exact
            names) this API accepts and this worker imports (``CKPTLAB_ALLOWED_MODEL_TARGETS``,
            comma-separated or a JSON list). Default: none.
        max_steps: most ``steps`` a submitted spec may ask for (default 100000).
        max_batch_size: most ``batch_size`` a submitted spec may ask for (default 65536).
        max_param_count: most model parameters a submitted spec may build, estimated from
            the spec (:func:`ckptlab.spec.limits.estimate_param_count`; default 1e9).
        max_world_size: most ranks a submitted sharded run (``distributed.world_size``) may
            start: each rank is a process of the worker's host with its own interpreter and
            torch (~0.3 GiB), on CPU ranks for now (default 8). Predictions do not count it.
        max_request_bytes: larger request bodies get 413 (default 1 MiB).
        max_sweep_size: most experiments one sweep may queue, baselines included (default 256).
        sse_poll_interval_s: how often a live stream polls the database, seconds (default 0.15).
        noise_threshold_pct: the least step-time overhead estimate, in %, reported as a
            difference (``CKPTLAB_NOISE_THRESHOLD_PCT``; default
            :data:`ckptlab.domain.NOISE_THRESHOLD_PCT`): run-to-run noise of the same work on
            the workers' hosts, as ``bench/bench_noise.py`` measures it; lower it on a quiet
            host to resolve smaller differences.
        max_streams: most live streams one API server keeps open; more get 503 with
            ``Retry-After`` (default 200; a stream holds no database connection between polls).
            Measured on a 2-core host (``bench/bench_streams.py``, docs/benchmarks.md): 400
            live streams keep ``/api/health`` at 66 ms p90, while 40 streams replaying a
            20,000-step backlog at once reach 643 ms p90: 200 keeps a reconnect storm
            under 1 s.
        series_max_points: largest ``max_points`` a series request may ask for (default 20000).
        series_cache_bytes: memory the API may keep for per-step series, bytes (default 256 MiB).
        series_warm_interval_s: how often the API brings the cached series of running
            experiments up to date, seconds (default 2; 0 turns it off).
        prediction_timeout_s: ``POST /api/predictions`` (and ``/batch``) kills its prediction
            process after this many seconds and records what it had not answered
            ``timed_out`` (``CKPTLAB_PREDICTION_TIMEOUT_S``, default 120): the longest a
            prediction request waits, whatever its number of targets.
        prediction_memory_bytes: the data size (``RLIMIT_DATA``: heap and private writable
            mappings, interpreter and torch included) a prediction process may reach, bytes
            (``CKPTLAB_PREDICTION_MEMORY_BYTES``, default 8 GiB). Past it an allocation fails
            in that process, which records the prediction ``failed``, instead of the kernel's
            OOM killer picking a process. A prediction holds fake tensors (no storage): it
            needs about what ``import torch`` takes (0.3 GiB with the CPU build, 1.3-1.9 GiB
            with the CUDA build) plus the model's Python objects.
        prediction_slots: prediction processes one API server runs at once; more requests get
            503 with ``Retry-After`` (``CKPTLAB_PREDICTION_SLOTS``, default 2: each process
            imports torch, seconds of CPU, and may reach ``prediction_memory_bytes``).
    """

    model_config = SettingsConfigDict(env_prefix="CKPTLAB_", extra="ignore")

    database_url: str | None = None
    data_dir: Path = Path("data")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    poll_interval_s: float = Field(0.5, gt=0)
    default_timeout_s: float = Field(3600.0, gt=0)
    lease_s: float = Field(60.0, gt=0)
    max_attempts: int = Field(3, ge=1)
    shutdown_grace_s: float = Field(30.0, ge=0)
    worker_cpu_threads: int | None = Field(None, ge=1)
    timing_cpu_threads: int = Field(1, ge=0, le=1024)
    record_timeline: bool = True
    api_token: SecretStr | None = None
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    worker_memory_bytes: int = Field(default_factory=default_worker_memory_bytes, ge=1, le=2**60)
    auto_runs_on_cpu: bool = Field(default_factory=lambda: not host_has_nvidia_gpu())
    protect_reads: bool = False
    check_model_entry_points: bool = True
    allowed_model_targets: Annotated[list[str], NoDecode] = Field(default_factory=list)
    max_steps: int = Field(100_000, ge=1)
    max_batch_size: int = Field(65_536, ge=1)
    max_param_count: int = Field(1_000_000_000, ge=1)
    max_world_size: int = Field(8, ge=1, le=4096)
    max_request_bytes: int = Field(1_048_576, ge=1024)
    max_sweep_size: int = Field(256, ge=1)
    sse_poll_interval_s: float = Field(0.15, gt=0, le=5)
    max_streams: int = Field(200, ge=1)
    noise_threshold_pct: float = Field(NOISE_THRESHOLD_PCT, ge=0, le=1000)
    series_max_points: int = Field(20_000, ge=10, le=1_000_000)
    series_cache_bytes: int = Field(256 * 2**20, ge=0)
    series_warm_interval_s: float = Field(2.0, ge=0)
    prediction_timeout_s: float = Field(120.0, gt=0, le=86_400)
    prediction_memory_bytes: int = Field(8 * 2**30, ge=256 * 2**20, le=2**60)
    prediction_slots: int = Field(2, ge=1, le=1024)

    @field_validator("api_token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, v: object) -> object:
        # ``CKPTLAB_API_TOKEN=`` (as compose files pass through) means "no token", not a
        # token that no request can match.
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("cors_origins", "allowed_hosts", "allowed_model_targets", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        """Accept ``a,b`` as well as a JSON list from the environment (``[::1]`` is a host)."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    return json.loads(text)
                except json.JSONDecodeError:
                    pass  # not JSON: an IPv6 literal such as ``[::1]``
            return [o.strip() for o in text.split(",") if o.strip()]
        return value

    @property
    def heartbeat_interval_s(self) -> float:
        """Seconds between a worker's heartbeats (and reaper passes): ``lease_s / 3``."""
        return self.lease_s / 3

    @property
    def trusted_hosts(self) -> list[str]:
        """The ``Host`` names the API answers: :attr:`allowed_hosts`, or by default the
        bound address, ``localhost``, ``127.0.0.1`` and ``[::1]`` (IPv6 literals in brackets,
        as they appear in a ``Host`` header)."""
        if self.allowed_hosts:
            return list(self.allowed_hosts)
        bound = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return list(dict.fromkeys([bound, "localhost", "127.0.0.1", "[::1]"]))

    @property
    def resolved_database_url(self) -> str:
        """The database URL; the default SQLite file lives under ``data_dir``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'ckptlab.db').resolve()}"


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read once from the environment."""
    return Settings()
