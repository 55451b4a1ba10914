"""Determinism across processes: a function called in two fresh interpreters with
different hash seeds must give the same result.

Calling a function twice in one process cannot catch what varies between processes: the
iteration order of a set of strings (hash randomization), an id(), a dict filled from one.
The operator renders and plans in a new process after every restart, and Argo CD or a
GitOps diff compares what two processes wrote; so each determinism test names a
zero-argument function ``module:function`` whose result's ``repr`` is compared here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]
_CALL = (
    "import importlib, sys\n"
    "module, _, name = sys.argv[1].partition(':')\n"
    "print(repr(getattr(importlib.import_module(module), name)()))\n"
)
SEEDS = ("1", "2")


def same_across_processes(target: str) -> str:
    """``repr`` of ``target()`` (``module:function``), the same under two hash seeds."""
    outputs = []
    for seed in SEEDS:
        done = subprocess.run(
            [sys.executable, "-c", _CALL, target],
            env={**os.environ, "PYTHONHASHSEED": seed},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        outputs.append(done.stdout)
    first, second = outputs
    assert first, f"{target} printed nothing"
    assert first == second, f"{target} differs between hash seeds {SEEDS[0]} and {SEEDS[1]}"
    return first
