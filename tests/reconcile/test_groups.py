"""A multi-node plan through the whole reconcile (reconcile/groups.py and its hook in
reconcile/inference_service.py), against the recording ClusterAPI: the LeaderWorkerSet in
place of the Deployment, the stall when the cluster lacks the kind, the status counted in
groups, and the benchmark lock holding groups."""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.fakes import RecordingCluster, endpoint_slice
from tests.specs import BASE, lock_job, node
from vllm_operator.k8s.api import ApiError
from vllm_operator.reconcile.groups import LWS_VERSION, as_rollout
from vllm_operator.reconcile.inference_service import reconcile_inference_service
from vllm_operator.settings import OperatorSettings

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
SETTINGS = OperatorSettings(default_image="registry.local/vllm:test")
LWS = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "team-a", "chat")
LLAMA_405B = {"source": {"huggingFace": {"repo": "meta-llama/Llama-3.1-405B-Instruct"}}}
REPO = Path(__file__).resolve().parents[2]


def h100(name: str, gpus: int = 8) -> dict[str, Any]:
    n = node(name, "NVIDIA-H100-80GB-HBM3", 8, 81559, "nvlink")
    n["status"]["allocatable"]["nvidia.com/gpu"] = str(gpus)
    return n


def _cluster(
    *nodes: dict[str, Any], installed: bool = True, **spec: Any
) -> tuple[RecordingCluster, dict[str, Any]]:
    api = RecordingCluster()
    for n in nodes or (h100("h100-1"), h100("h100-2")):
        api.put(n)
    body = copy.deepcopy(BASE)
    body["spec"].update({"model": LLAMA_405B, "warmup": {"enabled": False}, **spec})
    api.put(body)
    if not installed:
        # What the apiserver answers for a LIST of a kind it does not serve.
        api.fail[("list", "LeaderWorkerSet")] = ApiError(
            404, "NotFound", "the server could not find the requested resource"
        )
    return api, body


def _status(api: RecordingCluster) -> dict[str, Any]:
    status: dict[str, Any] = api.objects[
        ("inference.vllm-operator.dev/v1alpha1", "InferenceService", "team-a", "chat")
    ]["status"]
    return status


def _condition(api: RecordingCluster, type_: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in _status(api)["conditions"] if c["type"] == type_)
    return found


async def _reconcile(api: RecordingCluster, body: dict[str, Any]) -> Any:
    return await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)


def _groups_ready(api: RecordingCluster, ready: int, *, generation: int = 1) -> None:
    """The LWS controller's status on the applied LeaderWorkerSet."""
    lws = api.objects[LWS]
    lws["metadata"]["generation"] = generation
    want = lws["spec"]["replicas"]
    lws["status"] = {
        "replicas": want,
        "updatedReplicas": want,
        "readyReplicas": ready,
        "observedGeneration": generation,
    }


async def test_a_multi_node_plan_applies_a_leaderworkerset_and_no_deployment() -> None:
    api, body = _cluster(replicas=2)
    outcome = await _reconcile(api, body)
    assert api.applied("LeaderWorkerSet") == ["chat"]
    assert api.applied("Deployment") == []
    assert api.applied("Service") == ["chat"] and api.applied("PodDisruptionBudget") == ["chat"]
    lws = api.objects[LWS]
    assert lws["spec"]["replicas"] == 2  # groups
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["metadata"]["ownerReferences"][0]["uid"] == BASE["metadata"]["uid"]
    # The workload goes last, after the Service and PDB it serves behind.
    applies = [kind for verb, kind, _ in api.calls if verb == "apply" and "/" not in kind]
    assert applies[-1] == "LeaderWorkerSet"
    assert not outcome.stalled
    ready = _condition(api, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "RollingOut"
    assert ready["message"] == "0 of 2 replicas run the latest pod template."


async def test_without_the_leaderworkerset_crd_the_service_stalls_and_nothing_is_rendered() -> None:
    api, body = _cluster(installed=False)
    outcome = await _reconcile(api, body)
    assert outcome.stalled and not outcome.ready
    stalled = _condition(api, "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "LeaderWorkerSetNotInstalled"
    assert "2 nodes" in stalled["message"] and "docs/multi-node.md" in stalled["message"]
    assert _condition(api, "Ready")["reason"] == "LeaderWorkerSetNotInstalled"
    applied = [kind for verb, kind, _ in api.calls if verb == "apply"]
    assert applied == ["InferenceService/status"], "no Service or PDB without a workload"
    assert [e[0] for e in api.events] == ["LeaderWorkerSetNotInstalled"]


async def test_once_the_crd_is_installed_the_next_pass_renders_the_group() -> None:
    api, body = _cluster(installed=False)
    await _reconcile(api, body)
    del api.fail[("list", "LeaderWorkerSet")]
    await _reconcile(api, body)
    assert api.applied("LeaderWorkerSet") == ["chat"]
    assert _condition(api, "Stalled")["status"] == "False"


async def test_a_single_node_plan_never_reads_leaderworkersets() -> None:
    api, body = _cluster(installed=False, model=BASE["spec"]["model"])
    outcome = await _reconcile(api, body)
    assert not outcome.stalled
    assert api.applied("Deployment") == ["chat"] and api.applied("LeaderWorkerSet") == []
    assert not [c for c in api.calls if c[1] == "LeaderWorkerSet"]


async def test_ready_follows_the_groups_the_leaderworkerset_counts_ready() -> None:
    api, body = _cluster(replicas=2)
    await _reconcile(api, body)
    _groups_ready(api, 1)
    await _reconcile(api, api.objects[("inference.vllm-operator.dev/v1alpha1",
                                       "InferenceService", "team-a", "chat")])  # fmt: skip
    ready = _condition(api, "Ready")
    assert ready["status"] == "False" and ready["message"] == "1 of 2 replicas are ready."
    assert _status(api)["readyReplicas"] == 1 and _status(api)["replicas"] == 2
    _groups_ready(api, 2)
    # The Service routes to the leaders once its EndpointSlice lists them.
    api.put(endpoint_slice("team-a", "chat", ready=2))
    outcome = await _reconcile(api, body)
    assert outcome.ready
    assert _condition(api, "Ready")["reason"] == "AllReplicasReady"
    assert _status(api)["readyReplicas"] == 2 and _status(api)["desiredReplicas"] == 2


async def test_a_group_status_not_yet_observed_is_not_ready() -> None:
    api, body = _cluster()
    # With the runtime's memo of what was applied, an unchanged LeaderWorkerSet is not
    # applied again (the recording fake would drop its generation) and is read as it is.
    memo: dict[Any, tuple[str, str]] = {}
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW, applied=memo)
    _groups_ready(api, 1, generation=1)
    api.objects[LWS]["metadata"]["generation"] = 2  # changed since the controller looked
    outcome = await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW, applied=memo)
    assert api.applied("LeaderWorkerSet") == ["chat"], "applied once"
    assert not outcome.ready
    message = _condition(api, "Ready")["message"]
    assert message == "The LeaderWorkerSet controller has not seen the latest change yet."


