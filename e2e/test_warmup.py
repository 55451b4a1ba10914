"""Warmup-gated readiness on the real control plane, with real processes behind the pods:
a CPU vLLM (marked ``vllm``), or a misbehaving server for the failure cases."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from e2e.cluster.cluster import ClusterHandle
from e2e.operator_fixtures import OperatorProcess
from e2e.test_operator import _condition, _get, _wait

GROUP = "inference.vllm-operator.dev"
GATE = f"{GROUP}/warmed-up"
TINY_ARCH = {
    "numLayers": 2,
    "hiddenSize": 256,
    "numAttentionHeads": 4,
    "numKeyValueHeads": 2,
    "headDim": 64,
    "intermediateSize": 512,
    "vocabSize": 512,
    "maxPositionEmbeddings": 2048,
}


def _isvc(name: str, runner: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "name": "tiny-llama",
                "source": {"image": {"path": "/models/tiny-llama"}},
                "architecture": TINY_ARCH,
            },
            "gpu": {"count": 1},
            "workload": {
                "promptTokens": {"type": "Uniform", "min": 16, "max": 128},
                "outputTokens": {"type": "Fixed", "value": 16},
                "peakConcurrency": 4,
            },
            "warmup": {"enabled": True, "timeoutSeconds": 120, "maxRetries": 0},
            "podTemplate": {"annotations": {"e2e.vllm-operator.dev/runner": runner}},
        },
    }
    body["spec"].update(spec)
    return body


def _pods(cluster: ClusterHandle, ns: str, name: str) -> list[dict[str, Any]]:
    found = _get(cluster, ns, "pods", "-l", f"{GROUP}/inference-service={name}")
    return [p for p in (found or {}).get("items", []) if not p["metadata"].get("deletionTimestamp")]


def _jobs(cluster: ClusterHandle, ns: str, name: str) -> list[dict[str, Any]]:
    found = _get(cluster, ns, "jobs", "-l", f"{GROUP}/warmup-for={name}")
    return (found or {}).get("items", [])


def _ready_replicas(cluster: ClusterHandle, ns: str, name: str, n: int) -> dict[str, Any]:
    return _wait(
        lambda: (
            (i := _get(cluster, ns, "isvc", name))
            and i.get("status", {}).get("readyReplicas") == n
            and _condition(i, "Ready").get("status") == "True"
            and i
        ),
        f"{n} ready replicas of {name}",
        timeout=420,
    )


def _ttft(url: str, tag: str) -> float:
    """Seconds to the first streamed token of one chat completion (a prompt of its own, so
    no prefix-cache hit flatters it)."""
    body = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": f"{tag}: hello there, how are you today?"}],
        "max_tokens": 8,
        "stream": True,
    }
    start = time.perf_counter()
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                return time.perf_counter() - start
    raise AssertionError("no token streamed")


@pytest.fixture(scope="module")
def served(
    operator_process: OperatorProcess,
    pod_runner: int,
) -> Iterator[tuple[ClusterHandle, str]]:
    """A tiny-llama service on a real CPU vLLM, in a namespace of its own."""
    cluster = operator_process.cluster
    ns = f"e2e-warmup-{int(time.time()) % 100000}"
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", ns, "--timeout=60s")
    cluster.apply(_isvc("tiny", "vllm"), namespace=ns)
    yield cluster, ns
    cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    cluster.kubectl(
        "delete", "pods", "--all", "-n", ns, "--wait=true", "--timeout=60s", check=False
    )


@pytest.mark.vllm
def test_a_pod_becomes_ready_only_after_its_warmup(served: tuple[ClusterHandle, str]) -> None:
    cluster, ns = served
    isvc = _ready_replicas(cluster, ns, "tiny", 1)
    [pod] = _pods(cluster, ns, "tiny")
    conds = {c["type"]: c for c in pod["status"]["conditions"]}
    assert conds[GATE]["status"] == "True" and conds[GATE]["reason"] == "WarmedUp"
    # Ready followed the gate, which followed the server answering /health.
    assert conds["ContainersReady"]["lastTransitionTime"] <= conds[GATE]["lastTransitionTime"]
    assert conds[GATE]["lastTransitionTime"] <= conds["Ready"]["lastTransitionTime"]
    [job] = _jobs(cluster, ns, "tiny")
    assert job["metadata"]["name"] in conds[GATE]["message"]
    assert job["status"].get("succeeded") == 1
    assert job["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    warm = isvc["status"]["warmup"]
    assert warm["lastColdTtftMilliseconds"] > 0 and warm["lastWarmTtftMilliseconds"] > 0
    assert _condition(isvc, "WarmedUp")["status"] == "True"


@pytest.mark.vllm
def test_the_first_request_after_ready_is_served_warm(served: tuple[ClusterHandle, str]) -> None:
    cluster, ns = served
    isvc = _ready_replicas(cluster, ns, "tiny", 1)
    status_warm_ms = isvc["status"]["warmup"]["lastWarmTtftMilliseconds"]
    [pod] = _pods(cluster, ns, "tiny")
    url = f"http://{pod['status']['podIP']}:8000/v1/chat/completions"
    # The warm median is measured here too, by the same client under the same load on
    # this shared machine, so the two numbers compare like with like.
    first_ms = _ttft(url, "first") * 1000
    after = sorted(_ttft(url, f"later {i}") * 1000 for i in range(7))
    warm_ms = after[len(after) // 2]
    print(
        f"first request after Ready: TTFT {first_ms:.1f} ms; warm median {warm_ms:.1f} ms "
        f"(the warmup reported {status_warm_ms} ms)"
    )
    assert first_ms <= 1.5 * warm_ms, f"first TTFT {first_ms:.1f} ms vs warm {warm_ms:.1f} ms"


@pytest.mark.vllm
def test_scaling_up_warms_only_the_new_pod(served: tuple[ClusterHandle, str]) -> None:
    cluster, ns = served
    _ready_replicas(cluster, ns, "tiny", 1)
    [first_job] = [j["metadata"]["name"] for j in _jobs(cluster, ns, "tiny")]
    cluster.kubectl("scale", "isvc", "tiny", "-n", ns, "--replicas=2")
    _ready_replicas(cluster, ns, "tiny", 2)
    jobs = sorted(j["metadata"]["name"] for j in _jobs(cluster, ns, "tiny"))
    assert len(jobs) == 2 and first_job in jobs, jobs
    gates = sorted(
        next(c for c in p["status"]["conditions"] if c["type"] == GATE)["message"]
        for p in _pods(cluster, ns, "tiny")
    )
    assert all(any(j in g for g in gates) for j in jobs), "each pod warmed by its own Job"


def test_a_failing_warmup_keeps_the_pod_out_with_the_reason(
    operator_process: OperatorProcess,
    pod_runner: int,
    namespace: str,
) -> None:
    cluster = operator_process.cluster
    cluster.apply(
        _isvc(
            "broken", "fake-fail", warmup={"enabled": True, "timeoutSeconds": 20, "maxRetries": 0}
        ),
        namespace=namespace,
    )
    isvc = _wait(
        lambda: (
            (i := _get(cluster, namespace, "isvc", "broken"))
            and _condition(i, "WarmedUp").get("reason") == "WarmupFailed"
            and i
        ),
        "WarmedUp=False with WarmupFailed",
        timeout=120,
    )
    assert _condition(isvc, "Ready")["status"] == "False"
    assert _condition(isvc, "Ready")["reason"] == "WarmupFailed"
    assert (
        "500" in _condition(isvc, "WarmedUp")["message"]
        or "Error" in _condition(isvc, "WarmedUp")["message"]
    )
    [pod] = _pods(cluster, namespace, "broken")
    conds = {c["type"]: c for c in pod["status"]["conditions"]}
    assert conds["ContainersReady"]["status"] == "True", "the server answers /health"
    assert conds[GATE]["status"] == "False" and conds[GATE]["reason"] == "WarmupFailed"
    assert conds["Ready"]["status"] == "False"


def test_deleting_a_pod_mid_warmup_leaves_no_job(
    operator_process: OperatorProcess,
    pod_runner: int,
    namespace: str,
) -> None:
    cluster = operator_process.cluster
    cluster.apply(_isvc("slow", "fake-slow"), namespace=namespace)
    [job] = _wait(lambda: _jobs(cluster, namespace, "slow"), "a warmup Job", timeout=120)
    pod_name = job["metadata"]["ownerReferences"][0]["name"]
    cluster.kubectl("delete", "pod", pod_name, "-n", namespace, "--wait=true", "--timeout=60s")
    _wait(
        lambda: (
            job["metadata"]["name"]
            not in [j["metadata"]["name"] for j in _jobs(cluster, namespace, "slow")]
        ),
        "the Job of the deleted pod to be gone",
        timeout=60,
    )
    leftovers = json.loads(cluster.kubectl("get", "jobs", "-n", namespace, "-o", "json").stdout)[
        "items"
    ]
    owners = {j["metadata"]["ownerReferences"][0]["name"] for j in leftovers}
    assert pod_name not in owners


def test_an_operator_restart_mid_warmup_neither_skips_nor_repeats_it(
    operator_process: OperatorProcess,
    pod_runner: int,
    namespace: str,
) -> None:
    cluster = operator_process.cluster
    if not operator_process.alive():
        operator_process.start()
    cluster.apply(_isvc("slow", "fake-slow"), namespace=namespace)
    [job] = _wait(lambda: _jobs(cluster, namespace, "slow"), "a warmup Job", timeout=120)
    operator_process.stop(kill=True)
    operator_process.start()
    isvc = _wait(
        lambda: (
            (i := _get(cluster, namespace, "isvc", "slow"))
            and _condition(i, "Ready").get("status") == "True"
            and i
        ),
        "Ready after the restart",
        timeout=180,
    )
    jobs = _jobs(cluster, namespace, "slow")
    assert [j["metadata"]["name"] for j in jobs] == [job["metadata"]["name"]], "one Job only"
    assert jobs[0]["status"].get("succeeded") == 1, "the gate opened only after it succeeded"
    assert _condition(isvc, "WarmedUp")["status"] == "True"
