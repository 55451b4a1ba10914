"""Fixtures of the operator's cluster tests: the CRDs installed, the operator running.

The operator runs as a real local process (``vllm-operator run``) against the real
control plane, with its log in the cluster's log folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devenv.cluster.cluster import ClusterHandle

REPO = Path(__file__).parents[1]


@pytest.fixture(scope="session")
def crds(cluster: ClusterHandle) -> ClusterHandle:
    """The project's CRDs, applied server-side and Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "-f", str(REPO / "crds")
    )
    return cluster


@pytest.fixture(scope="session")
def lock_policy(crds: ClusterHandle) -> None:
    """The chart's ValidatingAdmissionPolicy for the scale-down lock, rendered by helm and
    applied once for the whole session.

    Once, and never deleted before the session ends: kube-apiserver 1.36 stops the shared
    informer of a built-in paramKind (ours is the Job) when the last binding that uses it
    goes, and a policy created later reuses the stopped informer, finds no params and,
    with parameterNotFoundAction Allow, allows every scale-down (kubernetes/kubernetes
    #130887; fix in review, #141015, backport #142150). So the real-node tests install the
    chart with its own copy of the policy turned off and rely on this one, and it is left
    in place when the session ends: the next session on a cluster kept running
    (VLLM_OP_E2E_KEEP_CLUSTER, `make cluster-up`) finds it and its informer alive, where
    a delete and re-create would meet the bug."""
    assert crds.helm_path is not None
    rendered = subprocess.run(
        [
            str(crds.helm_path),
            "template",
            "t",
            str(REPO / "charts" / "vllm-operator"),
            "--show-only",
            "templates/admission-policy.yaml",
            "--kube-version",
            "1.36.3",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    crds.kubectl("apply", "-f", "-", input=rendered)


class OperatorProcess:
    """``vllm-operator run`` as a child process; stop() and start() simulate restarts.

    ``kubeconfig`` (default: the cluster's) and ``env`` (settings over the defaults below)
    are for the fault tests' own operator, which talks through a proxy."""

    def __init__(
        self,
        cluster: ClusterHandle,
        log_dir: Path,
        *,
        name: str = "operator",
        kubeconfig: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.log_path = log_dir / f"{name}.log"
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # Never a second operator beside a live one (it would reconcile every object twice).
        assert not self.alive(), "the operator runs already"
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
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_operator.cli", "run"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
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
        while "Started the vllm-operator" not in self.log_since(mark):
            assert self.alive(), f"the operator exited:\n{self.log_tail()}"
            assert time.monotonic() < deadline, f"no start in {timeout:.0f} s:\n{self.log_tail()}"
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


def log_dir(cluster: ClusterHandle, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if cluster.settings is not None:
        path = Path(cluster.settings.state_dir) / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("operator-logs")


@pytest.fixture(scope="session")
def local_operator(
    crds: ClusterHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The operator as a local process, running for the whole session (tests may stop and
    start it)."""
    op = OperatorProcess(crds, log_dir(crds, tmp_path_factory))
    mark = op.log_mark()
    op.start()
    op.wait_started(mark)
    yield op
    op.stop()


@pytest.fixture(scope="session")
def operator_process(local_operator: OperatorProcess) -> OperatorProcess:
    """The operator the tests drive: the local process, unless a module overrides this
    fixture (e2e/test_chart_operator.py runs the same tests against the chart's pod)."""
    return local_operator
