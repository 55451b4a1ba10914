"""The ModelCache reconcile, and an InferenceService served from a cache, against the
recording ClusterAPI (the real lifecycle runs on the real node: e2e/test_model_cache.py)."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from tests.fakes import RecordingCluster
from tests.specs import BASE
from vllm_operator.constants import DOWNLOAD_PERMANENT_EXIT_CODES, FINALIZER_MODEL_CACHE
from vllm_operator.models import ModelCache
from vllm_operator.reconcile.inference_service import reconcile_inference_service
from vllm_operator.reconcile.model_cache import reconcile_model_cache
from vllm_operator.render.model_cache import build_claim, build_download_job
from vllm_operator.servers.pods import PodClient
from vllm_operator.settings import OperatorSettings

NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
SETTINGS = OperatorSettings(default_image="registry.local/vllm:test")
API = "inference.vllm-operator.dev/v1alpha1"
CACHE: dict[str, Any] = {
    "apiVersion": API,
    "kind": "ModelCache",
    "metadata": {"name": "tiny", "namespace": "team-a", "uid": "c-1", "generation": 1},
    "spec": {
        "source": {"huggingFace": {"repo": "tiny/llama", "endpoint": "http://hub:8080"}},
        "storage": {"size": "1Gi", "storageClassName": "local"},
    },
}
CACHE_KEY = (API, "ModelCache", "team-a", "tiny")
JOB_KEY = ("batch/v1", "Job", "team-a", "tiny-download")
CLAIM_KEY = ("v1", "PersistentVolumeClaim", "team-a", "tiny-weights")


def _cluster(cache: dict[str, Any] | None = None) -> RecordingCluster:
    api = RecordingCluster()
    api.put(copy.deepcopy(cache or CACHE))
    return api


async def _pass(api: RecordingCluster, http: PodClient | None = None) -> float | None:
    body = copy.deepcopy(api.objects[CACHE_KEY])
    return await reconcile_model_cache(api, body, settings=SETTINGS, http=http, now=NOW)


def _status(api: RecordingCluster) -> dict[str, Any]:
    status: dict[str, Any] = api.objects[CACHE_KEY]["status"]
    return status


def _ready(api: RecordingCluster) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in _status(api)["conditions"] if c["type"] == "Ready")
    return found


def _job_pod(api: RecordingCluster, *, phase: str, message: str | None = None) -> None:
    state = {"terminated": {"exitCode": 0, "message": message}} if message else {"running": {}}
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "tiny-download-x",
                "namespace": "team-a",
                "creationTimestamp": "2026-12-02T09:00:00Z",
                "labels": {"batch.kubernetes.io/job-name": "tiny-download"},
            },
            "status": {
                "phase": phase,
                "podIP": "10.0.0.7",
                "containerStatuses": [{"name": "download", "state": state}],
            },
        }
    )


def _job_done(api: RecordingCluster, state: str, report: dict[str, Any]) -> None:
    api.objects[JOB_KEY]["status"] = {"conditions": [{"type": state, "status": "True"}]}
    _job_pod(
        api, phase="Succeeded" if state == "Complete" else "Failed", message=json.dumps(report)
    )


def _bound_claim(api: RecordingCluster) -> None:
    api.objects[CLAIM_KEY]["status"] = {"phase": "Bound"}


async def test_a_new_cache_gets_its_finalizer_claim_and_download_job() -> None:
    api = _cluster()
    again = await _pass(api)
    cache = api.objects[CACHE_KEY]
    assert cache["metadata"]["finalizers"] == [FINALIZER_MODEL_CACHE]
    claim = api.objects[CLAIM_KEY]
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert claim["spec"]["storageClassName"] == "local"
    assert claim["metadata"]["ownerReferences"][0]["kind"] == "ModelCache"
    job = api.objects[JOB_KEY]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:6] == ["--repo", "tiny/llama", "--revision", "main", "--dest", "/cache/model"]
    assert args[args.index("--endpoint") + 1] == "http://hub:8080"
    assert _status(api)["phase"] == "Pending"
    assert _ready(api)["reason"] == "DownloadStarting"
    assert again is not None and again > 0


async def test_progress_is_read_from_the_running_job_pod() -> None:
    api = _cluster()
    await _pass(api)
    _job_pod(api, phase="Running")
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(
            200,
            json={
                "phase": "Downloading",
                "commit": "abc123",
                "bytesDownloaded": 1_048_576,
                "bytesTotal": 4_194_304,
                "filesDone": 2,
                "filesTotal": 6,
            },
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        again = await _pass(api, PodClient(http))
    assert seen == ["http://10.0.0.7:8090/progress"]
    status = _status(api)
    assert status["phase"] == "Downloading"
    assert (status["bytesDownloaded"], status["bytesTotal"], status["commit"]) == (
        1_048_576,
        4_194_304,
        "abc123",
    )
    assert "(1.0 MiB of 4.0 MiB, 25 %)" in _ready(api)["message"]
    assert again == 5.0


async def test_a_finished_download_is_ready_with_its_commit_and_config() -> None:
    api = _cluster()
    await _pass(api)
    _bound_claim(api)
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}
    _job_done(
        api,
        "Complete",
        {
            "phase": "Complete",
            "commit": "abc123",
            "bytesDownloaded": 3000,
            "bytesTotal": 3000,
            "filesTotal": 6,
            "config": config,
        },
    )
    assert await _pass(api) is None
    status = _status(api)
    assert status["phase"] == "Ready"
    assert status["commit"] == "abc123"
    assert json.loads(status["configJson"]) == config
    assert (status["claimName"], status["path"]) == ("tiny-weights", "/model")
    assert _ready(api)["status"] == "True"
    assert api.events[-1][0] == "Downloaded"
    # Ready stays Ready: no new Job, even once the finished one is gone.
    del api.objects[JOB_KEY]
    await _pass(api)
    assert _status(api)["phase"] == "Ready"
    assert JOB_KEY not in api.objects


async def test_a_finished_job_whose_pod_is_gone_is_run_again_to_report() -> None:
    """Its result lives only in its pod's termination message: with the pod deleted, the
    cache must not go Ready on the last progress figures (the first real-node run did), but
    run the check again, which finds the files in place and reports them."""
    api = _cluster()
    await _pass(api)
    _bound_claim(api)
    api.objects[JOB_KEY]["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    again = await _pass(api)
    assert _status(api)["phase"] == "Pending"
    assert _ready(api)["reason"] == "Rechecking"
    assert "its pod and the result in it are gone" in _ready(api)["message"]
    assert JOB_KEY not in api.objects and again is not None
    await _pass(api)
    assert JOB_KEY in api.objects  # the new run
    _job_done(
        api,
        "Complete",
        {"phase": "Complete", "commit": "abc123", "bytesDownloaded": 3000, "bytesTotal": 3000,
         "filesTotal": 6, "reason": "AlreadyComplete"},
    )  # fmt: skip
    await _pass(api)
    status = _status(api)
    assert (status["phase"], status["bytesDownloaded"], status["commit"]) == (
        "Ready", 3000, "abc123"
    )  # fmt: skip


@pytest.mark.parametrize("reason", sorted(DOWNLOAD_PERMANENT_EXIT_CODES))
async def test_a_permanent_failure_stalls_with_the_jobs_reason(reason: str) -> None:
    api = _cluster()
    await _pass(api)
    _job_done(api, "Failed", {"phase": "Failed", "reason": reason, "message": "it said why"})
    await _pass(api)
    assert _status(api)["phase"] == "Failed"
    ready = _ready(api)
    assert ready["reason"] == reason
    assert "it said why" in ready["message"] and "delete Job tiny-download" in ready["message"]
    stalled = next(c for c in _status(api)["conditions"] if c["type"] == "Stalled")
    assert stalled["status"] == "True"


async def test_spent_retries_of_a_transient_failure_are_download_failed() -> None:
    api = _cluster()
    await _pass(api)
    _job_done(api, "Failed", {"phase": "Failed", "message": "connection reset"})
    await _pass(api)
    assert _ready(api)["reason"] == "DownloadFailed"
    # Deleting the Job (after fixing the cause) starts another.
    del api.objects[JOB_KEY]
    await _pass(api)
    assert JOB_KEY in api.objects


async def test_a_missing_token_secret_waits_before_any_job() -> None:
    cache = copy.deepcopy(CACHE)
    cache["spec"]["source"]["huggingFace"]["tokenSecretRef"] = {"name": "hub", "key": "token"}
    api = _cluster(cache)
    await _pass(api)
    assert _ready(api)["reason"] == "SecretNotFound"
    assert JOB_KEY not in api.objects
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hub", "namespace": "team-a"},
            "data": {"token": "c2VjcmV0"},
        }
    )
    await _pass(api)
    pod = api.objects[JOB_KEY]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][-2:] == ["--token-file", "/var/run/hub-token/token"]
    assert {"name": "token", "mountPath": "/var/run/hub-token", "readOnly": True} in container[
        "volumeMounts"
    ]
    # The token is a file, never a variable of the pod.
    assert all("token" not in e["name"].lower() for e in container["env"])


async def test_size_auto_comes_from_the_catalog_or_is_refused_naming_the_field() -> None:
    cache = copy.deepcopy(CACHE)
    cache["spec"]["source"]["huggingFace"]["repo"] = "meta-llama/Llama-3.1-8B-Instruct"
    cache["spec"]["storage"] = {}
    api = _cluster(cache)
    await _pass(api)
    # 8.0 B parameters in bf16 (15.0 GiB) plus 10 % and 1 GiB.
    assert api.objects[CLAIM_KEY]["spec"]["resources"]["requests"]["storage"] == "18Gi"
    unknown = copy.deepcopy(CACHE)
    unknown["spec"]["storage"] = {}
    api = _cluster(unknown)
    await _pass(api)
    assert _ready(api)["reason"] == "SizeUnknown"
    assert "spec.storage.size" in _ready(api)["message"]
    assert CLAIM_KEY not in api.objects and JOB_KEY not in api.objects


async def test_a_claim_deleted_under_a_ready_cache_is_downloaded_again() -> None:
    api = _cluster()
    await _pass(api)
    _job_done(api, "Complete", {"phase": "Complete", "commit": "abc", "bytesTotal": 1})
    await _pass(api)
    assert _status(api)["phase"] == "Ready"
    del api.objects[CLAIM_KEY]
    await _pass(api)
    assert CLAIM_KEY in api.objects
    assert JOB_KEY not in api.objects  # the old Job's result says nothing of the new claim
    assert _ready(api)["reason"] == "ClaimCreated"
    await _pass(api)
    assert JOB_KEY in api.objects


def _service(name: str, cache: str = "tiny") -> dict[str, Any]:
    body = copy.deepcopy(BASE)
    body["metadata"]["name"] = name
    body["metadata"]["uid"] = f"uid-{name}"
    body["spec"]["model"] = {
        "source": {"cache": {"name": cache}},
        "architecture": {
            "numLayers": 2,
            "hiddenSize": 256,
            "numAttentionHeads": 4,
            "numKeyValueHeads": 2,
            "headDim": 64,
            "intermediateSize": 512,
            "vocabSize": 512,
            "maxPositionEmbeddings": 2048,
        },
    }
    return body


async def test_deletion_waits_for_the_services_that_name_the_cache() -> None:
    api = _cluster()
    await _pass(api)
    api.put(_service("chat"))
    api.put(_service("other-cache-user", cache="elsewhere"))
    api.objects[CACHE_KEY]["metadata"]["deletionTimestamp"] = "2026-12-02T09:01:00Z"
    await _pass(api)
    assert api.objects[CACHE_KEY]["metadata"]["finalizers"] == [FINALIZER_MODEL_CACHE]
    assert _status(api)["phase"] == "Deleting"
    assert _status(api)["usedBy"] == ["chat"]
    assert _ready(api)["reason"] == "InUse" and "chat" in _ready(api)["message"]
    del api.objects[(API, "InferenceService", "team-a", "chat")]
    await _pass(api)
    assert api.objects[CACHE_KEY]["metadata"]["finalizers"] == []


async def test_others_finalizers_are_kept() -> None:
    cache = copy.deepcopy(CACHE)
    cache["metadata"]["finalizers"] = ["example.com/backup"]
    api = _cluster(cache)
    await _pass(api)
    assert api.objects[CACHE_KEY]["metadata"]["finalizers"] == [
        "example.com/backup",
        FINALIZER_MODEL_CACHE,
    ]
    api.objects[CACHE_KEY]["metadata"]["deletionTimestamp"] = "2026-12-02T09:01:00Z"
    await _pass(api)
    assert api.objects[CACHE_KEY]["metadata"]["finalizers"] == ["example.com/backup"]


async def test_a_retained_claim_loses_its_owner_before_the_cache_goes() -> None:
    cache = copy.deepcopy(CACHE)
    cache["spec"]["storage"]["retain"] = True
    api = _cluster(cache)
    await _pass(api)
    assert api.objects[CLAIM_KEY]["metadata"]["ownerReferences"]  # created owned
    api.objects[CACHE_KEY]["metadata"]["deletionTimestamp"] = "2026-12-02T09:01:00Z"
    await _pass(api)
    assert "ownerReferences" not in api.objects[CLAIM_KEY]["metadata"]
    assert api.objects[CLAIM_KEY]["spec"]["resources"]["requests"]["storage"] == "1Gi"


async def test_a_pvc_source_is_adopted_once_bound() -> None:
    cache = copy.deepcopy(CACHE)
    cache["spec"] = {"source": {"pvc": {"claimName": "weights", "path": "/llama"}}}
    api = _cluster(cache)
    await _pass(api)
    assert _ready(api)["reason"] == "ClaimNotFound"
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "weights", "namespace": "team-a"},
        "status": {"phase": "Pending"},
    }
    api.put(claim)
    await _pass(api)
    assert _ready(api)["reason"] == "ClaimPending"
    claim["status"]["phase"] = "Bound"
    api.put(claim)
    await _pass(api)
    assert _ready(api)["reason"] == "Adopted"
    assert (_status(api)["claimName"], _status(api)["path"]) == ("weights", "/llama")
    assert not [
        c for c in api.calls if c[0] == "apply" and c[1] in ("Job", "PersistentVolumeClaim")
    ]


async def _serve(api: RecordingCluster, body: dict[str, Any]) -> Any:
    return await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)


def _l4(api: RecordingCluster) -> None:
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "gpu-a", "labels": {"nvidia.com/gpu.product": "NVIDIA-L4"}},
            "status": {"allocatable": {"nvidia.com/gpu": "1"}},
        }
    )


async def test_a_service_waits_for_its_cache_then_serves_from_the_claim_read_only() -> None:
    api = _cluster()
    _l4(api)
    body = _service("chat")
    api.put(body)
    await _pass(api)
    outcome = await _serve(api, body)
    stored = api.objects[(API, "InferenceService", "team-a", "chat")]
    ready = next(c for c in stored["status"]["conditions"] if c["type"] == "Ready")
    reconciling = next(c for c in stored["status"]["conditions"] if c["type"] == "Reconciling")
    assert ready["reason"] == "WaitingForModel" and "ModelCache tiny" in ready["message"]
    assert reconciling["status"] == "True"
    assert not outcome.stalled
    assert api.applied("Deployment") == []
    _job_done(api, "Complete", {"phase": "Complete", "commit": "abc", "bytesTotal": 1})
    await _pass(api)
    await _serve(api, body)
    dep = api.objects[("apps/v1", "Deployment", "team-a", "chat")]
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][0] == "/models/model"
    assert "--revision" not in container["args"]
    assert {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "tiny-weights", "readOnly": True},
    } in pod["volumes"]
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    # Nothing is downloaded by the pod: the cache volume is not sized for weights.
    assert "ephemeral-storage" not in container["resources"]["requests"]
    assert not any(e["name"] == "HF_TOKEN" for e in container.get("env", []))


async def test_a_service_naming_a_missing_or_failed_cache_stalls() -> None:
    api = RecordingCluster()
    _l4(api)
    body = _service("chat")
    api.put(body)
    outcome = await _serve(api, body)
    stored = api.objects[(API, "InferenceService", "team-a", "chat")]
    ready = next(c for c in stored["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ModelCacheNotFound" and outcome.stalled
    api.put(copy.deepcopy(CACHE))
    await _pass(api)
    _job_done(api, "Failed", {"phase": "Failed", "reason": "Unauthorized", "message": "401"})
    await _pass(api)
    await _serve(api, body)
    stored = api.objects[(API, "InferenceService", "team-a", "chat")]
    ready = next(c for c in stored["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ModelCacheFailed" and "Unauthorized" in ready["message"]
    assert api.applied("Deployment") == []


async def test_the_tuner_plans_from_the_config_the_download_read() -> None:
    api = _cluster()
    _l4(api)
    body = _service("chat")
    del body["spec"]["model"]["architecture"]
    api.put(body)
    await _pass(api)
    await _serve(api, body)
    before = api.objects[(API, "InferenceService", "team-a", "chat")]["status"]["tuning"]
    assert before["plannedBy"] == "SpecOnly"  # tiny/llama is in no catalog
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 512,
        "vocab_size": 512,
        "max_position_embeddings": 2048,
        "torch_dtype": "bfloat16",
    }
    _job_done(api, "Complete", {"phase": "Complete", "commit": "abc", "config": config})
    await _pass(api)
    await _serve(api, body)
    stored = api.objects[(API, "InferenceService", "team-a", "chat")]
    tuning = stored["status"]["tuning"]
    assert tuning["plannedBy"] == "Tuner"
    assert api.applied("Deployment") == ["chat"]


def test_the_job_fails_at_once_on_permanent_exit_codes_and_ignores_disruptions() -> None:
    cache = ModelCache.model_validate(CACHE)
    job = build_download_job(cache, image="op:1", resources={})
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0]["action"] == "FailJob"
    assert rules[0]["onExitCodes"]["values"] == sorted(DOWNLOAD_PERMANENT_EXIT_CODES.values())
    assert rules[1] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["fsGroup"] == 65532
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    claim = build_claim(cache, "1Gi", owned=False)
    assert "ownerReferences" not in claim["metadata"]


async def test_a_ready_cache_stays_ready_without_its_token_and_reads_neither() -> None:
    cache = copy.deepcopy(CACHE)
    cache["spec"]["source"]["huggingFace"]["tokenSecretRef"] = {"name": "hub", "key": "token"}
    api = _cluster(cache)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "hub", "namespace": "team-a"},
        "data": {"token": "c2VjcmV0"},
    }
    api.put(secret)
    await _pass(api)
    _job_done(api, "Complete", {"phase": "Complete", "commit": "abc", "bytesTotal": 1})
    await _pass(api)
    assert _status(api)["phase"] == "Ready"
    del api.objects[("v1", "Secret", "team-a", "hub")]
    api.calls.clear()
    await _pass(api)
    assert _status(api)["phase"] == "Ready"
    assert [c for c in api.calls if c[0] == "get"] == [
        ("get", "PersistentVolumeClaim", "tiny-weights")
    ]
