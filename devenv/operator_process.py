"""The operator as a local child process (``python -m vllm_operator.cli run``) against the
local control plane, its output in a log file.

The cluster tier (e2e/operator_fixtures.py) and the scale benchmark (devenv/scale.py) both
run it this way. ``tree`` runs the operator package of another checkout (PYTHONPATH names
its ``operator/`` folder, which comes before the editable install of this one), so an
older commit can be measured against the same harness.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from devenv.cluster.cluster import ClusterHandle

REPO = Path(__file__).resolve().parents[1]
STARTED_LINE = "Started the vllm-operator"


class OperatorError(RuntimeError):
    """The operator process exited, or did not start in time."""


class OperatorProcess:
    """``vllm-operator run`` as a child process; stop() and start() simulate restarts.

    ``kubeconfig`` (default: the cluster's) and ``env`` (settings over the defaults below)
    are for callers with their own needs: the fault tests' operator talks through a proxy,
    the scale benchmark exports metrics and logs at info level. ``tree`` is the checkout
    whose operator runs (default: this one)."""

    def __init__(
        self,
        cluster: ClusterHandle,
        log_dir: Path,
        *,
        name: str = "operator",
        kubeconfig: Path | None = None,
        env: dict[str, str] | None = None,
        tree: Path | None = None,
    ) -> None:
        self.cluster = cluster
        self.log_path = log_dir / f"{name}.log"
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        self.extra_env = env or {}
        self.tree = tree
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        """The process's environment: the cluster's, the test defaults, then ``env``."""
        env = self.cluster.env()
        env.update(
            {
                "VLLM_OPERATOR_KUBECONFIG": str(self.kubeconfig),
                "VLLM_OPERATOR_RESYNC_SECONDS": env.get("VLLM_OPERATOR_RESYNC_SECONDS", "20"),
                "VLLM_OPERATOR_METRICS_PORT": "0",
                # A line per reconcile pass: what "nothing changed over a pass" awaits.
                "VLLM_OPERATOR_LOG_LEVEL": "debug",
                "VLLM_OPERATOR_HEALTH_PORT": "0",
                "VLLM_OPERATOR_DEFAULT_IMAGE": "vllm/vllm-openai:e2e",
                **self.extra_env,
            }
        )
        if self.tree is not None:
            package = str(self.tree.resolve() / "operator")
            env["PYTHONPATH"] = os.pathsep.join(p for p in (package, env.get("PYTHONPATH")) if p)
        return env

    def start(self) -> None:
        # Never a second operator beside a live one (it would reconcile every object twice).
        if self.alive():
            raise OperatorError("the operator runs already")
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_operator.cli", "run"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env(),
            cwd=self.tree or REPO,
            start_new_session=True,
        )
        log.close()

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None

    def wait_started(self, mark: int = 0, timeout: float = 60) -> None:
        """Until the operator logs that it started (after ``mark``, a log position)."""
        deadline = time.monotonic() + timeout
        while STARTED_LINE not in self.log_since(mark):
            if not self.alive():
                raise OperatorError(f"the operator exited:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise OperatorError(f"no start in {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.2)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 80) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def log_mark(self) -> int:
        """Where the log ends now: what :meth:`log_since` reads from."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_since(self, mark: int) -> str:
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as f:
            f.seek(mark)
            return f.read().decode(errors="replace")
