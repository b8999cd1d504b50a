"""Helpers for tests."""

from __future__ import annotations

import subprocess
import time


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.1):
    """Poll ``predicate()`` until it returns a truthy value; raise TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"condition not met within {timeout} s")


def stop_process(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM ``proc`` and wait up to ``timeout`` s for it, then SIGKILL it."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
