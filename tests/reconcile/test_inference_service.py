"""The reconcile against a recording ClusterAPI: what it applies, writes and reports."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.fakes import RecordingCluster, endpoint_slice
from tests.specs import BASE
from vllm_operator.constants import TESTED_VLLM_VERSION
from vllm_operator.k8s.api import ApiError
from vllm_operator.reconcile.inference_service import reconcile_inference_service
from vllm_operator.settings import OperatorSettings

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SETTINGS = OperatorSettings(default_image="registry.local/vllm:test")


def _node(name: str, gpus: int, product: str = "NVIDIA-GeForce-RTX-4090") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
    }


def _cluster(*nodes: dict[str, Any], **spec: Any) -> tuple[RecordingCluster, dict[str, Any]]:
    api = RecordingCluster()
    for node in nodes or (_node("gpu-a", 2),):
        api.put(node)
    body = copy.deepcopy(BASE)
    body["spec"].update(spec)
    api.put(body)
    return api, body


def _stored(api: RecordingCluster, body: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return api.objects[(body["apiVersion"], body["kind"], meta["namespace"], meta["name"])]


def _condition(api: RecordingCluster, body: dict[str, Any], type_: str) -> dict[str, Any]:
    conds = _stored(api, body)["status"]["conditions"]
    found: dict[str, Any] = next(c for c in conds if c["type"] == type_)
    return found


async def test_first_reconcile_applies_every_child_and_writes_status() -> None:
    api, body = _cluster()
    outcome = await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    assert api.applied("Service") == ["chat"]
    assert api.applied("PodDisruptionBudget") == ["chat"]
    assert api.applied("Deployment") == ["chat"]
    assert api.applied("InferenceService/status") == ["chat"]
    dep = api.objects[("apps/v1", "Deployment", "team-a", "chat")]
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/vllm:test"
    assert _condition(api, body, "Ready")["reason"] == "RollingOut"
    assert not outcome.ready and not outcome.stalled


async def test_an_unchanged_status_is_not_written_again() -> None:
    api, body = _cluster()
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    body = _stored(api, body)
    api.calls.clear()
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW.replace(hour=13))
    assert api.applied("InferenceService/status") == []


async def test_a_missing_token_secret_stalls_with_the_secret_named() -> None:
    api, body = _cluster(
        model={
            "source": {"huggingFace": {"repo": "org/model", "tokenSecretRef": {"name": "hf-token"}}}
        }
    )
    outcome = await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    stalled = _condition(api, body, "Stalled")
    assert outcome.stalled
    assert stalled["status"] == "True" and stalled["reason"] == "SecretNotFound"
    assert "hf-token" in stalled["message"]
    assert [e[0] for e in api.events] == ["SecretNotFound"]


async def test_too_few_gpus_on_every_node_stalls_and_rolls_out_nothing() -> None:
    api, body = _cluster(_node("small", 1), gpu={"count": 2})
    outcome = await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    stalled = _condition(api, body, "Stalled")
    assert outcome.stalled and stalled["reason"] == "NotEnoughGPUs"
    assert "2 GPUs" in stalled["message"]
    assert api.applied("Deployment") == [], "never a Deployment that cannot run"


async def test_an_unknown_model_on_too_few_gpus_stalls_naming_the_count() -> None:
    api, body = _cluster(
        _node("small", 1),
        model={"source": {"huggingFace": {"repo": "someone/unknown-model"}}},
        gpu={"count": 4},
    )
    outcome = await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    stalled = _condition(api, body, "Stalled")
    assert outcome.stalled and stalled["reason"] == "NoNodeHasEnoughGPUs"
    assert "4 GPUs" in stalled["message"] and "most is 1" in stalled["message"]
    status = _stored(api, body)["status"]
    assert status["tuning"]["plannedBy"] == "SpecOnly"


async def test_a_product_no_node_has_stalls() -> None:
    api, body = _cluster(_node("a", 8), gpu={"count": 1, "products": ["NVIDIA-H200"]})
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    stalled = _condition(api, body, "Stalled")
    assert stalled["reason"] == "NoMatchingGPUs" and "NVIDIA-H200" in stalled["message"]


async def test_a_known_model_is_planned_by_the_tuner() -> None:
    api, body = _cluster(_node("a", 2))
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    tuning = _stored(api, body)["status"]["tuning"]
    assert tuning["plannedBy"] == "Tuner"
    names = {a["name"] for a in tuning["arguments"]}
    assert {"max-model-len", "max-num-seqs", "gpu-memory-utilization"} <= names
    assert all(a["reason"] for a in tuning["arguments"])
    dep = api.objects[("apps/v1", "Deployment", "team-a", "chat")]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--max-model-len" in args


async def test_stalled_events_are_not_repeated_on_the_next_reconcile() -> None:
    api, body = _cluster(_node("small", 1), gpu={"count": 2})
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    await reconcile_inference_service(api, _stored(api, body), settings=SETTINGS, now=NOW)
    assert [e[0] for e in api.events] == ["NotEnoughGPUs"]


async def test_a_child_the_apiserver_rejects_stalls_instead_of_retrying() -> None:
    api, body = _cluster()
    api.fail[("apply", "Deployment")] = ApiError(422, "Invalid", "spec.template: bad")
    outcome = await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    assert outcome.stalled
    assert _condition(api, body, "Stalled")["reason"] == "ChildRejected"


async def test_a_transient_error_is_raised_for_the_queue_to_retry() -> None:
    api, body = _cluster()
    api.fail[("apply", "Deployment")] = ApiError(503, "ServiceUnavailable", "etcd leader lost")
    with pytest.raises(ApiError) as err:
        await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    assert err.value.transient


async def test_an_invalid_stored_object_is_reported_not_rendered() -> None:
    api, body = _cluster(replicas=-3)
    outcome = await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    assert outcome.stalled
    assert api.applied("Deployment") == []
    stalled = _condition(api, body, "Stalled")
    assert stalled["reason"] == "InvalidSpec" and "replicas" in stalled["message"]


async def test_ready_once_the_deployment_reports_ready_replicas_and_the_service_routes() -> None:
    api, body = _cluster(warmup={"enabled": False})
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    key = ("apps/v1", "Deployment", "team-a", "chat")
    api.objects[key]["metadata"]["generation"] = 1
    api.objects[key]["status"] = {
        "observedGeneration": 1,
        "replicas": 1,
        "updatedReplicas": 1,
        "readyReplicas": 1,
        "availableReplicas": 1,
    }
    # The pod is ready, but the Service's EndpointSlice does not list it yet (the
    # EndpointSlice controller lags): a request through the Service would be refused.
    api.put(endpoint_slice("team-a", "chat", ready=0, unready=1))
    # A slice of another Service carrying the label (someone's) does not count.
    api.put(endpoint_slice("team-a", "other", ready=1, name="other-x"))
    outcome = await reconcile_inference_service(api, _stored(api, body), settings=SETTINGS, now=NOW)
    assert not outcome.ready
    ready = _condition(api, body, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "AwaitingEndpoints")
    assert ready["message"] == (
        "1 of 1 replicas are ready; the Service chat does not list any of them as a ready "
        "endpoint yet."
    )
    reconciling = _condition(api, body, "Reconciling")
    assert (reconciling["status"], reconciling["reason"]) == ("True", "AwaitingEndpoints")
    assert _condition(api, body, "Stalled")["status"] == "False"

    api.put(endpoint_slice("team-a", "chat", ready=1))
    outcome = await reconcile_inference_service(api, _stored(api, body), settings=SETTINGS, now=NOW)
    assert outcome.ready
    assert _condition(api, body, "Ready")["status"] == "True"
    assert ("AllReplicasReady", "1 of 1 replicas are ready.", False) in api.events
    # The way to Ready is expected progress: Normal events, not Warnings.
    assert [(e[0], e[2]) for e in api.events] == [
        ("AwaitingEndpoints", False),
        ("AllReplicasReady", False),
    ]


async def test_scaling_does_not_change_the_pod_template() -> None:
    api, body = _cluster(_node("a", 2), workload={"peakConcurrency": 32})
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    key = ("apps/v1", "Deployment", "team-a", "chat")
    before = api.objects[key]["spec"]["template"]
    scaled = _stored(api, body)
    scaled["spec"]["replicas"] = 4
    await reconcile_inference_service(api, scaled, settings=SETTINGS, now=NOW)
    assert api.objects[key]["spec"]["replicas"] == 4
    assert api.objects[key]["spec"]["template"] == before, "a scale must not roll pods out"


async def test_an_override_vllm_does_not_take_stalls_naming_the_field_and_rolls_out_nothing() -> (
    None
):
    api, body = _cluster(_node("a", 2), tuning={"overrides": {"gpu-memory-utilization": "1.5"}})
    outcome = await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    stalled = _condition(api, body, "Stalled")
    assert outcome.stalled and stalled["reason"] == "InvalidOverride"
    assert stalled["message"].startswith("spec.tuning.overrides.gpu-memory-utilization: ")
    assert api.applied("Deployment") == [], "a bad override never reaches a pod"


async def test_the_version_comes_from_the_image_tag_and_decides_the_flags() -> None:
    api, body = _cluster(_node("a", 2), image="vllm/vllm-openai:v0.17.1")
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    tuning = _stored(api, body)["status"]["tuning"]
    assert tuning["vllmVersion"] == "0.17.1"
    dep = api.objects[("apps/v1", "Deployment", "team-a", "chat")]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--shutdown-timeout" not in args, "0.17 has no --shutdown-timeout"
    api, body = _cluster(_node("a", 2), image="vllm/vllm-openai:v0.18.0")
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    dep = api.objects[("apps/v1", "Deployment", "team-a", "chat")]
    assert "--shutdown-timeout" in dep["spec"]["template"]["spec"]["containers"][0]["args"]


async def test_an_image_whose_tag_names_no_version_is_planned_for_the_default_and_says_so() -> None:
    api, body = _cluster(_node("a", 2), image="mirror.local/vllm:latest")
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    tuning = _stored(api, body)["status"]["tuning"]
    assert tuning["vllmVersion"] == TESTED_VLLM_VERSION
    assert any("mirror.local/vllm:latest names no vLLM version" in n for n in tuning["notes"])
    api, body = _cluster(_node("a", 2), image="mirror.local/vllm:latest", vllmVersion="0.11.0")
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    assert _stored(api, body)["status"]["tuning"]["vllmVersion"] == "0.11.0"


def _users(kind: str, api_version: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": "chat", "namespace": "team-a", "labels": {"app": "mine"}},
        "spec": spec,
    }


@pytest.mark.parametrize(
    "theirs",
    [
        _users("Service", "v1", selector={"app": "mine"}, ports=[{"port": 80}]),
        _users("PodDisruptionBudget", "policy/v1", maxUnavailable=1),
        _users("Deployment", "apps/v1", replicas=3),
    ],
    ids=lambda o: o["kind"],
)
async def test_a_users_object_of_the_same_name_is_never_taken_over(
    theirs: dict[str, Any],
) -> None:
    """Applying over it would re-point the user's Service at the vLLM pods and, with our
    owner reference added, delete it with the InferenceService."""
    api, body = _cluster(_node("a", 2))
    api.put(copy.deepcopy(theirs))
    key = (theirs["apiVersion"], theirs["kind"], "team-a", "chat")
    outcome = await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    assert api.objects[key] == theirs, "not one field of it changed"
    assert theirs["kind"] not in [k.split("/")[0] for k in _applied_kinds(api)]
    stalled = _condition(api, body, "Stalled")
    assert outcome.stalled and stalled["reason"] == f"{theirs['kind']}Conflict"
    assert f"A {theirs['kind']} named chat exists in namespace team-a" in stalled["message"]
    # The other children are ours and applied.
    assert len(_applied_kinds(api)) >= 2


def _applied_kinds(api: RecordingCluster) -> list[str]:
    kinds = ("Service", "PodDisruptionBudget", "Deployment")
    return [k for k in kinds if api.applied(k)]


async def test_a_fault_of_the_operators_own_reaches_the_status_and_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No exception leaves a reconcile without a status: before, a service whose spec
    tripped a bug had none and no event, retried for ever in silence."""
    import vllm_operator.reconcile.inference_service as module

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("the tuner tripped")

    monkeypatch.setattr(module, "plan_inference_service", broken)
    api, body = _cluster(_node("a", 2))
    with pytest.raises(RuntimeError):
        await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    stalled = _condition(api, body, "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "ReconcileFailed"
    assert "RuntimeError: the tuner tripped" in stalled["message"]
    assert [e[0] for e in api.events] == ["ReconcileFailed"]
    # The retry that fails the same way writes nothing again.
    api.calls.clear()
    with pytest.raises(RuntimeError):
        await reconcile_inference_service(api, _stored(api, body), settings=SETTINGS, now=NOW)
    assert api.applied("InferenceService/status") == []
