"""A multi-node service on the real LeaderWorkerSet controller (e2e/lws_fixtures.py), with the
operator as a local process and kwok's fake GPU nodes: the group is created and every member
scheduled, Ready follows the groups, a killed worker recreates its group, scaling changes
the group count, and a benchmark's lock holds the groups.

The service is Llama-3.1-405B in bf16 (about 756 GiB of weights) on nodes of eight H100s
(80 GiB each): no node holds it, so the plan is two nodes per group (docs/multi-node.md).
Four such nodes are added for this module, in two racks, tainted and labelled so that only
this module's pods land on them and only its service plans over them.

What this cannot show: kwok runs no container, so no vLLM starts, no NCCL connects the
nodes and nothing is served across them; the pods are scheduled and become Ready as kwok
plays them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from devenv.cluster.cluster import ClusterHandle
from devenv.cluster.nodes import GPUShape, NodeShape, render_node
from e2e.framework import condition, fetch, lock_job, wait_for
from e2e.lws_fixtures import NAMESPACE_LABEL, LwsController
from e2e.operator_fixtures import OperatorProcess

GROUP = "inference.vllm-operator.dev"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
RACK = f"{GROUP}/rack"
NODE_LABEL = "e2e.vllm-operator.dev/lws-node"
TAINT = "e2e.vllm-operator.dev/lws"
NODES = {f"lws-h100-{rack}{i}": rack for rack in "ab" for i in "12"}
HOLD = "e2e.vllm-operator.dev/hold"


@pytest.fixture(scope="module")
def lws_nodes(lws_controller: LwsController) -> Iterator[list[str]]:
    """Four fake nodes of eight H100s in two racks, tainted for this module alone."""
    cluster = lws_controller.cluster
    shapes = [
        NodeShape(
            name=name,
            cpu="224",
            memory="2015Gi",
            pods=110,
            ephemeral_storage="30Ti",
            gpu=GPUShape("NVIDIA H100 80GB HBM3", 8, 81559, "nvlink", "NV18"),
            labels={NODE_LABEL: "true", RACK: rack},
            taints=({"key": TAINT, "value": "true", "effect": "NoSchedule"},),
        )
        for name, rack in NODES.items()
    ]
    cluster.apply([render_node(s) for s in shapes])
    cluster.kubectl("wait", "--for=condition=Ready", "node", "-l", f"{NODE_LABEL}=true",
                    "--timeout=60s", timeout=70)  # fmt: skip
    yield list(NODES)
    cluster.kubectl("delete", "node", "-l", f"{NODE_LABEL}=true", "--wait=false", check=False)


@pytest.fixture
def op(operator_process: OperatorProcess) -> OperatorProcess:
    if not operator_process.alive():
        operator_process.start()
    return operator_process


def _isvc(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "big"},
        "spec": {
            "model": {"source": {"huggingFace": {"repo": "meta-llama/Llama-3.1-405B-Instruct"}}},
            "replicas": replicas,
            "warmup": {"enabled": False},
            "podTemplate": {
                "nodeSelector": {NODE_LABEL: "true"},
                "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            },
        },
    }


def _pods(cluster: ClusterHandle, ns: str) -> list[dict[str, Any]]:
    found = fetch(cluster, ns, "pods", "-l", f"{LWS_NAME_LABEL}=big") or {}
    return [p for p in found.get("items", []) if not p["metadata"].get("deletionTimestamp")]


def _running(pod: dict[str, Any]) -> bool:
    ready = condition(pod, "Ready").get("status") == "True"
    return bool(pod["spec"].get("nodeName")) and pod["status"].get("phase") == "Running" and ready


def _groups(cluster: ClusterHandle, ns: str) -> dict[str, list[dict[str, Any]]]:
    """The running pods by group index."""
    out: dict[str, list[dict[str, Any]]] = {}
    for pod in _pods(cluster, ns):
        out.setdefault(pod["metadata"]["labels"].get(LWS_GROUP_LABEL, "?"), []).append(pod)
    return out


def _groups_running(cluster: ClusterHandle, ns: str, count: int) -> bool:
    groups = _groups(cluster, ns)
    return (
        sorted(groups) == [str(i) for i in range(count)]
        and all(len(pods) == 2 and all(_running(p) for p in pods) for pods in groups.values())
        and len(_pods(cluster, ns)) == 2 * count
    )


def _service(cluster: ClusterHandle, ns: str) -> dict[str, Any]:
    return fetch(cluster, ns, "vis", "big") or {}


def _ready_with(cluster: ClusterHandle, ns: str, groups: int) -> bool:
    isvc = _service(cluster, ns)
    status = isvc.get("status", {})
    return (
        condition(isvc, "Ready").get("status") == "True"
        and status.get("readyReplicas") == groups
        and status.get("desiredReplicas") == groups
        and status.get("observedGeneration") == isvc["metadata"]["generation"]
    )


def _lws(cluster: ClusterHandle, ns: str) -> dict[str, Any]:
    return fetch(cluster, ns, "leaderworkerset", "big") or {}


def _scale(cluster: ClusterHandle, ns: str, kind: str, replicas: int, *, check: bool = True) -> Any:
    return cluster.kubectl("scale", kind, "big", "-n", ns, f"--replicas={replicas}", check=check)


def test_a_multi_node_service_runs_as_groups_on_the_real_lws_controller(
    op: OperatorProcess,
    lws_controller: LwsController,
    lws_nodes: list[str],
    lock_policy: None,
    namespace: str,
) -> None:
    cluster = op.cluster
    ns = namespace
    cluster.kubectl("label", "namespace", ns, f"{NAMESPACE_LABEL}=true")
    cluster.apply(_isvc(replicas=1), namespace=ns)

    # The group: a LeaderWorkerSet of one group of two pods, owned by the service, no
    # Deployment; both pods scheduled on this module's nodes, one per node, in one rack.
    lws = wait_for(lambda: _lws(cluster, ns).get("spec") and _lws(cluster, ns), "the LWS", 90)
    assert fetch(cluster, ns, "deployment", "big") is None
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"
    assert lws["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/exclusive-topology"] == RACK
    wait_for(lambda: _groups_running(cluster, ns, 1), "one group running", 120)
    wait_for(lambda: _ready_with(cluster, ns, 1), "Ready with one group", 120)
    (pods,) = _groups(cluster, ns).values()
    nodes = {p["spec"]["nodeName"] for p in pods}
    assert len(nodes) == 2 and nodes <= set(lws_nodes)
    assert len({NODES[n] for n in nodes}) == 1, "a group stays in one rack"
    leader = next(p for p in pods if p["metadata"]["labels"].get(LWS_WORKER_LABEL) == "0")
    worker = next(p for p in pods if p is not leader)
    # The LWS pod webhook ran: the leader's address is in every pod's environment.
    env = {e["name"] for e in worker["spec"]["containers"][0].get("env", [])}
    assert "LWS_LEADER_ADDRESS" in env
    # Only the leader is behind the Service.
    assert leader["metadata"]["labels"].get(f"{GROUP}/inference-service") == "big"
    assert f"{GROUP}/inference-service" not in worker["metadata"]["labels"]

    # Scaling the service changes the number of groups; each group takes a rack.
    _scale(cluster, ns, "vis", 2)
    wait_for(lambda: _lws(cluster, ns)["spec"]["replicas"] == 2, "two groups asked for", 90)
    wait_for(lambda: _groups_running(cluster, ns, 2), "two groups running", 120)
    wait_for(lambda: _ready_with(cluster, ns, 2), "Ready with two groups", 120)
    racks = {
        index: {NODES[p["spec"]["nodeName"]] for p in pods}
        for index, pods in _groups(cluster, ns).items()
    }
    assert sorted(len(r) for r in racks.values()) == [1, 1]
    assert set().union(*racks.values()) == {"a", "b"}

    # Ready follows the groups: a third group has no rack left, so it never becomes ready,
    # and the service is not Ready with two of three.
    _scale(cluster, ns, "vis", 3)
    wait_for(lambda: _lws(cluster, ns)["spec"]["replicas"] == 3, "three groups asked for", 90)

    def not_ready_two_of_three() -> bool:
        isvc = _service(cluster, ns)
        status = isvc.get("status", {})
        return (
            condition(isvc, "Ready").get("status") == "False"
            and status.get("desiredReplicas") == 3
            and status.get("readyReplicas") == 2
        )

    wait_for(not_ready_two_of_three, "Ready=False with 2 of 3 groups ready", 120)
    _scale(cluster, ns, "vis", 2)
    wait_for(lambda: _ready_with(cluster, ns, 2), "Ready again with two groups", 120)

    # A killed worker takes its whole group with it (RecreateGroupOnPodRestart): the leader
    # is recreated too, and the group comes back. LWS acts on the worker's deletionTimestamp
    # while a kubelet stops the pod (its grace period); kwok removes a deleted pod at once,
    # and LWS then missed the deletion in one run of five here (the worker's StatefulSet had
    # already replaced the pod). A finalizer of the test's holds the pod terminating, as a
    # kubelet would, until LWS has deleted the leader (whose deletion in turn waits for its
    # worker StatefulSet's pods, this one among them).
    group0 = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _groups(cluster, ns)["0"]}
    (worker_name,) = [n for n in group0 if n != "big-0"]
    cluster.kubectl("patch", "pod", worker_name, "-n", ns, "--type=merge",
                    "-p", json.dumps({"metadata": {"finalizers": [HOLD]}}))  # fmt: skip
    cluster.kubectl("delete", "pod", worker_name, "-n", ns, "--wait=false")

    def leader_deleted() -> bool:
        leader = fetch(cluster, ns, "pod", "big-0")
        return (
            leader is None
            or leader["metadata"]["uid"] != group0["big-0"]
            or bool(leader["metadata"].get("deletionTimestamp"))
        )

    try:
        wait_for(leader_deleted, "LWS to delete the group's leader", 120)
    finally:  # never a pod left that holds its namespace's deletion
        cluster.kubectl("patch", "pod", worker_name, "-n", ns, "--type=merge",
                        "-p", json.dumps({"metadata": {"finalizers": None}}),
                        check=False)  # fmt: skip

    def recreated() -> bool:
        pods = _groups(cluster, ns).get("0", [])  # none for a moment: the group is gone
        now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
        return set(now) == set(group0) and all(now[n] != group0[n] for n in group0)

    wait_for(recreated, "group 0 recreated, leader included", 120)
    wait_for(lambda: _groups_running(cluster, ns, 2), "two groups running again", 120)
    wait_for(lambda: _ready_with(cluster, ns, 2), "Ready after the group came back", 120)

    # A benchmark's lock holds the groups: neither the service nor its LeaderWorkerSet may
    # go down while the load Job runs; the service says so.
    cluster.apply(lock_job("big"), namespace=ns)
    wait_for(
        lambda: condition(_service(cluster, ns), "ScaleDownBlocked").get("status") == "True",
        "ScaleDownBlocked=True",
        60,
    )
    for kind in ("leaderworkerset", "vis"):
        refused = _scale(cluster, ns, kind, 1, check=False)
        assert refused.returncode != 0, f"{kind} scaled down under the lock"
        assert "cannot go down from 2 to 1" in refused.stderr, refused.stderr
    assert _lws(cluster, ns)["spec"]["replicas"] == 2
    assert _groups_running(cluster, ns, 2)

    # The lock goes with its Job: scaling down removes a whole group.
    cluster.kubectl("delete", "job", "lock", "-n", ns)
    wait_for(
        lambda: condition(_service(cluster, ns), "ScaleDownBlocked").get("status") == "False",
        "ScaleDownBlocked=False",
        60,
    )
    _scale(cluster, ns, "vis", 1)
    wait_for(lambda: _groups_running(cluster, ns, 1), "one group left", 120)
    wait_for(lambda: _ready_with(cluster, ns, 1), "Ready with one group", 120)
