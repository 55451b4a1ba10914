"""The operator on the real control plane: children, readiness, drift, deletion, stalls,
scaling, and restarts. The operator runs as a local process (``vllm-operator run``)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from devenv.cluster.cluster import ClusterHandle
from e2e.framework import (
    GROUP,
    condition,
    fetch,
    gpu_isvc,
    lock_job,
    ready_addresses,
    wait_for,
)
from e2e.operator_fixtures import OperatorProcess


def _await_pass(op: OperatorProcess, ns: str, name: str, mark: Any, timeout: float = 120) -> None:
    """Wait for a reconcile pass of ``ns/name`` that ended after ``mark`` (a position in
    the operator's log): the debug line the operator writes after each pass."""
    line = f"Reconciled InferenceService {ns}/{name}:"
    wait_for(lambda: line in op.log_since(mark), f"a reconcile pass of {ns}/{name}", timeout)


def _wait_ready(cluster: ClusterHandle, ns: str, name: str, timeout: int = 90) -> None:
    cluster.kubectl(
        "wait",
        "--for=condition=Ready",
        f"vis/{name}",
        "-n",
        ns,
        f"--timeout={timeout}s",
        timeout=timeout + 10,
    )


@pytest.fixture
def op(operator_process: OperatorProcess) -> OperatorProcess:
    if not operator_process.alive():
        operator_process.start()
    return operator_process


def test_a_service_gets_owned_children_and_becomes_ready(
    op: OperatorProcess, namespace: str
) -> None:
    cluster = op.cluster
    cluster.apply(gpu_isvc("chat"), namespace=namespace)
    _wait_ready(cluster, namespace, "chat")
    isvc = fetch(cluster, namespace, "vis", "chat")
    assert isvc is not None
    uid = isvc["metadata"]["uid"]
    for kind in ("deployment", "service", "poddisruptionbudget"):
        child = fetch(cluster, namespace, kind, "chat")
        assert child is not None, f"{kind} chat was not created"
        owners = child["metadata"]["ownerReferences"]
        assert owners == [
            {
                "apiVersion": f"{GROUP}/v1alpha1",
                "kind": "InferenceService",
                "name": "chat",
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    pods = fetch(cluster, namespace, "pods", "-l", f"{GROUP}/inference-service=chat")
    assert pods is not None
    assert [p["spec"]["nodeName"] for p in pods["items"]] == ["gpu-4090x2"]
    # Ready came only once the Service routes to the pod: its EndpointSlice (found by the
    # label the controller copied from the Service) lists the pod's address as ready.
    slices = fetch(cluster, namespace, "endpointslices", "-l", f"{GROUP}/inference-service=chat")
    assert slices is not None
    assert ready_addresses(slices["items"], "chat") == [pods["items"][0]["status"]["podIP"]]
    status = isvc["status"]
    assert status["observedGeneration"] == isvc["metadata"]["generation"]
    assert status["readyReplicas"] == 1
    assert status["endpoint"] == f"http://chat.{namespace}.svc:8000/v1"
    header, row = (line.split() for line in cluster.kubectl("get", "vis", "chat", "-n",
                   namespace).stdout.splitlines())  # fmt: skip
    assert dict(zip(header, row, strict=True))["MODEL"] == status["servedModelName"]
    assert status["tuning"]["plannedBy"] in ("SpecOnly", "Tuner")


def test_a_spec_change_rolls_out_and_observed_generation_follows(
    op: OperatorProcess, namespace: str
) -> None:
    cluster = op.cluster
    cluster.apply(gpu_isvc("chat"), namespace=namespace)
    _wait_ready(cluster, namespace, "chat")
    before = fetch(cluster, namespace, "deployment", "chat")
    assert before is not None
    cluster.kubectl(
        "patch",
        "vis",
        "chat",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"tuning": {"overrides": {"max-model-len": "2048"}}}}),
    )

    def rolled() -> bool:
        dep = fetch(cluster, namespace, "deployment", "chat") or {}
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        return (
            "--max-model-len" in args
            and dep["metadata"]["generation"] > before["metadata"]["generation"]
        )

    wait_for(rolled, "the Deployment to carry the override")
    isvc = wait_for(
        lambda: (
            (i := fetch(cluster, namespace, "vis", "chat"))
            and i["status"]["observedGeneration"] == i["metadata"]["generation"]
            and condition(i, "Ready").get("status") == "True"
            and i
        ),
        "observedGeneration to follow and Ready to return",
    )
    args = {a["name"]: a for a in isvc["status"]["tuning"]["arguments"]}
    assert args["max-model-len"]["source"] == "Override"


