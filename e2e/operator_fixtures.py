"""Fixtures of the operator's cluster tests: the CRDs installed, the operator running.

The operator runs as a real local process (``vllm-operator run``, devenv/operator_process.py)
against the real control plane, with its log in the cluster's log folder.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devenv.cluster.cluster import ClusterHandle
from devenv.operator_process import OperatorProcess

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
