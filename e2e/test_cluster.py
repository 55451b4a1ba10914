"""The local control plane itself: fake GPU nodes, scheduling, readiness gates, pod IPs.

Everything later cluster tests stand on is checked here against the real apiserver,
scheduler and controller-manager, with kwok playing the kubelet.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
from typing import Any

import pytest

from devenv.ci import skip_or_fail
from devenv.cluster import nodes as fake_nodes
from devenv.cluster.cluster import ClusterHandle
from devenv.cluster.processes import wait_until
from e2e.framework import condition, ready_addresses

pytestmark = pytest.mark.cluster

GATE = "inference.vllm-operator.dev/warmed-up"
# Never pulled: kwok runs no containers.
IMAGE = "registry.k8s.io/pause:3.10"


def _shapes_or_skip(cluster: ClusterHandle) -> list[fake_nodes.NodeShape]:
    """The fake node shapes, when the cluster is ours; existing clusters have no such nodes."""
    if not cluster.local:
        skip_or_fail("the fake GPU nodes exist only on the local control plane")
    assert cluster.settings is not None
    return fake_nodes.load_shapes(cluster.settings.nodes_file)


def _pod_cidr(cluster: ClusterHandle) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    assert cluster.settings is not None
    return ipaddress.ip_network(cluster.settings.pod_cidr)


def _pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": IMAGE}], **spec},
    }


def _gpu_deployment(name: str, *, replicas: int, product_label: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {fake_nodes.LABEL_GPU_PRODUCT: product_label},
                    "containers": [
                        {
                            "name": "main",
                            "image": IMAGE,
                            "resources": {
                                "requests": {"cpu": "1", "memory": "1Gi"},
                                "limits": {fake_nodes.GPU_RESOURCE: "1"},
                            },
                        }
                    ],
                },
            },
        },
    }


def test_node_label_keys_match_operator_constants() -> None:
    from vllm_operator import constants

    assert fake_nodes.LABEL_GPU_PRODUCT == constants.NODE_LABEL_GPU_PRODUCT
    assert fake_nodes.LABEL_GPU_MEMORY_MIB == constants.NODE_LABEL_GPU_MEMORY_MIB
    assert fake_nodes.LABEL_GPU_COUNT == constants.NODE_LABEL_GPU_COUNT
    assert fake_nodes.LABEL_GPU_INTERCONNECT == constants.NODE_LABEL_GPU_INTERCONNECT
    assert fake_nodes.GPU_RESOURCE == constants.GPU_RESOURCE


def test_fake_nodes_report_gpu_capacity_and_labels(cluster: ClusterHandle) -> None:
    shapes = _shapes_or_skip(cluster)
    listed = cluster.kubectl_json("get", "nodes", "-l", f"{fake_nodes.LABEL_E2E_NODE}=true")
    by_name = {n["metadata"]["name"]: n for n in listed["items"]}
    assert sorted(by_name) == sorted(s.name for s in shapes)
    for shape in shapes:
        node = by_name[shape.name]
        labels = node["metadata"]["labels"]
        assert condition(node, "Ready").get("status") == "True", shape.name
        assert node["status"]["allocatable"]["cpu"] == shape.cpu
        if shape.gpu is None:
            assert fake_nodes.GPU_RESOURCE not in node["status"]["capacity"]
            assert fake_nodes.LABEL_GPU_PRODUCT not in labels
            continue
        for field in ("capacity", "allocatable"):
            assert node["status"][field][fake_nodes.GPU_RESOURCE] == str(shape.gpu.count)
        assert labels[fake_nodes.LABEL_GPU_PRODUCT] == shape.gpu.product_label
        assert labels[fake_nodes.LABEL_GPU_MEMORY_MIB] == str(shape.gpu.memory_mib)
        assert labels[fake_nodes.LABEL_GPU_COUNT] == str(shape.gpu.count)
        assert labels[fake_nodes.LABEL_GPU_INTERCONNECT] == shape.gpu.interconnect


def test_required_shapes_are_configured(cluster: ClusterHandle) -> None:
    shapes = {s.name: s for s in _shapes_or_skip(cluster)}
    assert shapes["gpu-4090x2"].gpu == fake_nodes.GPUShape(
        "NVIDIA GeForce RTX 4090", 2, 24564, "pcie", "PHB"
    )
    assert shapes["gpu-h100x8"].gpu == fake_nodes.GPUShape(
        "NVIDIA H100 80GB HBM3", 8, 81559, "nvlink", "NV18"
    )
    assert shapes["gpu-3060x1"].gpu == fake_nodes.GPUShape(
        "NVIDIA GeForce RTX 3060", 1, 12288, "pcie"
    )
    assert any(s.gpu is None for s in shapes.values())


def test_gpu_deployment_lands_on_matching_node_and_becomes_ready(
    cluster: ClusterHandle, namespace: str
) -> None:
    shapes = {s.name: s for s in _shapes_or_skip(cluster)}
    gpu = shapes["gpu-4090x2"].gpu
    assert gpu is not None
    # As many replicas as the node has GPUs: all fit there, and nowhere else.
    cluster.apply(
        _gpu_deployment("gpu-app", replicas=gpu.count, product_label=gpu.product_label),
        namespace=namespace,
    )
    cluster.kubectl(
        "wait",
        "--for=condition=Available",
        "deployment/gpu-app",
        "-n",
        namespace,
        "--timeout=90s",
    )
    cluster.kubectl(
        "wait",
        "--for=condition=Ready",
        "pod",
        "-l",
        "app=gpu-app",
        "-n",
        namespace,
        "--timeout=60s",
    )
    pods = cluster.kubectl_json("get", "pods", "-l", "app=gpu-app", "-n", namespace)["items"]
    assert len(pods) == gpu.count
    cidr = _pod_cidr(cluster)
    for pod in pods:
        assert pod["spec"]["nodeName"] == "gpu-4090x2"
        assert pod["status"]["phase"] == "Running"
        assert ipaddress.ip_address(pod["status"]["podIP"]) in cidr
    assert len({p["status"]["podIP"] for p in pods}) == len(pods), "pod IPs repeat"
    deployment = cluster.kubectl_json("get", "deployment", "gpu-app", "-n", namespace)
    assert deployment["status"]["readyReplicas"] == gpu.count


def test_pod_ip_is_local_and_a_local_process_can_serve_on_it(
    cluster: ClusterHandle, namespace: str
) -> None:
    _shapes_or_skip(cluster)
    cluster.apply(_pod("web"), namespace=namespace)
    cluster.kubectl("wait", "--for=condition=Ready", "pod/web", "-n", namespace, "--timeout=60s")
    pod = cluster.kubectl_json("get", "pod", "web", "-n", namespace)
    ip = ipaddress.ip_address(pod["status"]["podIP"])
    assert ip in _pod_cidr(cluster)
    assert ip != ipaddress.ip_address("127.0.0.1")
    if not ip.is_loopback:
        # The range is local on lo (a route the cluster added), and in the test-network range.
        assert ip in ipaddress.ip_network("198.18.0.0/15")
        route = subprocess.run(
            ["ip", "route", "get", str(ip)], capture_output=True, text=True, check=True
        ).stdout
        assert route.startswith(f"local {ip} dev lo"), route
    # What a later test does with a real vLLM: listen on the pod's IP, connect to it.
    with socket.create_server((str(ip), 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection((str(ip), port), timeout=5) as client:
            conn, _ = server.accept()
            with conn:
                client.sendall(b"ping")
                assert conn.recv(4) == b"ping"


def test_a_service_of_fake_pods_gets_their_ready_endpoints_with_its_labels(
    cluster: ClusterHandle, namespace: str
) -> None:
    """As in a real cluster, the EndpointSlice controller lists a fake pod behind a Service
    of it, and the slice carries the Service's labels (a controller watching slices by its
    own label finds them). With loopback pod IPs the controller's writes were refused."""
    _shapes_or_skip(cluster)
    if _pod_cidr(cluster).is_loopback:
        skip_or_fail("loopback pod IPs (not root): Endpoints and EndpointSlices refuse them")
    pod = _pod("backend")
    pod["metadata"]["labels"] = {"app": "backend"}
    cluster.apply(pod, namespace=namespace)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "backend", "labels": {"e2e.vllm-operator.dev/owner": "test"}},
        "spec": {"selector": {"app": "backend"}, "ports": [{"port": 80, "targetPort": 8000}]},
    }
    cluster.apply(service, namespace=namespace)
    cluster.kubectl(
        "wait", "--for=condition=Ready", "pod/backend", "-n", namespace, "--timeout=60s"
    )
    pod_ip = cluster.kubectl_json("get", "pod", "backend", "-n", namespace)["status"]["podIP"]

    def listed() -> list[str]:
        slices = cluster.kubectl_json(
            "get", "endpointslices", "-n", namespace, "-l", "e2e.vllm-operator.dev/owner=test"
        )["items"]
        return ready_addresses(slices, "backend")

    wait_until("the Service's ready endpoint", lambda: listed() == [pod_ip], 60)


