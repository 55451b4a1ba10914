"""The autoscaler's reading against the recording ClusterAPI and a fake /metrics (the
boundary we own); the real vLLM pods are in e2e/test_autoscale.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.fakes import RecordingCluster
from tests.specs import BASE, lock_job, node
from vllm_operator.autoscale.decide import ScalerState
from vllm_operator.reconcile.autoscale import autoscale_inference_service
from vllm_operator.reconcile.inference_service import reconcile_inference_service
from vllm_operator.servers.pods import PodHTTPError
from vllm_operator.settings import OperatorSettings

ISVC_KEY = ("inference.vllm-operator.dev/v1alpha1", "InferenceService", "team-a", "chat")
COST = "controller.kubernetes.io/pod-deletion-cost"


def _metrics(running: float, waiting: float = 0.0) -> str:
    return (
        f'vllm:num_requests_running{{engine="0"}} {running}\n'
        f'vllm:num_requests_waiting{{engine="0"}} {waiting}\n'
    )


class FakeMetrics:
    """Pod IP → /metrics text; an IP without an entry refuses the connection."""

    def __init__(self) -> None:
        self.by_ip: dict[str, str] = {}
        self.urls: list[str] = []

    async def __call__(self, url: str) -> str:
        self.urls.append(url)
        ip = url.split("//")[1].split(":")[0]
        if ip not in self.by_ip:
            raise PodHTTPError("connection refused")
        return self.by_ip[ip]


def _served(tokens: float, finished: float, e2e: float) -> str:
    """A pod's /metrics whose gauges read 0, with its counters and latency sum."""
    return _metrics(running=0) + (
        f'vllm:e2e_request_latency_seconds_sum{{engine="0"}} {e2e}\n'
        f'vllm:prompt_tokens_total{{engine="0"}} {tokens / 2}\n'
        f'vllm:generation_tokens_total{{engine="0"}} {tokens / 2}\n'
        f'vllm:request_success_total{{engine="0",finished_reason="length"}} {finished}\n'
    )


def _pod(
    api: RecordingCluster, name: str, ip: str, *, ready: bool = True, created: str | None = None
) -> None:
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "team-a",
                "uid": f"uid-{name}",
                "labels": {"inference.vllm-operator.dev/inference-service": "chat"},
                **({"creationTimestamp": created} if created else {}),
            },
            "status": {
                "podIP": ip,
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }
    )


def _service(api: RecordingCluster, replicas: int, **autoscaling: Any) -> None:
    body = copy.deepcopy(BASE)
    body["spec"]["replicas"] = replicas
    body["spec"]["autoscaling"] = {
        "enabled": True,
        "metric": "RequestsRunning",
        "target": "2",
        "maxReplicas": 4,
        "periodSeconds": 5,
        "scaleDownWindowSeconds": 30,
        **autoscaling,
    }
    api.put(body)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def _read(
    api: RecordingCluster, states: dict[str, ScalerState], m: FakeMetrics, clock: Clock
) -> float | None:
    body = api.objects[ISVC_KEY]
    return await autoscale_inference_service(api, body, states=states, scrape=m, clock=clock)


def _replicas(api: RecordingCluster) -> int:
    return int(api.objects[ISVC_KEY]["spec"]["replicas"])


def _status(api: RecordingCluster) -> dict[str, Any]:
    return dict(api.objects[ISVC_KEY]["status"]["autoscaling"])


async def test_load_scales_up_through_the_scale_subresource_and_says_why() -> None:
    api, m, clock, states = RecordingCluster(), FakeMetrics(), Clock(), {}
    _service(api, 1)
    _pod(api, "chat-a", "10.0.0.1")
    _pod(api, "chat-warming", "10.0.0.2", ready=False)
    m.by_ip["10.0.0.1"] = _metrics(running=7)
    assert await _read(api, states, m, clock) == 5.0
    assert m.urls == ["http://10.0.0.1:8000/metrics"]  # not-Ready pods are not read
    assert ("patch", "InferenceService/scale", "chat") in api.calls
    assert _replicas(api) == 4  # ceil(7 / 2)
    status = _status(api)
    assert status["decision"] == "ScaleUp"
    assert (status["currentValue"], status["desiredReplicas"], status["podsRead"]) == ("7", 4, 1)
    assert "lastScaleTime" in status
    assert [e[0] for e in api.events] == ["ScaledUp"]


