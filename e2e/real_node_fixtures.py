"""Fixtures of the tests that run on the real node (e2e/cluster/node.py).

- ``real_images`` (session): the images the running node was started with; the tests
  skip, saying why, when the cluster has no real node.
- ``real_namespace`` (function): a factory of fresh namespaces whose every pod goes to the
  real node, under the Pod Security level asked for (restricted by default), deleted
  after the test (diagnostics first, on failure).
- ``chart_operator`` (module): the operator installed with its Helm chart, as a pod from
  its own image on the real node, holding only the chart's ServiceAccount token. The
  session's operator process is stopped meanwhile (two operators would reconcile every
  object twice) and started again afterwards.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from e2e.cluster import node
from e2e.cluster.cluster import ClusterHandle, wait_until
from e2e.cluster.images import Images
from e2e.dev import install_operator
from e2e.operator_fixtures import OperatorProcess

OPERATOR_NAMESPACE = "e2e-real-operator"
RELEASE = "vllm-op-real"


@pytest.fixture(scope="session")
def real_images(cluster: ClusterHandle) -> Images:
    built = node.built_images(cluster.settings) if cluster.settings is not None else None
    if built is None:
        pytest.skip("the cluster has no real node (VLLM_OP_REAL_NODE=0, or an existing cluster)")
    return built


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
    from e2e.conftest import _failed, dump_diagnostics

    for name in made:
        if _failed(request):
            dump_diagnostics(cluster, request, namespace=name)
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
        cluster.kubectl(
            "delete", "pods", "--all", "-n", name, "--wait=true", "--timeout=90s",
            check=False, timeout=100,
        )  # fmt: skip


@dataclass(frozen=True)
class ChartOperator:
    namespace: str
    pod: dict[str, Any]


def operator_pod(cluster: ClusterHandle, namespace: str) -> dict[str, Any]:
    pods = cluster.kubectl_json(
        "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=operator"
    )["items"]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    pod: dict[str, Any] = pods[0]
    return pod


@pytest.fixture(scope="module")
def chart_operator(
    cluster: ClusterHandle,
    crds: ClusterHandle,
    real_images: Images,
    operator_process: OperatorProcess,
    lock_policy: None,
) -> Iterator[ChartOperator]:
    operator_process.stop()
    try:
        # The real node has 2 cores: a vLLM pod and a benchmark's load Job take one each,
        # so this install asks for no CPU (a value users can set the same way).
        resources = {"requests": {"cpu": "0", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
        install_operator(
            cluster,
            namespace=OPERATOR_NAMESPACE,
            release=RELEASE,
            # The session's copy of the chart's lock policy is in force (see lock_policy).
            extra_values={"resources": resources, "scaleDownLock": {"enabled": False}},
        )
        wait_until(
            "the operator pod Ready",
            lambda: any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in operator_pod(cluster, OPERATOR_NAMESPACE)["status"].get("conditions", [])
            ),
            120,
        )
        yield ChartOperator(OPERATOR_NAMESPACE, operator_pod(cluster, OPERATOR_NAMESPACE))
    finally:
        assert cluster.helm_path is not None
        subprocess.run(
            [str(cluster.helm_path), "uninstall", RELEASE, "-n", OPERATOR_NAMESPACE, "--wait",
             f"--kubeconfig={cluster.kubeconfig}"],
            capture_output=True, check=False, timeout=120, env=cluster.env(),
        )  # fmt: skip
        cluster.kubectl("delete", "namespace", OPERATOR_NAMESPACE, "--wait=true", "--timeout=90s",
                        check=False, timeout=100)  # fmt: skip
        operator_process.start()