def test_readiness_gate_holds_pod_unready_until_its_condition_is_true(
    cluster: ClusterHandle, namespace: str
) -> None:
    cluster.apply(_pod("gated", readinessGates=[{"conditionType": GATE}]), namespace=namespace)
    # The containers run (kwok's start stage has been played) ...
    cluster.kubectl(
        "wait",
        "--for=condition=ContainersReady",
        "pod/gated",
        "-n",
        namespace,
        "--timeout=60s",
    )
    # ... yet the pod is not Ready: a watch for Ready=True must time out.
    held = cluster.kubectl(
        "wait",
        "--for=condition=Ready",
        "pod/gated",
        "-n",
        namespace,
        "--timeout=5s",
        check=False,
    )
    assert held.returncode != 0, "pod became Ready with its readiness gate unmet"
    pod = cluster.kubectl_json("get", "pod", "gated", "-n", namespace)
    ready = condition(pod, "Ready")
    assert ready.get("status") == "False", ready
    assert ready.get("reason") == "ReadinessGatesNotReady"
    assert GATE in ready.get("message", "")
    assert not condition(pod, GATE), "nobody but us may write the gate's condition"

    def set_gate(status: str) -> None:
        patch = {"status": {"conditions": [{"type": GATE, "status": status}]}}
        cluster.kubectl(
            "patch",
            "pod",
            "gated",
            "-n",
            namespace,
            "--subresource=status",
            "--type=strategic",
            "-p",
            json.dumps(patch),
        )

    set_gate("True")
    cluster.kubectl("wait", "--for=condition=Ready", "pod/gated", "-n", namespace, "--timeout=30s")
    # And back: a gate that turns False takes readiness away again, as with a kubelet.
    set_gate("False")
    cluster.kubectl(
        "wait", "--for=condition=Ready=False", "pod/gated", "-n", namespace, "--timeout=30s"
    )


