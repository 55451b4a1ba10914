"""Fixtures of the tests that run on the real node (devenv/cluster/node.py).

- ``real_images`` (session): the images of this tree, built if changed and imported into
  the running node; the tests skip, saying why, when the cluster has no real node.
- ``real_namespace`` (function): a factory of fresh namespaces whose every pod goes to the
  real node, under the Pod Security level asked for (restricted by default), deleted
  after the test (diagnostics first, on failure).
- ``chart_operator`` (module): the operator installed with its Helm chart, as a pod from
  its own image on the real node, holding only the chart's ServiceAccount token. The
  session's operator process is stopped meanwhile (two operators would reconcile every
  object twice) and started again afterwards. Its ``process`` is a ``PodOperator``: the
  pod behind the interface of the local ``OperatorProcess`` (start, stop, kill, log), so
  the operator scenarios of e2e/test_operator.py run against it too.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devenv.ci import skip_or_fail
from devenv.cluster import node
from devenv.cluster.cluster import ClusterHandle
from devenv.cluster.images import Images
from devenv.cluster.processes import wait_until
from devenv.dev import install_operator
from e2e.framework import condition, delete_namespace, dump_diagnostics
from e2e.operator_fixtures import OperatorProcess

OPERATOR_NAMESPACE = "e2e-real-operator"
RELEASE = "vllm-op-real"


@pytest.fixture(scope="session")
def real_images(cluster: ClusterHandle) -> Images:
    settings = cluster.settings
    if settings is None or not settings.real_node or not node.is_healthy(settings):
        skip_or_fail("the cluster has no real node (VLLM_OP_REAL_NODE=0, or an existing cluster)")
    # A cluster left running from an earlier session has the images of then: what changed
    # since (the operator's code, say) is built and imported now, so the tests run this tree.
    return node.ensure_images(settings)


@pytest.fixture
def real_namespace(
    cluster: ClusterHandle, real_images: Images, request: pytest.FixtureRequest
) -> Iterator[Callable[..., str]]:
    made: list[str] = []

    def make(pod_security: str = "restricted") -> str:
        base = request.node.name.lower().replace("_", "-")[:40].rstrip("-")
        name = f"e2e-rn-{base}-{secrets.token_hex(3)}"
        cluster.apply(node.real_node_namespace(name, pod_security=pod_security))
        cluster.kubectl(
            "wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=60s"
        )
        made.append(name)
        return name

    yield make
    from e2e.conftest import _failed

    for name in made:
        if _failed(request):
            dump_diagnostics(cluster, request, namespace=name)
        delete_namespace(cluster, name, timeout=90)


def _operator_pods(cluster: ClusterHandle, namespace: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=operator"
    )["items"]
    return pods


def operator_pod(cluster: ClusterHandle, namespace: str) -> dict[str, Any]:
    pods = _operator_pods(cluster, namespace)
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def _running_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {}).get("containerStatuses") or [{}]
    return (
        not pod["metadata"].get("deletionTimestamp")
        and "running" in status[0].get("state", {})
        and bool(status[0].get("ready"))
    )


class PodOperator:
    """The chart's operator pod, driven as e2e/operator_fixtures.py drives the local
    process: ``stop()`` scales its Deployment to 0 (the kubelet's SIGTERM, the grace
    period); ``stop(kill=True)`` SIGKILLs its container on the node behind the kubelet's
    back, as a crash would, and the kubelet restarts it; ``start()`` waits for it to run
    and be Ready again (scaling back to 1 after a stop)."""

    def __init__(self, cluster: ClusterHandle, namespace: str, deployment: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.deployment = deployment
        self._restarts_before_kill: int | None = None

    def _pods(self) -> list[dict[str, Any]]:
        return [
            p
            for p in _operator_pods(self.cluster, self.namespace)
            if not p["metadata"].get("deletionTimestamp")
        ]

    def _scale(self, replicas: int) -> None:
        self.cluster.kubectl(
            "scale", "deployment", self.deployment, "-n", self.namespace, f"--replicas={replicas}"
        )

    def alive(self) -> bool:
        return self._restarts_before_kill is None and any(map(_running_ready, self._pods()))

    def stop(self, *, kill: bool = False) -> None:
        if kill:
            [pod] = self._pods()
            status = pod["status"]["containerStatuses"][0]
            assert self.cluster.settings is not None
            node.kill_container(self.cluster.settings, status["containerID"])
            self._restarts_before_kill = int(status["restartCount"])
            return
        self._scale(0)
        wait_until(
            "the operator pod gone",
            lambda: not _operator_pods(self.cluster, self.namespace),
            90,
        )

    def start(self) -> None:
        if self._restarts_before_kill is None and not self._pods():
            self._scale(1)
        before = self._restarts_before_kill

        def up() -> bool:
            pods = self._pods()
            if len(pods) != 1 or not _running_ready(pods[0]):
                return False
            restarts = int(pods[0]["status"]["containerStatuses"][0]["restartCount"])
            return before is None or restarts > before

        # A second crash within minutes waits out the kubelet's back-off (10 s, doubling).
        wait_until("the operator pod running and Ready", up, 120)
        self._restarts_before_kill = None

    def _logs(self, *flags: str) -> str:
        pods = self._pods()
        if not pods:
            return ""
        name = pods[0]["metadata"]["name"]
        proc = self.cluster.kubectl("logs", "-n", self.namespace, name, *flags, check=False)
        return str(proc.stdout)

    def log_tail(self, lines: int = 80) -> str:
        return self._logs(f"--tail={lines}")

    def log_mark(self) -> str:
        """The next whole second (kubectl logs --since-time reads whole seconds): what
        :meth:`log_since` reads from, so no earlier line is counted."""
        now = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
        return now.strftime("%Y-%m-%dT%H:%M:%SZ")

    def log_since(self, mark: str) -> str:
        return self._logs(f"--since-time={mark}")


@dataclass(frozen=True)
class ChartOperator:
    namespace: str
    pod: dict[str, Any]
    process: PodOperator


@pytest.fixture(scope="module")
def chart_operator(
    cluster: ClusterHandle,
    crds: ClusterHandle,
    real_images: Images,
    local_operator: OperatorProcess,
    lock_policy: None,
    request: pytest.FixtureRequest,
) -> Iterator[ChartOperator]:
    local_operator.stop()
    # A module may give its load Jobs CPU (LOAD_JOB_CPU): a load generator that requests
    # none is starved by any neighbour that does.
    load_cpu = getattr(request.module, "LOAD_JOB_CPU", "0")
    try:
        # The real node has 2 cores: a vLLM pod and a benchmark's load Job take one each,
        # so this install asks for no CPU (a value users can set the same way).
        resources = {"requests": {"cpu": "0", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
        # Likewise its warmup and load Jobs: on 2 cores, two replicas take both.
        jobs = {"warmupResources": {"requests": {"cpu": "0", "memory": "64Mi"},
                                    "limits": {"memory": "512Mi"}},
                "loadResources": {"requests": {"cpu": load_cpu, "memory": "256Mi"},
                                  "limits": {"memory": "2Gi"}},
                "downloadResources": {"requests": {"cpu": "0", "memory": "128Mi"},
                                      "limits": {"memory": "1Gi"}}}  # fmt: skip
        install_operator(
            cluster,
            namespace=OPERATOR_NAMESPACE,
            release=RELEASE,
            # The session's copy of the chart's lock policy is in force (see lock_policy).
            extra_values={
                "resources": resources,
                # A line per reconcile pass: what "nothing changed over a pass" awaits.
                "operator": {**jobs, "logLevel": "debug"},
                "scaleDownLock": {"enabled": False},
            },
        )
        wait_until(
            "the operator pod Ready",
            lambda: (
                condition(operator_pod(cluster, OPERATOR_NAMESPACE), "Ready").get("status")
                == "True"
            ),
            120,
        )
        pod = operator_pod(cluster, OPERATOR_NAMESPACE)
        deployment = f"{RELEASE}-vllm-operator"
        yield ChartOperator(
            OPERATOR_NAMESPACE, pod, PodOperator(cluster, OPERATOR_NAMESPACE, deployment)
        )
    finally:
        assert cluster.helm_path is not None
        subprocess.run(
            [str(cluster.helm_path), "uninstall", RELEASE, "-n", OPERATOR_NAMESPACE, "--wait",
             f"--kubeconfig={cluster.kubeconfig}"],
            capture_output=True, check=False, timeout=120, env=cluster.env(),
        )  # fmt: skip
        cluster.kubectl("delete", "namespace", OPERATOR_NAMESPACE, "--wait=true", "--timeout=90s",
                        check=False, timeout=100)  # fmt: skip
        local_operator.start()