async def test_a_benchmark_lock_holds_the_running_groups() -> None:
    api, body = _cluster(replicas=3)
    await _reconcile(api, body)
    api.put(lock_job())
    body["spec"]["replicas"] = 1
    api.put(body)
    await _reconcile(api, body)
    assert api.objects[LWS]["spec"]["replicas"] == 3, "never fewer groups under a benchmark"
    assert _condition(api, "ScaleDownBlocked")["status"] == "True"
    del api.objects[("batch/v1", "Job", "team-a", "load-load")]
    await _reconcile(api, body)
    assert api.objects[LWS]["spec"]["replicas"] == 1


async def test_a_leaderworkerset_of_the_name_that_is_not_ours_is_left_alone() -> None:
    api, body = _cluster()
    foreign = {
        "apiVersion": LWS[0],
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": "chat",
            "namespace": "team-a",
            "labels": {"inference.vllm-operator.dev/inference-service": "chat"},
        },
        "spec": {"replicas": 5},
    }
    api.put(foreign)
    outcome = await _reconcile(api, body)
    assert outcome.stalled
    assert _condition(api, "Stalled")["reason"] == "LeaderWorkerSetConflict"
    assert api.applied("LeaderWorkerSet") == []
    assert api.objects[LWS]["spec"]["replicas"] == 5


async def test_too_few_nodes_with_free_gpus_for_a_group_stall() -> None:
    # Two nodes of eight GPUs each, one of them with four allocatable only.
    api, body = _cluster(h100("h100-1"), h100("h100-2", gpus=4))
    outcome = await _reconcile(api, body)
    stalled = _condition(api, "Stalled")
    assert outcome.stalled and stalled["reason"] == "NotEnoughNodesForGroup"
    assert "2 pods on 2 nodes with 8 GPUs each" in stalled["message"]
    assert "1 schedulable node has" in stalled["message"]


def test_the_group_status_reads_as_a_rollout_in_groups() -> None:
    lws = {
        "metadata": {"generation": 4},
        "spec": {"replicas": 3},
        "status": {"replicas": 3, "readyReplicas": 2, "updatedReplicas": 3,
                   "observedGeneration": 4},
    }  # fmt: skip
    assert as_rollout(lws) == {
        "kind": "LeaderWorkerSet",
        "metadata": {"generation": 4},
        "spec": {"replicas": 3},
        "status": {"observedGeneration": 4, "replicas": 3, "readyReplicas": 2,
                   "updatedReplicas": 3, "availableReplicas": 2},
    }  # fmt: skip
    assert as_rollout(None) is None


def test_the_version_named_is_the_one_the_cluster_tier_builds() -> None:
    env = (REPO / "devenv" / "cluster" / "versions.env").read_text()
    pinned = re.search(r"^LWS_VERSION=(\S+)$", env, flags=re.M)
    assert pinned is not None and pinned.group(1) == LWS_VERSION