def test_children_edited_or_deleted_by_hand_are_restored(
    op: OperatorProcess, namespace: str
) -> None:
    cluster = op.cluster
    cluster.apply(gpu_isvc("chat"), namespace=namespace)
    _wait_ready(cluster, namespace, "chat")

    def image() -> str | None:
        dep = fetch(cluster, namespace, "deployment", "chat") or {}
        containers = dep.get("spec", {}).get("template", {}).get("spec", {}).get("containers")
        return str(containers[0]["image"]) if containers else None

    rendered = image()  # the operator's default serving image
    assert rendered and rendered != "evil:latest"
    cluster.kubectl(
        "patch",
        "deployment",
        "chat",
        "-n",
        namespace,
        "--type=json",
        "-p",
        json.dumps(
            [
                {
                    "op": "replace",
                    "path": "/spec/template/spec/containers/0/image",
                    "value": "evil:latest",
                }
            ]
        ),
    )
    wait_for(lambda: image() == rendered, "the image to be restored")
    cluster.kubectl("delete", "service", "chat", "-n", namespace)
    wait_for(lambda: fetch(cluster, namespace, "service", "chat"), "the Service to be recreated")
    cluster.kubectl("delete", "pdb", "chat", "-n", namespace)
    wait_for(lambda: fetch(cluster, namespace, "pdb", "chat"), "the PDB to be recreated")


@pytest.mark.parametrize("running", [True, False], ids=["operator running", "operator stopped"])
def test_deleting_the_service_garbage_collects_its_children(
    op: OperatorProcess, namespace: str, running: bool
) -> None:
    cluster = op.cluster
    cluster.apply(gpu_isvc("chat"), namespace=namespace)
    _wait_ready(cluster, namespace, "chat")
    if not running:
        op.stop()
    try:
        cluster.kubectl("delete", "vis", "chat", "-n", namespace, "--wait=true", "--timeout=30s")
        for kind in ("deployment", "service", "pdb"):
            wait_for(lambda k=kind: fetch(cluster, namespace, k, "chat") is None, f"{kind} to go")
        wait_for(
            lambda: not (fetch(cluster, namespace, "pods") or {"items": [1]})["items"],
            "the pods to go",
        )
    finally:
        if not running:
            op.start()


def test_an_unsatisfiable_spec_stalls_without_a_retry_storm(
    op: OperatorProcess, namespace: str
) -> None:
    cluster = op.cluster
    huge = gpu_isvc("huge", gpu={"count": 16})
    huge["spec"]["model"] = {"source": {"huggingFace": {"repo": "meta-llama/Llama-3.1-8B"}}}
    cluster.apply(huge, namespace=namespace)
    stalled = wait_for(
        lambda: (
            condition(fetch(cluster, namespace, "vis", "huge"), "Stalled").get("status") == "True"
            and condition(fetch(cluster, namespace, "vis", "huge"), "Stalled")
        ),
        "Stalled=True",
    )
    assert stalled["reason"] == "NotEnoughGPUs"
    assert "16 GPUs" in stalled["message"]
    ready = condition(fetch(cluster, namespace, "vis", "huge"), "Ready")
    assert ready["status"] == "False" and ready["reason"] == "NotEnoughGPUs"
    assert fetch(cluster, namespace, "deployment", "huge") is None, "nothing that cannot run"
    # Over the next reconcile pass (a resync's) the object is left alone: one event,
    # status unchanged.
    first = fetch(cluster, namespace, "vis", "huge")
    _await_pass(op, namespace, "huge", op.log_mark())
    again = fetch(cluster, namespace, "vis", "huge")
    assert first and again
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    events = fetch(cluster, namespace, "events", "--field-selector", "involvedObject.name=huge")
    assert events is not None
    reasons = [e["reason"] for e in events["items"]]
    if reasons.count("NotEnoughGPUs") != 1:
        # Seen in full runs only (twice, 2026-11-30): say which operators were running.
        procs = subprocess.run(
            ["pgrep", "-af", "vllm_operator.cli run"], capture_output=True, text=True
        ).stdout
        raise AssertionError(f"{reasons}; operator processes:\n{procs}")


