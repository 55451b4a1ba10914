"""InferenceBenchmark on the real control plane: the load Job runs against a target whose
pods are real (fake, fast) servers, and while it runs no path may lower the replicas.
Against a real CPU vLLM (marked ``vllm``): a benchmark that waits for its dataset
ConfigMap, reads its prompts from it, and leaves every request in its results ConfigMap,
written by the load Job under its own ServiceAccount."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster.cluster import ClusterHandle
from e2e.operator_fixtures import OperatorProcess
from e2e.test_operator import _condition, _get, _wait
from e2e.test_warmup import _isvc
from e2e.vllm_fixtures import require_vllm_python
from vllm_operator.bench.archive import unpack

GROUP = "inference.vllm-operator.dev"
REPO = Path(__file__).parents[1]


def _target(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "fake", "source": {"image": {"path": "/models/fake"}}},
            "replicas": replicas,
            "gpu": {"count": 1},
            "warmup": {"enabled": False},
            "podTemplate": {"annotations": {"e2e.vllm-operator.dev/runner": "fake-slow"}},
        },
    }


def _bench(name: str, target: str, seconds: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "InferenceBenchmark",
        "metadata": {"name": name},
        "spec": {
            "targetRef": {"name": target},
            "workload": {
                "promptTokens": {"type": "Fixed", "value": 16},
                "outputTokens": {"type": "Fixed", "value": 4},
            },
            "arrival": {"process": "Poisson", "ratePerSecond": 2},
            "durationSeconds": seconds,
            "endpoint": {"api": "Completions", "stream": True},
            "seed": 1,
        },
    }


def _phase(cluster: ClusterHandle, ns: str, name: str) -> str | None:
    obj = _get(cluster, ns, "inferencebenchmark", name) or {}
    phase: str | None = obj.get("status", {}).get("phase")
    return phase


def _replicas(cluster: ClusterHandle, ns: str, kind: str, name: str) -> int:
    return int((_get(cluster, ns, kind, name) or {}).get("spec", {}).get("replicas", -1))


def _refused(cluster: ClusterHandle, *args: str) -> str:
    proc = cluster.kubectl(*args, check=False)
    assert proc.returncode != 0, f"{' '.join(args)} was allowed"
    return proc.stderr


def test_a_benchmark_runs_and_no_path_can_scale_its_target_down(
    operator_process: OperatorProcess,
    pod_runner: int,
    lock_policy: None,
    namespace: str,
) -> None:
    cluster, ns = operator_process.cluster, namespace
    if not operator_process.alive():
        operator_process.start()
    cluster.apply(_target("svc", 2), namespace=ns)
    _wait(
        lambda: (
            (i := _get(cluster, ns, "isvc", "svc"))
            and i.get("status", {}).get("readyReplicas") == 2
            and _condition(i, "Ready").get("status") == "True"
        ),
        "two ready replicas",
        timeout=120,
    )
    cluster.apply(_bench("load", "svc", 30), namespace=ns)
    _wait(lambda: _phase(cluster, ns, "load") == "Running", "the benchmark to run", timeout=90)
    job = _get(cluster, ns, "job", "load-load")
    assert job is not None
    assert job["metadata"]["labels"][f"{GROUP}/scale-down-lock"] == "true"
    assert job["metadata"]["labels"][f"{GROUP}/lock-target"] == "svc"
    _wait(
        lambda: (
            _condition(_get(cluster, ns, "isvc", "svc"), "ScaleDownBlocked").get("status") == "True"
        ),
        "ScaleDownBlocked=True",
    )
    blocked = _condition(_get(cluster, ns, "isvc", "svc"), "ScaleDownBlocked")
    assert "load" in blocked["message"]

    # Every way down is refused while it runs ...
    err = _refused(cluster, "scale", "isvc", "svc", "-n", ns, "--replicas=1")
    assert "while InferenceBenchmark load runs" in err, err
    _refused(cluster, "scale", "deployment", "svc", "-n", ns, "--replicas=1")
    _refused(
        cluster,
        "patch",
        "deployment",
        "svc",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec": {"replicas": 1}}',
    )
    _refused(
        cluster, "patch", "isvc", "svc", "-n", ns, "--type=merge", "-p", '{"spec": {"replicas": 1}}'
    )
    cluster.apply(
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "svc"},
            "spec": {
                "scaleTargetRef": {
                    "apiVersion": f"{GROUP}/v1alpha1",
                    "kind": "InferenceService",
                    "name": "svc",
                },
                "minReplicas": 1,
                "maxReplicas": 1,
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
        namespace=ns,
    )
    _wait(
        lambda: any(
            e.get("reason") == "FailedRescale"
            for e in (
                _get(
                    cluster,
                    ns,
                    "events",
                    "--field-selector",
                    "involvedObject.kind=HorizontalPodAutoscaler",
                )
                or {}
            ).get("items", [])
        ),
        "the HPA's scale-down to be refused",
        timeout=60,
    )
    cluster.kubectl("delete", "hpa", "svc", "-n", ns)
    assert _replicas(cluster, ns, "isvc", "svc") == 2
    assert _replicas(cluster, ns, "deployment", "svc") == 2
    # ... while up is allowed.
    cluster.kubectl("scale", "isvc", "svc", "-n", ns, "--replicas=3")
    _wait(lambda: _replicas(cluster, ns, "deployment", "svc") == 3, "the scale-up")

    bench = _wait(
        lambda: (
            (b := _get(cluster, ns, "inferencebenchmark", "load"))
            and b.get("status", {}).get("phase") in ("Succeeded", "Failed")
            and b
        ),
        "the benchmark to end",
        timeout=180,
    )
    status = bench["status"]
    assert status["phase"] == "Succeeded", status
    head = status["headline"]
    assert head["requests"] > 0 and head["succeeded"] > 0
    assert head["fromScheduled"]["ttft"]["p99"] >= 400, "the fake server waits 0.4 s"
    assert _condition(bench, "Ready")["status"] == "True"
    isvc = _wait(
        lambda: (
            (i := _get(cluster, ns, "isvc", "svc"))
            and _condition(i, "ScaleDownBlocked").get("status") == "False"
            and i
        ),
        "ScaleDownBlocked=False",
    )
    assert isvc["status"]["lastBenchmark"]["name"] == "load"
    assert isvc["status"]["lastBenchmark"]["phase"] == "Succeeded"
    # Afterwards, down works again.
    cluster.kubectl("scale", "isvc", "svc", "-n", ns, "--replicas=1")
    _wait(lambda: _replicas(cluster, ns, "deployment", "svc") == 1, "the scale-down")


def test_the_lock_clears_when_the_operator_is_down_as_the_benchmark_ends(
    operator_process: OperatorProcess,
    pod_runner: int,
    lock_policy: None,
    namespace: str,
) -> None:
    cluster, ns = operator_process.cluster, namespace
    if not operator_process.alive():
        operator_process.start()
    cluster.apply(_target("svc", 2), namespace=ns)
    _wait(
        lambda: (
            (i := _get(cluster, ns, "isvc", "svc"))
            and _condition(i, "Ready").get("status") == "True"
        ),
        "Ready",
        timeout=120,
    )
    cluster.apply(_bench("short", "svc", 10), namespace=ns)
    _wait(lambda: _phase(cluster, ns, "short") == "Running", "the benchmark to run", timeout=90)
    operator_process.stop()
    try:
        _refused(cluster, "scale", "isvc", "svc", "-n", ns, "--replicas=1")
        # The load Job ends: the lock it is goes with it, no operator needed.
        _wait(
            lambda: any(
                c.get("type") == "Complete" and c.get("status") == "True"
                for c in (_get(cluster, ns, "job", "short-load") or {})
                .get("status", {})
                .get("conditions", [])
            ),
            "the load Job to finish without the operator",
            timeout=180,
        )
        cluster.kubectl("scale", "isvc", "svc", "-n", ns, "--replicas=1")
        assert _replicas(cluster, ns, "isvc", "svc") == 1
    finally:
        operator_process.start()
    _wait(
        lambda: _phase(cluster, ns, "short") in ("Succeeded", "Failed"),
        "the benchmark to be closed by the restarted operator",
        timeout=60,
    )


def _reason(cluster: ClusterHandle, ns: str, name: str) -> str | None:
    ready = _condition(_get(cluster, ns, "inferencebenchmark", name), "Ready")
    reason: str | None = ready.get("reason")
    return reason


@pytest.mark.vllm
def test_a_benchmark_reads_its_dataset_and_leaves_every_request_in_its_results_config_map(
    operator_process: OperatorProcess,
    pod_runner: int,
    namespace: str,
    tmp_path: Path,
) -> None:
    require_vllm_python()
    cluster, ns = operator_process.cluster, namespace
    if not operator_process.alive():
        operator_process.start()
    cluster.apply(_isvc("tiny", "vllm", warmup={"enabled": False}), namespace=ns)
    requests = 12
    bench = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "InferenceBenchmark",
        "metadata": {"name": "replay"},
        "spec": {
            "targetRef": {"name": "tiny"},
            "workload": {"dataset": {"name": "prompts", "key": "chat.jsonl"}},
            "arrival": {"process": "ClosedLoop", "concurrency": 2},
            "requests": requests,
            "endpoint": {"api": "ChatCompletions", "stream": True},
            "seed": 1,
        },
    }
    # Applied before its dataset exists: it waits, saying for what.
    cluster.apply(bench, namespace=ns)
    _wait(
        lambda: _reason(cluster, ns, "replay") == "DatasetNotFound",
        "DatasetNotFound once the target is Ready",
        timeout=420,
    )
    assert _phase(cluster, ns, "replay") == "Pending"
    assert (
        "spec.workload.dataset"
        in _condition(_get(cluster, ns, "inferencebenchmark", "replay"), "Ready")["message"]
    )
    assert _get(cluster, ns, "job", "replay-load") is None
    lines = [
        {"messages": [{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}],
         "output_tokens": 4 + i % 3}
        for i in range(5)
    ]  # fmt: skip
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "prompts"},
            "data": {"chat.jsonl": "\n".join(json.dumps(line) for line in lines) + "\n"},
        },
        namespace=ns,
    )
    done = _wait(
        lambda: (
            (b := _get(cluster, ns, "inferencebenchmark", "replay"))
            and b.get("status", {}).get("phase") in ("Succeeded", "Failed")
            and b
        ),
        "the benchmark to end",
        timeout=300,
    )
    status = done["status"]
    assert status["phase"] == "Succeeded", status
    assert status["headline"]["requests"] == requests
    assert status["headline"]["succeeded"] == requests, status["headline"]
    assert status["resultsConfigMap"] == "replay-results"

    config_map = _get(cluster, ns, "configmap", "replay-results")
    assert config_map is not None
    assert config_map["metadata"]["ownerReferences"][0]["name"] == "replay"
    assert config_map["data"]["requests"] == str(requests)
    assert config_map["data"]["requestsDropped"] == "0"
    results = unpack(config_map)
    (level,) = results["levels"]
    assert len(level["requests"]) == requests == level["stats"]["requests"]
    assert all(r["error"] is None for r in level["requests"]), level["requests"]
    # The prompts came from the dataset: its output lengths, and no other.
    assert {r["output_tokens_planned"] for r in level["requests"]} <= {4, 5, 6}
    assert all(r["completion_tokens"] == r["output_tokens_planned"] for r in level["requests"])
    # The Job's identity may write its results and nothing else.
    as_job = f"--as=system:serviceaccount:{ns}:replay-load"
    can = cluster.kubectl(
        "auth", "can-i", "patch", "configmap/replay-results", "-n", ns, as_job, check=False
    )
    assert can.stdout.strip() == "yes"
    cannot = cluster.kubectl(
        "auth", "can-i", "patch", "configmap/prompts", "-n", ns, as_job, check=False
    )
    assert cannot.stdout.strip() == "no"

    # The documented recipe: the ConfigMap back into results.json and the HTML report.
    cm_json = cluster.kubectl("get", "configmap", "replay-results", "-n", ns, "-o", "json").stdout
    report = tmp_path / "report"
    subprocess.run(
        [sys.executable, "-m", "vllm_operator.cli", "bench", "--from-results", "-",
         "--output-dir", str(report)],
        input=cm_json, text=True, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    assert json.loads((report / "results.json").read_text())["levels"][0]["requests"]
    assert "<svg" in (report / "report.html").read_text()
