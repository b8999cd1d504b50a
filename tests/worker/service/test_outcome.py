"""The outcome recorder's texts (issue 33, item 6): a run's public error is one line with
the exception's type and message, no traceback frame and no file path; its log is the
whole traceback."""

from __future__ import annotations

from ckptlab.worker.service.outcome import ERROR_LIMIT, LOG_LIMIT, error_text, log_text


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - the test's own exception
        return caught


def test_the_error_is_one_line_without_frames_or_paths():
    message = (
        "Given groups=1, weight of size [64, 3, 7, 7]\n"
        '  File "/usr/lib/python3/site-packages/torch/nn/modules/conv.py", line 454, in _conv_forward\n'
        "see /home/me/.cache/ckptlab/worker/memory.py, https://pytorch.org/docs/stable/notes/cuda.html and 1/2"
    )
    text = error_text(_raised(RuntimeError(message)))
    assert text == (
        "RuntimeError: Given groups=1, weight of size [64, 3, 7, 7] see memory.py, "
        "https://pytorch.org/docs/stable/notes/cuda.html and 1/2"
    )
    assert error_text(_raised(KeyError())) == "KeyError"
    long = error_text(_raised(ValueError("x" * 5000)))
    assert len(long) == ERROR_LIMIT and long.endswith("…")


def test_the_log_is_the_whole_traceback_with_its_causes_and_its_tail_when_long():
    try:
        try:
            raise ValueError("inner")
        except ValueError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as exc:
        log = log_text(exc)
    assert log.startswith("Traceback (most recent call last):") and 'File "' in log
    assert "ValueError: inner" in log and "direct cause" in log and log.rstrip().endswith("RuntimeError: outer")
    huge = log_text(_raised(ValueError("y" * (2 * LOG_LIMIT))))
    assert huge.startswith("[… cut]\n") and len(huge) == LOG_LIMIT + len("[… cut]\n")
