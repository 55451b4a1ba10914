"""What a test does when something it needs is missing: skip on a laptop, fail under CI.

A developer without the real node, the CPU vLLM or promtool gets a skip that says what is
missing and how to get it. Under CI (``CI`` set to anything but ``""``, ``0`` or
``false``) ``.ci/run`` has installed and started all of it, so the same absence is a broken
pipeline: the test fails, naming what is missing and the line that asked for it, and the
run goes red instead of staying green over tests that never ran.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import NoReturn

import pytest

CI_ENV = "CI"


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set and not ``0``/``false``)."""
    return os.environ.get(CI_ENV, "").strip().lower() not in ("", "0", "false")


def _caller() -> str:
    """``file:line`` of whoever called :func:`skip_or_fail`, relative to the checkout."""
    frame = inspect.currentframe()
    for _ in range(2):  # _caller <- skip_or_fail <- the caller
        frame = frame.f_back if frame is not None else None
    if frame is None:
        return "?"
    path = Path(frame.f_code.co_filename)
    where = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    return f"{where}:{frame.f_lineno}"


def skip_or_fail(reason: str) -> NoReturn:
    """Skip with ``reason``; under CI fail with it and the caller's file and line."""
    if in_ci():
        pytest.fail(
            f"{reason} [{_caller()}] (CI is set: what a test needs is installed by .ci/run, "
            "so its absence fails the run instead of skipping)",
            pytrace=False,
        )
    pytest.skip(reason)
