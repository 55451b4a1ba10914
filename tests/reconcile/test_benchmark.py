"""The InferenceBenchmark reconcile and the operator's own scale-down clamp, against the
recording ClusterAPI."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.fakes import RecordingCluster
from tests.specs import BASE, lock_job
from vllm_operator.constants import LABEL_SERVICE
from vllm_operator.reconcile.benchmark import reconcile_inference_benchmark
from vllm_operator.reconcile.inference_service import reconcile_inference_service
from vllm_operator.settings import OperatorSettings

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SETTINGS = OperatorSettings()
BENCH: dict[str, Any] = {
    "apiVersion": "inference.vllm-operator.dev/v1alpha1",
    "kind": "InferenceBenchmark",
    "metadata": {"name": "load", "namespace": "team-a", "uid": "b-1", "generation": 1},
    "spec": {
        "targetRef": {"name": "chat"},
        "workload": {
            "promptTokens": {"type": "Fixed", "value": 16},
            "outputTokens": {"type": "Fixed", "value": 4},
        },
        "arrival": {"process": "Poisson", "ratePerSecond": 2},
        "durationSeconds": 30,
    },
}
KEY = ("inference.vllm-operator.dev/v1alpha1", "InferenceBenchmark", "team-a", "load")


def _target(ready: bool) -> dict[str, Any]:
    body = copy.deepcopy(BASE)
    body["status"] = {
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "reason": "x",
                "message": "",
                "lastTransitionTime": "2026-11-29T11:00:00Z",
            }
        ]
    }
    return body


def _job_done(api: RecordingCluster, state: str, report: dict[str, Any]) -> None:
    job = api.objects[("batch/v1", "Job", "team-a", "load-load")]
    job["status"] = {"conditions": [{"type": state, "status": "True"}]}
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "load-load-x",
                "namespace": "team-a",
                "labels": {"batch.kubernetes.io/job-name": "load-load"},
            },
            "status": {
                "containerStatuses": [{"state": {"terminated": {"message": json.dumps(report)}}}]
            },
        }
    )


async def _run(api: RecordingCluster) -> str:
    return await reconcile_inference_benchmark(api, api.objects[KEY], settings=SETTINGS, now=NOW)


def _phase(api: RecordingCluster) -> tuple[str, str]:
    status = api.objects[KEY]["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    return status["phase"], ready["reason"]


async def test_a_benchmark_waits_for_a_missing_target() -> None:
    api = RecordingCluster()
    api.put(BENCH)
    assert await _run(api) == "Pending"
    assert _phase(api) == ("Pending", "TargetNotFound")
    assert api.applied("Job") == []


async def test_a_benchmark_waits_for_a_target_that_is_not_ready() -> None:
    api = RecordingCluster()
    api.put(BENCH)
    api.put(_target(ready=False))
    assert await _run(api) == "Pending"
    assert _phase(api) == ("Pending", "TargetNotReady")


async def test_a_ready_target_gets_the_load_job_and_the_lock() -> None:
    api = RecordingCluster()
    api.put(BENCH)
    api.put(_target(ready=True))
    assert await _run(api) == "Running"
    job = api.objects[("batch/v1", "Job", "team-a", "load-load")]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--endpoint") + 1] == "http://chat.team-a.svc:8000"
    labels = job["metadata"]["labels"]
    assert labels["inference.vllm-operator.dev/scale-down-lock"] == "true"
    assert labels["inference.vllm-operator.dev/lock-target"] == "chat"
    assert _phase(api) == ("Running", "LoadRunning")


async def test_a_load_pod_that_no_node_fits_is_named_instead_of_sending_load() -> None:
    api = RecordingCluster()
    api.put(BENCH)
    api.put(_target(ready=True))
    await _run(api)
    unschedulable = "0/5 nodes are available: 1 Insufficient cpu."
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "load-load-x7k2p",
                "namespace": "team-a",
                "labels": {"batch.kubernetes.io/job-name": "load-load"},
            },
            "status": {
                "phase": "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": unschedulable},
                ],
            },
        }
    )  # fmt: skip
    assert await _run(api) == "Running"
    assert _phase(api) == ("Running", "Unschedulable")
    ready = next(c for c in api.objects[KEY]["status"]["conditions"] if c["type"] == "Ready")
    assert ready["message"] == (
        f"Job load-load sends no load yet: Pod load-load-x7k2p cannot be scheduled: "
        f"{unschedulable} InferenceService chat cannot scale down until it ends."
    )
    # Once the pod runs, the load is on its way.
    pod = api.objects[("v1", "Pod", "team-a", "load-load-x7k2p")]
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    await _run(api)
    assert _phase(api) == ("Running", "LoadRunning")
    # Ended, before the Job says so: not a problem of the pod's.
    pod["status"] = {
        "phase": "Succeeded",
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [
            {"name": "load", "ready": False, "restartCount": 0,
             "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
        ],
    }  # fmt: skip
    await _run(api)
    assert _phase(api) == ("Running", "LoadRunning")


async def test_the_load_job_gets_its_own_account_allowed_only_to_write_its_results() -> None:
    api = RecordingCluster()
    api.put(BENCH)
    api.put(_target(ready=True))
    await _run(api)
    applied = [(kind, name) for verb, kind, name in api.calls if verb == "apply"]
    # Everything the Job's pod needs exists before the Job does.
    assert applied[:6] == [
        ("ConfigMap", "load-spec"),
        ("ConfigMap", "load-results"),
        ("ServiceAccount", "load-load"),
        ("Role", "load-load"),
        ("RoleBinding", "load-load"),
        ("Job", "load-load"),
    ]
    role = api.objects[("rbac.authorization.k8s.io/v1", "Role", "team-a", "load-load")]
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["load-results"],
            "verbs": ["get", "update", "patch"],
        }
    ]
    pod = api.objects[("batch/v1", "Job", "team-a", "load-load")]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "load-load"
    args = pod["containers"][0]["args"]
    assert args[args.index("--results-config-map") + 1] == "load-results"


async def test_a_finished_job_gives_the_results_and_releases_the_lock() -> None:
    api = RecordingCluster()
    api.put(BENCH)
    api.put(_target(ready=True))
    await _run(api)
    headline = {"requests": 60, "succeeded": 60, "failed": 0, "requestsPerSecond": 2.0}
    report = {"levels": [headline], "headline": headline, "resultsConfigMap": "load-results"}
    _job_done(api, "Complete", report)
    assert await _run(api) == "Succeeded"
    status = api.objects[KEY]["status"]
    assert status["headline"]["requests"] == 60 and status["completionTime"]
    assert status["resultsConfigMap"] == "load-results"
    assert "ConfigMap load-results" in _message(api)


async def test_the_chaos_phase_of_the_report_reaches_the_status() -> None:
    api = RecordingCluster()
    api.put(BENCH)
    api.put(_target(ready=True))
    await _run(api)
    headline = {"requests": 60, "succeeded": 60, "failed": 0}
    chaos = {
        "perturbation": "network delay 30 ms each way",
        "ratePerSecond": 16.0,
        "baseline": headline,
        "perturbed": {**headline, "succeeded": 20, "failed": 40},
        "verdict": "TTFT P99 12 -> 75 ms (+525%), SLO attainment 100.0% -> 33.3%, errors 0 -> 0: "
        "the SLO did not hold",
    }
    _job_done(api, "Complete", {"levels": [headline], "headline": headline, "chaos": [chaos]})
    assert await _run(api) == "Succeeded"
    (kept,) = api.objects[KEY]["status"]["chaos"]
    assert kept["verdict"] == chaos["verdict"] and kept["ratePerSecond"] == 16.0
    assert kept["perturbed"]["succeeded"] == 20 and kept["baseline"]["succeeded"] == 60


def _level(rate: float, attainment: float, saturated: bool, lag: float = 2.0) -> dict[str, Any]:
    return {
        "ratePerSecond": rate,
        "requests": 40,
        "succeeded": round(40 * attainment),
        "failed": 40 - round(40 * attainment),
        "sloAttainment": attainment,
        "clientSaturated": saturated,
        "scheduleLagP99Milliseconds": lag,
    }


@pytest.mark.parametrize(
    ("report", "reason", "words"),
    [
        pytest.param(
            {"levels": [_level(2, 1.0, True, 20.0), _level(4, 1.0, True, 17.0)]},
            "ClientLimited",
            ["at any of the 2 levels", "schedule lag P99 up to 20 ms", "a CPU of its own"],
            id="every level limited by the client (issue 44's run)",
        ),
        pytest.param(
            {"levels": [_level(2, 0.9, False), _level(4, 0.5, False)]},
            "NoLevelMetSLO",
            ["2 of 2 levels missed the SLO", "lowest measured 50.0%, at 4 req/s", "spec.slo"],
            id="every level missed the SLO",
        ),
        pytest.param(
            {"levels": [_level(2, 0.95, False), _level(8, 1.0, True, 30.0)]},
            "NoLevelMetSLO",
            ["1 of 2 levels missed", "the load client was the bottleneck at 8 req/s"],
            id="one missed, one limited by the client",
        ),
        pytest.param(
            {"levels": [{**_level(2, 0.5, True, 20.0), "sloVerdict": "Missed"}]},
            "NoLevelMetSLO",
            ["1 of 1 levels missed the SLO"],
            id="a lagging client at a level the server missed even from the send",
        ),
        pytest.param(
            {"truncated": True},
            "LevelsNotReported",
            ["reported no level", "did not fit the termination message"],
            id="a report cut to nothing",
        ),
    ],
)
async def test_a_run_that_ended_well_without_a_headline_says_why(
    report: dict[str, Any], reason: str, words: list[str]
) -> None:
    """Issue 44: the Job completed, its levels measured, but none was the headline: this
    read 'LoadFailed: the load Job failed' with the levels dropped."""
    api = RecordingCluster()
    api.put(BENCH)
    api.put(_target(ready=True))
    await _run(api)
    _job_done(api, "Complete", {**report, "resultsConfigMap": "load-results"})
    assert await _run(api) == "Succeeded"
    assert _phase(api) == ("Succeeded", reason)
    message = _message(api)
    for word in words:
        assert word in message, (word, message)
    assert "ConfigMap load-results" in message
    status = api.objects[KEY]["status"]
    assert len(status.get("levels", [])) == len(report.get("levels", []))
    assert "headline" not in status and status["completionTime"]


async def test_results_that_did_not_reach_the_config_map_are_not_claimed() -> None:
    api = RecordingCluster()
    api.put(BENCH)
    api.put(_target(ready=True))
    await _run(api)
    headline = {"requests": 60, "succeeded": 60, "failed": 0}
    _job_done(api, "Complete", {"levels": [headline], "headline": headline})
    assert await _run(api) == "Succeeded"
    assert "resultsConfigMap" not in api.objects[KEY]["status"]
    assert "did not reach ConfigMap load-results" in _message(api)


async def test_a_failed_job_carries_the_load_generators_error() -> None:
    api = RecordingCluster()
    api.put(BENCH)
    api.put(_target(ready=True))
    await _run(api)
    job = api.objects[("batch/v1", "Job", "team-a", "load-load")]
    job["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "load-load-x",
                "namespace": "team-a",
                "labels": {"batch.kubernetes.io/job-name": "load-load"},
            },
            "status": {
                "containerStatuses": [
                    {"state": {"terminated": {"message": "dataset line 3: not JSON"}}}
                ]
            },
        }
    )
    assert await _run(api) == "Failed"
    assert _phase(api) == ("Failed", "LoadFailed")
    assert "dataset line 3: not JSON" in _message(api)


async def test_a_job_that_failed_on_its_request_errors_fails_with_that_reason() -> None:
    """Issue 21: most requests failed and the run still counted as a success. The load
    Job now exits non-zero and names the failure in its termination message; the phase
    is Failed with that reason, and what the run measured is kept."""
    api = RecordingCluster()
    api.put(BENCH)
    api.put(_target(ready=True))
    await _run(api)
    headline = {"requests": 60, "succeeded": 10, "failed": 50, "errored": 50, "unsent": 20}
    message = "at 2 req/s, 50 of 60 requests (83.3%) got no answer or were never sent"
    report = {
        "levels": [headline],
        "headline": headline,
        "resultsConfigMap": "load-results",
        "failure": {"reason": "TooManyRequestErrors", "message": message},
    }
    _job_done(api, "Failed", report)
    assert await _run(api) == "Failed"
    assert _phase(api) == ("Failed", "TooManyRequestErrors")
    assert f"Job load-load failed: {message}" in _message(api)
    status = api.objects[KEY]["status"]
    assert status["headline"]["errored"] == 50 and status["headline"]["unsent"] == 20
    assert status["resultsConfigMap"] == "load-results" and status["completionTime"]
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "TooManyRequestErrors"


async def test_a_failed_job_with_an_unknown_failure_reason_is_a_load_failure() -> None:
    api = RecordingCluster()
    api.put(BENCH)
    api.put(_target(ready=True))
    await _run(api)
    _job_done(api, "Failed", {"failure": {"reason": "Whatever", "message": "m"}})
    assert await _run(api) == "Failed"
    assert _phase(api) == ("Failed", "LoadFailed")


def _with_inputs(dataset: bool = False, trace: bool = False) -> dict[str, Any]:
    bench = copy.deepcopy(BENCH)
    if dataset:
        bench["spec"]["workload"] = {"dataset": {"name": "prompts", "key": "chat.jsonl"}}
    if trace:
        bench["spec"]["arrival"] = {
            "process": "Trace",
            "trace": {"name": "traffic", "key": "monday.jsonl"},
        }
    return bench


def _config_map(name: str, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "team-a"},
        "data": data,
    }


def _message(api: RecordingCluster) -> str:
    status = api.objects[KEY]["status"]
    return str(next(c for c in status["conditions"] if c["type"] == "Ready")["message"])


async def test_a_missing_dataset_holds_the_benchmark_until_it_is_created() -> None:
    api = RecordingCluster()
    api.put(_with_inputs(dataset=True))
    api.put(_target(ready=True))
    assert await _run(api) == "Pending"
    assert _phase(api) == ("Pending", "DatasetNotFound")
    assert "spec.workload.dataset" in _message(api) and "prompts" in _message(api)
    assert api.applied("Job") == []
    # The ConfigMap comes, without the key: still waiting, for the key now.
    api.put(_config_map("prompts", other="x"))
    assert await _run(api) == "Pending"
    assert _phase(api) == ("Pending", "DatasetKeyNotFound")
    assert "chat.jsonl" in _message(api)
    assert api.applied("Job") == []
    # With the key (binaryData counts too), the load starts with the dataset mounted.
    cm = _config_map("prompts")
    cm["binaryData"] = {"chat.jsonl": "eyJwcm9tcHQiOiAiaGkifQo="}
    api.put(cm)
    assert await _run(api) == "Running"
    pod = api.objects[("batch/v1", "Job", "team-a", "load-load")]["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "dataset")
    assert volume["configMap"] == {
        "name": "prompts",
        "items": [{"key": "chat.jsonl", "path": "dataset.jsonl"}],
    }
    assert "--dataset-file" in pod["containers"][0]["args"]


async def test_a_missing_trace_holds_the_benchmark_with_its_own_reason() -> None:
    api = RecordingCluster()
    api.put(_with_inputs(dataset=True, trace=True))
    api.put(_target(ready=True))
    api.put(_config_map("prompts", **{"chat.jsonl": '{"prompt": "hi"}'}))
    assert await _run(api) == "Pending"
    assert _phase(api) == ("Pending", "TraceNotFound")
    assert "spec.arrival.trace" in _message(api)
    api.put(_config_map("traffic", **{"tuesday.jsonl": '{"timestamp": 0}'}))
    assert await _run(api) == "Pending"
    assert _phase(api) == ("Pending", "TraceKeyNotFound")
    api.put(_config_map("traffic", **{"monday.jsonl": '{"timestamp": 0}'}))
    assert await _run(api) == "Running"
    args = api.objects[("batch/v1", "Job", "team-a", "load-load")]["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert args[args.index("--trace-file") + 1] == "/etc/vllm-operator/trace/trace.jsonl"


async def test_a_job_gone_while_running_is_reported_as_lost_results() -> None:
    api = RecordingCluster()
    bench = copy.deepcopy(BENCH)
    bench["status"] = {"phase": "Running", "conditions": []}
    api.put(bench)
    assert await _run(api) == "Failed"
    assert _phase(api) == ("Failed", "ResultsLost")


async def test_the_operator_never_lowers_replicas_under_a_lock() -> None:
    api = RecordingCluster()
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "a",
                "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            },
            "status": {"allocatable": {"nvidia.com/gpu": "8"}},
        }
    )
    body = copy.deepcopy(BASE)
    body["spec"]["replicas"] = 1
    api.put(body)
    api.put(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "chat", "namespace": "team-a"},
            "spec": {"replicas": 3},
        }
    )
    api.put(lock_job())
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    dep = api.objects[("apps/v1", "Deployment", "team-a", "chat")]
    assert dep["spec"]["replicas"] == 3, "held at the running count, not lowered to 1"
    status = api.objects[(BASE["apiVersion"], "InferenceService", "team-a", "chat")]["status"]
    blocked = next(c for c in status["conditions"] if c["type"] == "ScaleDownBlocked")
    assert blocked["status"] == "True" and "load" in blocked["message"]


async def test_a_finished_load_job_holds_no_lock() -> None:
    from vllm_operator.models import InferenceService
    from vllm_operator.reconcile.lock import active_lock

    api = RecordingCluster()
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "load-load",
            "namespace": "team-a",
            "labels": {
                "inference.vllm-operator.dev/scale-down-lock": "true",
                "inference.vllm-operator.dev/lock-target": "chat",
                "inference.vllm-operator.dev/inference-benchmark": "load",
            },
        },
        "status": {"active": 1},
    }
    api.put(job)
    isvc = InferenceService.model_validate(BASE)
    assert await active_lock(api, isvc) == "load"
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    api.put(job)
    assert await active_lock(api, isvc) is None


def _server_pod(name: str, ip: str, *, ready: bool = True, **meta: Any) -> dict[str, Any]:
    from vllm_operator.models import InferenceService
    from vllm_operator.render.meta import selector_labels

    labels = selector_labels(InferenceService.model_validate(BASE))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "labels": {**labels, **meta.pop("labels", {})},
            **meta,
        },
        "spec": {"nodeName": f"node-{name[-1]}", "tolerations": [{"operator": "Exists"}]},
        "status": {
            "podIP": ip,
            "qosClass": "Burstable",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _servers(api: RecordingCluster) -> None:
    api.put(_server_pod("chat-b", "10.1.0.2"))
    api.put(_server_pod("chat-a", "10.1.0.1"))
    api.put(_server_pod("chat-c", "10.1.0.3", ready=False))
    api.put(_server_pod("chat-d", "10.1.0.4", deletionTimestamp="2026-11-29T11:59:00Z"))
    # A LeaderWorkerSet's worker serves no API.
    api.put(
        _server_pod(
            "chat-a-1", "10.1.0.5", labels={"leaderworkerset.sigs.k8s.io/worker-index": "1"}
        )
    )


async def _chaos_run(chaos: dict[str, Any]) -> RecordingCluster:
    """One pass of a benchmark with ``chaos`` against a Ready target and its servers."""
    api = RecordingCluster()
    bench = copy.deepcopy(BENCH)
    bench["spec"]["chaos"] = chaos
    api.put(bench)
    api.put(_target(ready=True))
    _servers(api)
    await _run(api)
    return api


def _load_args(api: RecordingCluster) -> list[str]:
    job = api.objects[("batch/v1", "Job", "team-a", "load-load")]
    args: list[str] = job["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def _values(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


async def test_the_load_job_reads_the_metrics_of_each_ready_server() -> None:
    api = RecordingCluster()
    api.put(BENCH)
    api.put(_target(ready=True))
    _servers(api)
    await _run(api)
    args = _load_args(api)
    assert _values(args, "--metrics-url") == [
        "http://10.1.0.1:8000/metrics",
        "http://10.1.0.2:8000/metrics",
    ]
    # No restart asked for: the Job may evict nothing.
    assert "--restart-pod" not in args
    role = api.objects[("rbac.authorization.k8s.io/v1", "Role", "team-a", "load-load")]
    assert [r["resources"] for r in role["rules"]] == [["configmaps"]]


async def test_a_chaos_restart_lets_the_load_job_evict_only_the_ready_servers() -> None:
    api = await _chaos_run({"ratePerSecond": 2, "restart": {"afterSeconds": 10}})
    args = _load_args(api)
    assert _values(args, "--restart-pod") == ["chat-a", "chat-b"]
    assert _values(args, "--restart-namespace") == ["team-a"]
    role = api.objects[("rbac.authorization.k8s.io/v1", "Role", "team-a", "load-load")]
    assert role["rules"][1] == {
        "apiGroups": [""],
        "resources": ["pods/eviction"],
        "resourceNames": ["chat-a", "chat-b"],
        "verbs": ["create"],
    }
    job = api.objects[("batch/v1", "Job", "team-a", "load-load")]
    # One level and the chaos phase's two runs, 30 s each, twice over plus 600 s.
    assert job["spec"]["activeDeadlineSeconds"] == 3 * 30 * 2 + 600


async def test_a_noisy_neighbour_with_a_cpu_request_competes_for_its_share() -> None:
    api = await _chaos_run({"ratePerSecond": 2, "noisyNeighbour": {"cpuRequest": "500m"}})
    job = api.objects[("batch/v1", "Job", "team-a", "load-neighbour")]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": "500m"}}


@pytest.mark.parametrize(
    ("state", "gone"),
    [("Failed", True), ("Succeeded", False)],
    ids=["a failed load Job takes its neighbour away", "one that ran to the end dismissed it"],
)
async def test_the_neighbour_goes_with_a_failed_load_job(state: str, gone: bool) -> None:
    api = await _chaos_run({"ratePerSecond": 2, "noisyNeighbour": {"cpuShare": 0.5}})
    neighbour = ("batch/v1", "Job", "team-a", "load-neighbour")
    assert neighbour in api.objects
    _job_done(api, state, {"failure": {"reason": "Whatever", "message": "m"}}
              if state == "Failed" else {"headline": {"requests": 1}})  # fmt: skip
    await _run(api)
    assert (neighbour not in api.objects) == gone
    assert (("delete", "Job", "load-neighbour") in api.calls) == gone


async def test_a_noisy_neighbour_lands_beside_the_first_ready_server() -> None:
    api = await _chaos_run({"ratePerSecond": 2, "noisyNeighbour": {"cpuShare": 0.5}})
    jobs = [name for verb, kind, name in api.calls if verb == "apply" and kind == "Job"]
    # It is there before the load Job that orders it.
    assert jobs == ["load-neighbour", "load-load"]
    job = api.objects[("batch/v1", "Job", "team-a", "load-neighbour")]
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeName"] == "node-a" and pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["serviceAccountName"] == "load-load"  # the results ConfigMap, and no more
    (container,) = pod["containers"]
    assert container["command"] == ["vllm-operator", "noisy-neighbour"]
    assert "resources" not in container  # BestEffort, as a rogue process is
    args = container["args"]
    assert args[args.index("--cpu-share") + 1] == "0.5"
    assert args[args.index("--config-map") + 1] == "load-results"
    # The pod it burns beside, and whether that one is pinned (its QoS class), for its report.
    assert args[args.index("--beside") + 1] == "chat-a"
    assert args[args.index("--beside-qos") + 1] == "Burstable"
    load = _load_args(api)
    assert _values(load, "--neighbour-config-map") == ["load-results"]
    # The neighbour is no scale-down lock: only the load Job is.
    assert "inference.vllm-operator.dev/scale-down-lock" not in job["metadata"]["labels"]
    assert job["spec"]["activeDeadlineSeconds"] == 3 * 30 * 2 + 600


def _pod_on(name: str, node: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "labels": labels},
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    }


@pytest.mark.parametrize(("load_node", "shared"), [("n1", True), ("n2", False)])
async def test_a_load_pod_beside_the_target_says_so_once(load_node: str, shared: bool) -> None:
    """Issue 44: the load Job prefers a node without the target's pods; where it lands
    beside one, the status says so (its lag there is partly the server's load)."""
    api = RecordingCluster()
    api.put(BENCH)
    api.put(_target(ready=True))
    await _run(api)
    job = api.objects[("batch/v1", "Job", "team-a", "load-load")]
    term = job["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ][0]["podAffinityTerm"]
    assert term["labelSelector"] == {"matchLabels": {LABEL_SERVICE: "chat"}}
    assert term["topologyKey"] == "kubernetes.io/hostname"
    api.put(_pod_on("chat-abc", "n1", {LABEL_SERVICE: "chat"}))
    api.put(_pod_on("load-load-x", load_node, {"batch.kubernetes.io/job-name": "load-load"}))
    job["status"] = {"active": 1}
    assert await _run(api) == "Running"
    words = "The load ran on node n1 beside the target's pod chat-abc"
    assert (words in _message(api)) is shared