async def test_scale_down_waits_sets_deletion_costs_and_removes_one_pod_per_period() -> None:
    api, m, clock, states = RecordingCluster(), FakeMetrics(), Clock(), {}
    _service(api, 3)
    for i, running in enumerate((0, 1, 0)):
        _pod(api, f"chat-{i}", f"10.0.0.{i}")
        m.by_ip[f"10.0.0.{i}"] = _metrics(running=running)
    await _read(api, states, m, clock)
    assert _replicas(api) == 3
    assert _status(api)["decision"] == "Steady"
    assert "scale-down window" in _status(api)["message"]
    clock.t += 31
    await _read(api, states, m, clock)
    assert _replicas(api) == 2
    costs = {
        name: api.objects[("v1", "Pod", "team-a", name)]["metadata"]["annotations"][COST]
        for name in ("chat-0", "chat-1", "chat-2")
    }
    # Ranks: the pod holding a request highest; the two idle ones by name (no timestamps).
    assert costs == {"chat-0": "0", "chat-1": "2", "chat-2": "1"}
    # Costs are patched before the scale subresource.
    patches = [c for c in api.calls if c[0] == "patch"]
    assert patches[-1] == ("patch", "InferenceService/scale", "chat")
    # One pod per period: the next one only after periodSeconds.
    clock.t += 2
    await _read(api, states, m, clock)
    assert _replicas(api) == 2
    clock.t += 5
    await _read(api, states, m, clock)
    assert _replicas(api) == 1


def _cost(api: RecordingCluster, name: str) -> int:
    return int(api.objects[("v1", "Pod", "team-a", name)]["metadata"]["annotations"][COST])


@pytest.mark.parametrize("missed", [None, 1028.0, 1030.0])
async def test_the_pod_that_served_over_the_window_is_kept_on_scale_down(
    missed: float | None,
) -> None:
    """e2e/test_autoscale.py's scale-down, at the boundary we own: two pods, the newer one
    busy, the older idle, and vLLM's gauges reading 0 at every scrape. The busy pod's
    scrape fails once, just before the decision (its history was dropped: its next load
    came from the gauges alone, 0) or at it (no load: cost 0); or nothing fails but its
    requests are short (20 tokens, 15 ms, one every 4 s: 0.004 requests in the server on
    average, 0 in the old cost of 100 * requests). Each way the costs tied at 0, or the busy
    pod's was the lower, and the ReplicaSet removed the newer, busy pod. The older, idle
    pod must go."""
    api, m, clock, states = RecordingCluster(), FakeMetrics(), Clock(), {}
    _service(api, 2, target="3", periodSeconds=2, scaleDownWindowSeconds=30)
    _pod(api, "chat-old", "10.0.0.1", created="2026-01-01T00:00:00Z")
    _pod(api, "chat-new", "10.0.0.2", created="2026-01-01T00:05:00Z")
    m.by_ip["10.0.0.1"] = _served(tokens=500, finished=40, e2e=30)
    while True:
        served = (clock.t - 1000) // 4
        m.by_ip["10.0.0.2"] = _served(tokens=20 * served, finished=served, e2e=0.015 * served)
        if clock.t == missed:
            del m.by_ip["10.0.0.2"]  # refuses the connection this once
        await _read(api, states, m, clock)
        if _replicas(api) == 1:
            break
        assert clock.t < 1040, "no scale-down"
        clock.t += 2
    assert clock.t == 1030  # the whole scale-down window after the first reading
    assert _cost(api, "chat-old") < _cost(api, "chat-new")
    assert {_cost(api, "chat-old"), _cost(api, "chat-new")} == {0, 1}


async def test_a_running_benchmark_holds_scale_down_and_says_which() -> None:
    api, m, clock, states = RecordingCluster(), FakeMetrics(), Clock(), {}
    _service(api, 2, scaleDownWindowSeconds=0)
    _pod(api, "chat-a", "10.0.0.1")
    m.by_ip["10.0.0.1"] = _metrics(running=0)
    api.put(lock_job())
    await _read(api, states, m, clock)
    assert _replicas(api) == 2
    assert _status(api)["decision"] == "ScaleDownHeld"
    assert "InferenceBenchmark load" in _status(api)["message"]
    assert [e[0] for e in api.events] == ["ScaleDownHeld"]
    clock.t += 5
    await _read(api, states, m, clock)
    assert [e[0] for e in api.events] == ["ScaleDownHeld"]  # once, on the transition
    # The benchmark ends: the held scale-down happens at the next reading.
    api.objects[("batch/v1", "Job", "team-a", "load-load")]["status"] = {
        "conditions": [{"type": "Complete", "status": "True"}]
    }
    clock.t += 5
    await _read(api, states, m, clock)
    assert _replicas(api) == 1


async def test_no_pod_answering_keeps_replicas() -> None:
    api, m, clock, states = RecordingCluster(), FakeMetrics(), Clock(), {}
    _service(api, 2, scaleDownWindowSeconds=0)
    _pod(api, "chat-a", "10.0.0.1")  # Ready but refuses the connection
    await _read(api, states, m, clock)
    assert _replicas(api) == 2
    assert _status(api)["decision"] == "NoSignal"