def test_pod_without_gates_becomes_ready(cluster: ClusterHandle, namespace: str) -> None:
    cluster.apply(_pod("plain"), namespace=namespace)
    cluster.kubectl("wait", "--for=condition=Ready", "pod/plain", "-n", namespace, "--timeout=60s")


def test_pod_larger_than_every_node_stays_pending(cluster: ClusterHandle, namespace: str) -> None:
    shapes = _shapes_or_skip(cluster)
    most = max(s.gpu.count for s in shapes if s.gpu is not None)
    pod = _pod("too-big")
    pod["spec"]["containers"][0]["resources"] = {"limits": {fake_nodes.GPU_RESOURCE: str(most + 1)}}
    cluster.apply(pod, namespace=namespace)
    cluster.kubectl(
        "wait",
        "--for=condition=PodScheduled=False",
        "pod/too-big",
        "-n",
        namespace,
        "--timeout=60s",
    )

    def failed_scheduling() -> list[dict[str, Any]]:
        events = cluster.kubectl_json(
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector=involvedObject.name=too-big,reason=FailedScheduling",
        )
        return list(events["items"])

    wait_until("a FailedScheduling event", lambda: bool(failed_scheduling()), timeout_s=60)
    assert f"Insufficient {fake_nodes.GPU_RESOURCE}" in failed_scheduling()[0]["message"]
    got = cluster.kubectl_json("get", "pod", "too-big", "-n", namespace)
    assert got["status"]["phase"] == "Pending"
    assert not got["spec"].get("nodeName")


def test_deleting_a_deployment_removes_its_pods(cluster: ClusterHandle, namespace: str) -> None:
    shapes = {s.name: s for s in _shapes_or_skip(cluster)}
    gpu = shapes["gpu-h100x8"].gpu
    assert gpu is not None
    cluster.apply(
        _gpu_deployment("doomed", replicas=3, product_label=gpu.product_label),
        namespace=namespace,
    )
    cluster.kubectl(
        "wait",
        "--for=condition=Available",
        "deployment/doomed",
        "-n",
        namespace,
        "--timeout=90s",
    )
    pods = cluster.kubectl_json("get", "pods", "-l", "app=doomed", "-n", namespace)["items"]
    assert len(pods) == 3
    # The garbage collector deletes the ReplicaSet, which deletes the pods gracefully;
    # kwok then confirms the containers stopped, as a kubelet would.
    cluster.kubectl("delete", "deployment", "doomed", "-n", namespace, "--wait=false")
    cluster.kubectl(
        "wait",
        "--for=delete",
        *(f"pod/{p['metadata']['name']}" for p in pods),
        "-n",
        namespace,
        "--timeout=90s",
    )
    wait_until(
        "the ReplicaSet to be collected",
        lambda: not cluster.kubectl_json("get", "replicasets", "-n", namespace)["items"],
        timeout_s=60,
    )


def test_job_pod_runs_to_completion(cluster: ClusterHandle, namespace: str) -> None:
    # Warmup and benchmark Jobs need the Job controller and pods that finish.
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "once"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": IMAGE}],
                }
            },
        },
    }
    cluster.apply(job, namespace=namespace)
    cluster.kubectl(
        "wait", "--for=condition=Complete", "job/once", "-n", namespace, "--timeout=60s"
    )
    pods = cluster.kubectl_json("get", "pods", "-l", "job-name=once", "-n", namespace)["items"]
    assert [p["status"]["phase"] for p in pods] == ["Succeeded"]