def test_an_internal_error_that_repeats_stalls_the_service_and_clears_after_a_change(
    op: OperatorProcess, namespace: str
) -> None:
    """A validating webhook that cannot be reached (a loopback port nothing listens on,
    failurePolicy Fail) makes the apiserver answer 500 to every Deployment write in the
    namespace: transient at first, reported as ApiServerError after five passes, and a
    change after the webhook is gone reconciles as usual."""
    cluster = op.cluster
    webhook = f"e2e-refused-{namespace}"
    hook = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": webhook},
        "webhooks": [
            {
                "name": "refused.e2e.vllm-operator.dev",
                "clientConfig": {"url": "https://127.0.0.1:1/validate"},
                "rules": [
                    {
                        "apiGroups": ["apps"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["deployments"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 2,
            }
        ],
    }
    cluster.apply(hook)
    try:
        cluster.apply(gpu_isvc("hooked"), namespace=namespace)
        stalled = wait_for(
            lambda: (
                (c := condition(fetch(cluster, namespace, "vis", "hooked"), "Stalled")).get(
                    "reason"
                )
                == "ApiServerError"
                and c
            ),
            "Stalled=True, ApiServerError",
            timeout=90,
        )
        assert stalled["status"] == "True"
        assert "5 times in a row" in stalled["message"]
        assert "failed calling webhook" in stalled["message"], stalled["message"]
        assert fetch(cluster, namespace, "deployment", "hooked") is None
    finally:
        cluster.kubectl("delete", "validatingwebhookconfiguration", webhook, check=False)
    cluster.kubectl("annotate", "vis", "hooked", "-n", namespace, "e2e/touched=1")
    _wait_ready(cluster, namespace, "hooked")


def test_kubectl_scale_changes_the_replicas(op: OperatorProcess, namespace: str) -> None:
    cluster = op.cluster
    cluster.apply(gpu_isvc("chat"), namespace=namespace)
    _wait_ready(cluster, namespace, "chat")
    cluster.kubectl("scale", "vis", "chat", "-n", namespace, "--replicas=2")
    wait_for(
        lambda: (
            (fetch(cluster, namespace, "deployment", "chat") or {}).get("spec", {}).get("replicas")
            == 2
        ),
        "the Deployment to have 2 replicas",
    )
    wait_for(
        lambda: (
            (i := fetch(cluster, namespace, "vis", "chat"))
            and i["status"].get("readyReplicas") == 2
            and condition(i, "Ready").get("status") == "True"
        ),
        "two ready replicas",
    )
    scale = json.loads(
        cluster.kubectl(
            "get",
            "--raw",
            f"/apis/{GROUP}/v1alpha1/namespaces/{namespace}/inferenceservices/chat/scale",
        ).stdout
    )
    assert scale["spec"]["replicas"] == 2 and scale["status"]["replicas"] == 2
    assert scale["status"]["selector"] == f"{GROUP}/inference-service=chat"


def test_a_restart_mid_reconcile_leaves_no_twins_and_no_rollout(
    op: OperatorProcess, namespace: str
) -> None:
    cluster = op.cluster
    cluster.apply(gpu_isvc("chat"), namespace=namespace)
    # Killed mid-reconcile: once its first child exists, before the rest and the status.
    wait_for(lambda: fetch(cluster, namespace, "deployment", "chat"), "the first child", timeout=60)
    op.stop(kill=True)
    op.start()
    _wait_ready(cluster, namespace, "chat")
    dep = fetch(cluster, namespace, "deployment", "chat")
    assert dep is not None
    generation = dep["metadata"]["generation"]
    rs_before = fetch(cluster, namespace, "replicasets")
    assert rs_before is not None and len(rs_before["items"]) == 1
    # A second restart with everything converged must change nothing.
    op.stop(kill=True)
    mark = op.log_mark()
    op.start()
    isvc = fetch(cluster, namespace, "vis", "chat")
    assert isvc is not None
    # The restarted operator's first pass over the service (its start lists every object).
    _await_pass(op, namespace, "chat", mark)
    dep_after = fetch(cluster, namespace, "deployment", "chat")
    assert dep_after is not None
    assert dep_after["metadata"]["generation"] == generation, "an unchanged Deployment rolled out"
    deployments = fetch(cluster, namespace, "deployments")
    assert deployments is not None and len(deployments["items"]) == 1
    replicasets = fetch(cluster, namespace, "replicasets")
    assert replicasets is not None and len(replicasets["items"]) == 1
    services = fetch(cluster, namespace, "services")
    assert services is not None and len(services["items"]) == 1


def test_an_hpa_scales_the_service_through_its_scale_subresource(
    op: OperatorProcess, namespace: str
) -> None:
    cluster = op.cluster
    cluster.apply(gpu_isvc("chat"), namespace=namespace)
    _wait_ready(cluster, namespace, "chat")
    # Below minReplicas the HPA controller raises the target to the minimum without any
    # metric (there is no metrics-server here): enough to show it drives our scale.
    cluster.apply(
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "chat"},
            "spec": {
                "scaleTargetRef": {
                    "apiVersion": f"{GROUP}/v1alpha1",
                    "kind": "InferenceService",
                    "name": "chat",
                },
                "minReplicas": 2,
                "maxReplicas": 3,
                "metrics": [
                    {
                        "type": "Resource",
                        "resource": {
                            "name": "cpu",
                            "target": {"type": "Utilization", "averageUtilization": 80},
                        },
                    }
                ],
            },
        },
        namespace=namespace,
    )
    wait_for(
        lambda: (
            (fetch(cluster, namespace, "vis", "chat") or {}).get("spec", {}).get("replicas") == 2
        ),
        "the HPA to set spec.replicas to 2",
        timeout=90,
    )
    wait_for(
        lambda: (
            (fetch(cluster, namespace, "deployment", "chat") or {}).get("spec", {}).get("replicas")
            == 2
        ),
        "the Deployment to follow",
    )


def test_hpa_mode_hands_the_real_hpa_controller_the_scale_subresource_and_the_lock(
    op: OperatorProcess, namespace: str
) -> None:
    """Autoscaling's HPA mode: the real HPA controller of kube-controller-manager takes the
    rendered HorizontalPodAutoscaler (it reads the InferenceService's scale subresource),
    and a benchmark's lock turns its scale-down off."""
    cluster, ns = op.cluster, namespace
    cluster.apply(
        {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "hpa"},
            "spec": {
                "model": {"name": "fake", "source": {"image": {"path": "/models/fake"}}},
                "replicas": 1,
                "gpu": {"count": 1},
                "warmup": {"enabled": False},
                "autoscaling": {
                    "enabled": True,
                    "mode": "HPA",
                    "metric": "RequestsWaiting",
                    "target": "0.5",
                    "periodSeconds": 2,
                },
            },
        },
        namespace=ns,
    )

    def hpa_condition(type_: str) -> dict[str, Any]:
        return condition(fetch(cluster, ns, "hpa", "hpa"), type_)

    # The real HPA controller read the InferenceService's scale subresource ...
    wait_for(lambda: hpa_condition("AbleToScale").get("status") == "True", "AbleToScale", 90)
    # ... and, with no metrics adapter in this cluster, says it cannot get the metric.
    active = wait_for(lambda: hpa_condition("ScalingActive") or None, "ScalingActive", 90)
    assert "vllm_num_requests_waiting" in active.get("message", ""), active
    hpa = fetch(cluster, ns, "hpa", "hpa")
    assert hpa is not None
    assert hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] in ("500m", "0.5")
    assert hpa["spec"]["behavior"]["scaleDown"]["selectPolicy"] == "Max"
    wait_for(
        lambda: ((fetch(cluster, ns, "vis", "hpa") or {}).get("status", {}).get("autoscaling")
                 or {}).get("horizontalPodAutoscaler") == "hpa",
        "status.autoscaling to name the HPA",
        30,
    )  # fmt: skip

    # A benchmark's lock (its load Job) turns the HPA's scale-down off, and back on after.
    cluster.apply(lock_job("hpa"), namespace=ns)

    def select_policy() -> str:
        found = fetch(cluster, ns, "hpa", "hpa") or {}
        return str(found["spec"]["behavior"]["scaleDown"]["selectPolicy"])

    wait_for(lambda: fetch(cluster, ns, "job", "lock", ) and select_policy() == "Disabled",
          "scale-down Disabled", 60)  # fmt: skip
    cluster.kubectl("delete", "job", "lock", "-n", ns)
    wait_for(lambda: select_policy() == "Max", "scale-down back on", 60)
    # Autoscaling off: the HPA goes.
    cluster.kubectl(
        "patch", "vis", "hpa", "-n", ns, "--type=merge",
        "-p", '{"spec": {"autoscaling": {"enabled": false}}}',
    )  # fmt: skip
    wait_for(lambda: fetch(cluster, ns, "hpa", "hpa") is None, "the HPA to go", 60)