async def test_turning_autoscaling_off_clears_its_status_and_stops_the_readings() -> None:
    api, m, clock, states = RecordingCluster(), FakeMetrics(), Clock(), {}
    _service(api, 1)
    _pod(api, "chat-a", "10.0.0.1")
    m.by_ip["10.0.0.1"] = _metrics(running=1)
    await _read(api, states, m, clock)
    assert states
    api.objects[ISVC_KEY]["spec"]["autoscaling"]["enabled"] = False
    assert await _read(api, states, m, clock) is None
    assert "autoscaling" not in api.objects[ISVC_KEY]["status"]
    assert not states


async def test_the_reconciles_status_writes_keep_the_autoscalers_status() -> None:
    api, m, clock, states = RecordingCluster(), FakeMetrics(), Clock(), {}
    _service(api, 1)
    _pod(api, "chat-a", "10.0.0.1")
    m.by_ip["10.0.0.1"] = _metrics(running=1)
    await _read(api, states, m, clock)
    before = _status(api)
    await reconcile_inference_service(api, api.objects[ISVC_KEY], settings=OperatorSettings())
    status = api.objects[ISVC_KEY]["status"]
    assert status["autoscaling"] == before
    assert "conditions" in status
    # A second reconcile finds nothing to write (the autoscaler's part is not compared).
    writes = len([c for c in api.calls if c[1] == "InferenceService/status"])
    await reconcile_inference_service(api, api.objects[ISVC_KEY], settings=OperatorSettings())
    assert len([c for c in api.calls if c[1] == "InferenceService/status"]) == writes


@pytest.mark.parametrize("held", [False, True])
async def test_hpa_mode_renders_an_hpa_and_drops_it_when_turned_off(held: bool) -> None:
    api = RecordingCluster()
    _service(api, 1, mode="HPA", metric="RequestsWaiting", target="0.5")
    if held:
        api.put(lock_job())
    await reconcile_inference_service(api, api.objects[ISVC_KEY], settings=OperatorSettings())
    hpa = api.objects[("autoscaling/v2", "HorizontalPodAutoscaler", "team-a", "chat")]
    spec = hpa["spec"]
    assert spec["scaleTargetRef"]["kind"] == "InferenceService"
    assert spec["metrics"][0]["pods"]["metric"]["name"] == "vllm_num_requests_waiting"
    assert spec["metrics"][0]["pods"]["target"] == {"type": "AverageValue", "averageValue": "0.5"}
    assert spec["behavior"]["scaleDown"]["selectPolicy"] == ("Disabled" if held else "Max")
    assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 30
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == BASE["metadata"]["uid"]
    api.objects[ISVC_KEY]["spec"]["autoscaling"]["mode"] = "Operator"
    await reconcile_inference_service(api, api.objects[ISVC_KEY], settings=OperatorSettings())
    assert ("autoscaling/v2", "HorizontalPodAutoscaler", "team-a", "chat") not in api.objects


async def test_a_users_own_hpa_of_the_same_name_is_left_alone() -> None:
    api = RecordingCluster()
    _service(api, 1)
    api.put(
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "chat", "namespace": "team-a"},
            "spec": {},
        }
    )
    await reconcile_inference_service(api, api.objects[ISVC_KEY], settings=OperatorSettings())
    assert ("autoscaling/v2", "HorizontalPodAutoscaler", "team-a", "chat") in api.objects


async def test_hpa_mode_does_not_take_over_an_hpa_it_does_not_own() -> None:
    api = RecordingCluster()
    api.put(node("gpu-a", "NVIDIA-GeForce-RTX-4090", 2, 24564, "PCIe"))
    _service(api, 1, mode="HPA", metric="RequestsWaiting", target="0.5")
    theirs = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "chat", "namespace": "team-a"},
        "spec": {"minReplicas": 3},
    }
    api.put(theirs)
    await reconcile_inference_service(api, api.objects[ISVC_KEY], settings=OperatorSettings())
    key = ("autoscaling/v2", "HorizontalPodAutoscaler", "team-a", "chat")
    assert api.objects[key]["spec"] == {"minReplicas": 3}  # not applied over, not deleted
    stalled = next(
        c for c in api.objects[ISVC_KEY]["status"]["conditions"] if c["type"] == "Stalled"
    )
    assert stalled["status"] == "True" and stalled["reason"] == "HPAConflict"
    assert "spec.autoscaling.mode" in stalled["message"]
    # The service itself still runs.
    assert ("apps/v1", "Deployment", "team-a", "chat") in api.objects
    # Once it is gone, the operator's own HPA takes its place.
    del api.objects[key]
    await reconcile_inference_service(api, api.objects[ISVC_KEY], settings=OperatorSettings())
    assert api.objects[key]["metadata"]["ownerReferences"][0]["uid"] == BASE["metadata"]["uid"]
