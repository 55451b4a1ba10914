"""Warmup-gated readiness through the real kubelet, with the operator as the chart's pod
(``chart_operator``) and misbehaving servers as the pods' containers.

The servers are containers of the fault-server image (devenv/images/fault-server): the
operator renders its usual ``vllm serve`` arguments, the image answers ``/health``
(so the kubelet's probes pass) and generates in the mode the service's environment
picks: ``ok``, ``slow`` (0.4 s to each first token, so a warmup takes a while) or
``fail`` (every generation answers 500). A real CPU vLLM's warmup, gate and TTFT are in
e2e/test_real_node.py; this module is about what the operator does around the kubelet:
scale-up, failed warmups, a pod deleted mid-warmup, an operator restarted mid-warmup,
a server container that crashed and was restarted by the kubelet, and Ready's promise: the
first request through the Service the instant Ready turns True is served.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from devenv.cluster import node
from devenv.cluster.cluster import ClusterHandle
from devenv.cluster.images import Images
from devenv.cluster.processes import wait_until
from devenv.dev import service_url
from e2e.framework import condition, fault_isvc
from e2e.real_node_fixtures import ChartOperator
from vllm_operator.constants import LABEL_SERVICE, LABEL_WARMUP_FOR
from vllm_operator.constants import WARMED_UP_CONDITION as GATE


def _servers(cluster: ClusterHandle, ns: str, name: str) -> list[dict[str, Any]]:
    pods = cluster.kubectl_json("get", "pods", "-n", ns, "-l", f"{LABEL_SERVICE}={name}")
    return [
        p
        for p in pods["items"]
        if LABEL_WARMUP_FOR not in p["metadata"]["labels"]
        and not p["metadata"].get("deletionTimestamp")
    ]


def _jobs(cluster: ClusterHandle, ns: str, name: str) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "jobs", "-n", ns, "-l", f"{LABEL_WARMUP_FOR}={name}"
    )["items"]
    return jobs


def _isvc_now(cluster: ClusterHandle, ns: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = cluster.kubectl_json("get", "vis", name, "-n", ns)
    return got


def _ready_replicas(cluster: ClusterHandle, ns: str, name: str, n: int) -> dict[str, Any]:
    def ready() -> bool:
        isvc = _isvc_now(cluster, ns, name)
        return (
            isvc.get("status", {}).get("readyReplicas") == n
            and condition(isvc, "Ready").get("status") == "True"
        )

    wait_until(f"{n} ready replicas of {name}", ready, 180)
    return _isvc_now(cluster, ns, name)


@pytest.fixture
def fault_ns(chart_operator: ChartOperator, real_namespace: Callable[..., str]) -> str:
    return real_namespace()  # restricted, as every pod the operator renders passes it


def test_a_pod_becomes_ready_after_its_warmup_and_scaling_up_warms_only_the_new_one(
    cluster: ClusterHandle, real_images: Images, fault_ns: str
) -> None:
    ns = fault_ns
    cluster.apply(fault_isvc("svc", "ok", real_images.fault_server), namespace=ns)
    isvc = _ready_replicas(cluster, ns, "svc", 1)
    [pod] = _servers(cluster, ns, "svc")
    assert pod["spec"]["nodeName"] == node.NODE_NAME
    assert pod["spec"]["containers"][0]["image"] == real_images.fault_server
    conds = {c["type"]: c for c in pod["status"]["conditions"]}
    assert conds[GATE]["status"] == "True" and conds[GATE]["reason"] == "WarmedUp"
    assert (
        conds["ContainersReady"]["lastTransitionTime"]
        <= conds[GATE]["lastTransitionTime"]
        <= conds["Ready"]["lastTransitionTime"]
    )
    [job] = _jobs(cluster, ns, "svc")
    assert job["metadata"]["name"] in conds[GATE]["message"]
    assert job["status"].get("succeeded") == 1
    assert job["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    assert condition(isvc, "WarmedUp")["status"] == "True"

    cluster.kubectl("scale", "vis", "svc", "-n", ns, "--replicas=2")
    _ready_replicas(cluster, ns, "svc", 2)
    jobs = sorted(j["metadata"]["name"] for j in _jobs(cluster, ns, "svc"))
    assert len(jobs) == 2 and job["metadata"]["name"] in jobs, jobs
    gates = [condition(p, GATE)["message"] for p in _servers(cluster, ns, "svc")]
    assert all(any(j in g for g in gates) for j in jobs), "each pod warmed by its own Job"


def test_a_failing_warmup_keeps_the_pod_out_with_the_reason(
    cluster: ClusterHandle, real_images: Images, fault_ns: str
) -> None:
    ns = fault_ns
    warmup = {"enabled": True, "timeoutSeconds": 20, "maxRetries": 0}
    cluster.apply(
        fault_isvc("broken", "fail", real_images.fault_server, warmup=warmup), namespace=ns
    )
    wait_until(
        "WarmedUp=False with WarmupFailed",
        lambda: (
            condition(_isvc_now(cluster, ns, "broken"), "WarmedUp").get("reason") == "WarmupFailed"
        ),
        120,
    )
    isvc = _isvc_now(cluster, ns, "broken")
    assert condition(isvc, "Ready")["status"] == "False"
    assert condition(isvc, "Ready")["reason"] == "WarmupFailed"
    message = condition(isvc, "WarmedUp")["message"]
    assert "500" in message or "Error" in message, message
    [pod] = _servers(cluster, ns, "broken")
    conds = {c["type"]: c for c in pod["status"]["conditions"]}
    assert conds["ContainersReady"]["status"] == "True", "the kubelet's probe passes /health"
    assert conds[GATE]["status"] == "False" and conds[GATE]["reason"] == "WarmupFailed"
    assert conds["Ready"]["status"] == "False"
    # Out of the Service: the gate keeps the address out of its endpoints.
    slices = cluster.kubectl_json(
        "get", "endpointslices", "-n", ns, "-l", "kubernetes.io/service-name=broken"
    )["items"]
    ready = [e for s in slices for e in s.get("endpoints") or [] if e["conditions"].get("ready")]
    assert not ready, ready


def test_deleting_a_pod_mid_warmup_leaves_no_job(
    cluster: ClusterHandle, real_images: Images, fault_ns: str
) -> None:
    ns = fault_ns
    cluster.apply(fault_isvc("slow", "slow", real_images.fault_server), namespace=ns)
    wait_until("a warmup Job", lambda: bool(_jobs(cluster, ns, "slow")), 120)
    [job] = _jobs(cluster, ns, "slow")
    pod_name = job["metadata"]["ownerReferences"][0]["name"]
    cluster.kubectl("delete", "pod", pod_name, "-n", ns, "--wait=true", "--timeout=90s",
                    timeout=100)  # fmt: skip
    wait_until(
        "the Job of the deleted pod to be gone",
        lambda: (
            job["metadata"]["name"]
            not in [j["metadata"]["name"] for j in _jobs(cluster, ns, "slow")]
        ),
        60,
    )
    owners = {
        j["metadata"]["ownerReferences"][0]["name"]
        for j in cluster.kubectl_json("get", "jobs", "-n", ns)["items"]
    }
    assert pod_name not in owners


def test_an_operator_crash_mid_warmup_neither_skips_nor_repeats_it(
    cluster: ClusterHandle, real_images: Images, chart_operator: ChartOperator, fault_ns: str
) -> None:
    ns = fault_ns
    cluster.apply(fault_isvc("slow", "slow", real_images.fault_server), namespace=ns)
    wait_until("a warmup Job", lambda: bool(_jobs(cluster, ns, "slow")), 120)
    [job] = _jobs(cluster, ns, "slow")
    chart_operator.process.stop(kill=True)  # SIGKILL on the node; the kubelet restarts it
    chart_operator.process.start()
    isvc = _ready_replicas(cluster, ns, "slow", 1)
    jobs = _jobs(cluster, ns, "slow")
    assert [j["metadata"]["name"] for j in jobs] == [job["metadata"]["name"]], "one Job only"
    assert jobs[0]["status"].get("succeeded") == 1, "the gate opened only after it succeeded"
    assert condition(isvc, "WarmedUp")["status"] == "True"


def test_a_server_container_restarted_by_the_kubelet_is_warmed_again(
    cluster: ClusterHandle, real_images: Images, fault_ns: str
) -> None:
    ns = fault_ns
    cluster.apply(fault_isvc("svc", "ok", real_images.fault_server), namespace=ns)
    _ready_replicas(cluster, ns, "svc", 1)
    [pod] = _servers(cluster, ns, "svc")
    [first] = [j["metadata"]["name"] for j in _jobs(cluster, ns, "svc")]
    assert cluster.settings is not None
    node.kill_container(cluster.settings, pod["status"]["containerStatuses"][0]["containerID"])

    def warmed_again() -> bool:
        [now] = _servers(cluster, ns, "svc")
        status = now["status"]["containerStatuses"][0]
        gate = condition(now, GATE)
        return (
            status["restartCount"] == 1
            and gate.get("status") == "True"
            and first not in gate.get("message", "")
        )

    wait_until("the restarted container warmed by a new Job", warmed_again, 180)
    [now] = _servers(cluster, ns, "svc")
    assert now["metadata"]["uid"] == pod["metadata"]["uid"], "the same pod, restarted in place"
    jobs = {j["metadata"]["name"]: j for j in _jobs(cluster, ns, "svc")}
    assert len(jobs) == 2 and first in jobs, sorted(jobs)
    [second] = [name for name in jobs if name != first]
    assert second in condition(now, GATE)["message"]
    assert jobs[second]["status"].get("succeeded") == 1
    assert condition(_isvc_now(cluster, ns, "svc"), "Ready")["status"] == "True"


# How many services the Ready-then-request test brings up in turn (20 for the figure in
# the closing note of issue 35; 3 in CI, to keep the cluster tier's time).
READY_SERVICES = int(os.environ.get("VLLM_OP_READY_SERVICES", "3"))


def _first_ready(watch: subprocess.Popen[str], deadline: float) -> float:
    """Read the watch's lines (one Ready status per event) until one says True; the
    monotonic time it was read."""
    assert watch.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(watch.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=deadline - time.monotonic()):
                break
            line = watch.stdout.readline()
            if not line:
                break
            if line.strip() == "True":
                return time.monotonic()
    raise AssertionError("Ready never turned True within the deadline")


def test_the_first_request_the_instant_ready_turns_true_is_served(
    cluster: ClusterHandle, real_images: Images, fault_ns: str
) -> None:
    """Ready=True promises that the first request through the Service is served. For each
    of READY_SERVICES services in turn, a `kubectl get --watch` reports the instant Ready
    turns True, and one request goes through the ClusterIP then: no retry and no /health
    poll before it, as a user's `kubectl wait` and a client would do."""
    ns = fault_ns
    refused: list[str] = []
    answered_ms: list[float] = []
    jsonpath = '{.status.conditions[?(@.type=="Ready")].status}{"\\n"}'
    for i in range(READY_SERVICES):
        name = f"ready-{i}"
        cluster.apply(fault_isvc(name, "ok", real_images.fault_server), namespace=ns)
        watch = subprocess.Popen(
            [str(cluster.kubectl_path), f"--kubeconfig={cluster.kubeconfig}", "get", "vis",
             name, "-n", ns, "--watch", "-o", f"jsonpath={jsonpath}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=cluster.env(),
        )  # fmt: skip
        try:
            _first_ready(watch, time.monotonic() + 180)
            url = service_url(cluster, ns, name)
            body = {"model": "fake-model", "prompt": "hello", "max_tokens": 4}
            started = time.monotonic()
            try:
                answer = httpx.post(f"{url}/v1/completions", json=body, timeout=10)
                if answer.status_code != 200:
                    refused.append(f"{name}: HTTP {answer.status_code}")
                else:
                    answered_ms.append((time.monotonic() - started) * 1000)
            except httpx.HTTPError as exc:
                refused.append(f"{name}: {type(exc).__name__} {exc}")
        finally:
            watch.kill()
            watch.wait()
        # One server at a time: the node's two cores hold one such pod beside the rest.
        cluster.kubectl("delete", "vis", name, "-n", ns, "--wait=true", timeout=180)
        wait_until(f"{name}'s pods gone", lambda n=name: not _servers(cluster, ns, n), 120)
    print(
        f"\nReady-then-request: {READY_SERVICES} services, {len(refused)} refused; answered "
        f"in {sorted(round(ms, 1) for ms in answered_ms)} ms"
    )
    assert not refused, refused
