"""Pod failures become the service's conditions: each reason from the container states,
the log tail and the Deployment, stalled only when no progress can come without a change.

The pod statuses are shaped as the kubelet writes them; the real node produces each of the
ones it can for real in e2e/test_pod_failures.py (no GPU there: the GPU and gated-model log
lines here are the messages torch and huggingface_hub print)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tests.specs import isvc as make_isvc
from tests.specs import plan_for
from vllm_operator.models.conditions import find
from vllm_operator.reconcile.pods import PodProblem, pod_problem
from vllm_operator.reconcile.status import Observed, compute_status

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def pod(name: str = "svc-abc", *, ready: bool = False, **container: Any) -> dict[str, Any]:
    status = {"name": "vllm", "ready": ready, "restartCount": 0, "image": "img:1", **container}
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "vllm", "resources": {"limits": {"memory": "6400Mi"}}}]},
        "status": {
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
            "containerStatuses": [status],
        },
    }


def crashed(log: str, *, looping: bool = True, reason: str = "Error", code: int = 1) -> Any:
    terminated = {"exitCode": code, "reason": reason, "message": log}
    if looping:
        return pod(
            state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
            lastState={"terminated": terminated},
            restartCount=2,
        )
    return pod(state={"terminated": terminated})


UNKNOWN_FLAG = (
    "INFO 12-01 21:40:02 [__init__.py:216] Automatically detected platform cpu.\n"
    "usage: vllm serve [model_tag] [options]\n"
    "vllm: error: unrecognized arguments: --swap-space 4\n"
)
CUDA_OOM = (
    "ERROR 12-01 [core.py:700] EngineCore failed to start.\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
    "total capacity of 79.19 GiB of which 1.05 GiB is free.\n"
    "RuntimeError: Engine core initialization failed. See root cause above.\n"
)
GATED = (
    "huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-abc)\n"
    "Cannot access gated repo for url https://huggingface.co/meta-llama/Llama-3.1-8B/resolve"
    "/main/config.json.\nAccess to model meta-llama/Llama-3.1-8B is restricted.\n"
)
# Both from the real node (e2e/test_pod_failures.py): vLLM 0.32.0 CPU, a model path the
# image lacks, which huggingface_hub then reads as a repository id.
NO_PATH = (
    "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
    "'namespace/repo_name': '/models/no-such-model'. Use `repo_type` argument if needed.\n"
)
OFFLINE = (
    "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find the requested files in the "
    "disk cache and outgoing traffic has been disabled.\n"
)
KV = (
    "ValueError: To serve at least one request with the models's max seq len (131072), "
    "(16.00 GiB KV cache is needed, which is larger than the available KV cache memory "
    "(9.50 GiB).\n"
)


@pytest.mark.parametrize(
    ("log", "reason"),
    [
        (UNKNOWN_FLAG, "InvalidArgument"),
        (CUDA_OOM, "GPUOutOfMemory"),
        (GATED, "ModelAccessDenied"),
        (OFFLINE, "ModelNotFound"),
        (NO_PATH, "ModelNotFound"),
        (KV, "KVCacheDoesNotFit"),
        ("Traceback (most recent call last):\nSomethingElse: boom\n", "ContainerExited"),
    ],
)
def test_the_log_tail_names_the_cause_and_the_line(log: str, reason: str) -> None:
    found = pod_problem(None, [crashed(log)])
    assert found is not None and found.reason == reason and found.stalled
    assert "Pod svc-abc, container vllm exited (1)" in found.message or reason == "ContainerExited"
    line = {
        "InvalidArgument": "unrecognized arguments: --swap-space 4",
        "GPUOutOfMemory": "CUDA out of memory. Tried to allocate 2.00 GiB",
        "ModelAccessDenied": "Access to model meta-llama/Llama-3.1-8B is restricted",
        "ModelNotFound": "outgoing traffic has been disabled"
        if log == OFFLINE
        else "Repo id must be in the form",
        "KVCacheDoesNotFit": "larger than the available KV cache memory",
        "ContainerExited": 'Last log line: "SomethingElse: boom".',
    }[reason]
    assert line in found.message
    assert "CrashLoopBackOff" in found.message


def test_the_first_exit_is_on_its_way_the_loop_is_stalled() -> None:
    first = pod_problem(None, [crashed(UNKNOWN_FLAG, looping=False)])
    assert first == PodProblem(first.reason, first.message, False)  # type: ignore[union-attr]
    assert first is not None and first.reason == "InvalidArgument"
    assert "The kubelet restarts it" in first.message
    # Running again after a crash, not ready yet: the last exit still says why.
    again = pod(state={"running": {}}, lastState={"terminated": {"exitCode": 2,
                "message": UNKNOWN_FLAG}}, restartCount=1)  # fmt: skip
    found = pod_problem(None, [again])
    assert found is not None and found.reason == "InvalidArgument" and not found.stalled
    # Running again after the second restart: looping, stalled between back-offs too.
    again["status"]["containerStatuses"][0]["restartCount"] = 2
    looping = pod_problem(None, [again])
    assert looping is not None and looping.stalled and "CrashLoopBackOff" in looping.message


def test_host_memory_oom_names_the_limit() -> None:
    found = pod_problem(None, [crashed("", reason="OOMKilled", code=137)])
    assert found is not None and found.reason == "OOMKilled" and found.stalled
    assert "memory limit of 6400Mi" in found.message and "spec.node.memory" in found.message


def test_image_pulls_stall_once_the_kubelet_backs_off() -> None:
    def pulling(why: str) -> Any:
        return pod(state={"waiting": {"reason": why, "message": "connection refused"}})

    first = pod_problem(None, [pulling("ErrImagePull")])
    assert first is not None and first.reason == "ImagePullFailed" and not first.stalled
    assert "img:1" in first.message and "connection refused" in first.message
    for why in ("ImagePullBackOff", "InvalidImageName"):
        found = pod_problem(None, [pulling(why)])
        assert found is not None and found.reason == "ImagePullFailed" and found.stalled


def test_unschedulable_waits_for_the_progress_deadline() -> None:
    p = pod()
    p["status"] = {
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/5 nodes are available: 1 Insufficient memory.",
            }
        ]
    }
    found = pod_problem(None, [p])
    assert found is not None and found.reason == "Unschedulable" and not found.stalled
    assert "1 Insufficient memory" in found.message
    late = {
        "spec": {"progressDeadlineSeconds": 900},
        "status": {
            "conditions": [
                {
                    "type": "Progressing",
                    "status": "False",
                    "reason": "ProgressDeadlineExceeded",
                    "message": "ReplicaSet svc-1 has timed out progressing.",
                }
            ]
        },
    }
    stalled = pod_problem(late, [p])
    assert stalled is not None and stalled.reason == "Unschedulable" and stalled.stalled
    assert "no progress for 900 s" in stalled.message
    alone = pod_problem(late, [])
    assert alone is not None and alone.reason == "ProgressDeadlineExceeded" and alone.stalled
    assert "timed out progressing" in alone.message


def test_ready_pods_and_healthy_starts_are_no_problem() -> None:
    # Ready after an old crash: its lastState is history.
    recovered = pod(ready=True, state={"running": {}}, restartCount=1,
                    lastState={"terminated": {"exitCode": 137, "reason": "OOMKilled"}})  # fmt: skip
    starting = pod(state={"running": {}})
    creating = pod(state={"waiting": {"reason": "ContainerCreating"}})
    assert pod_problem(None, [recovered, starting, creating]) is None
    gone = crashed(UNKNOWN_FLAG)
    gone["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert pod_problem(None, [gone]) is None


def test_a_stalled_pod_comes_before_one_on_its_way_and_the_answer_is_stable() -> None:
    a = crashed(UNKNOWN_FLAG, looping=False)
    a["metadata"]["name"] = "svc-a"
    b = crashed(CUDA_OOM)
    b["metadata"]["name"] = "svc-b"
    assert pod_problem(None, [a, b]).reason == "GPUOutOfMemory"  # type: ignore[union-attr]
    assert pod_problem(None, [b, a]) == pod_problem(None, [a, b])


def _status(pods: list[Any], deployment: dict[str, Any]) -> Any:
    svc = make_isvc()
    tuning = plan_for(svc)
    observed = Observed(tuning=tuning, desired_replicas=1, deployment=deployment, pods=pods)
    return compute_status(svc, observed, now=NOW)


def _deployment(**status: Any) -> dict[str, Any]:
    return {"metadata": {"generation": 1}, "spec": {}, "status": {"observedGeneration": 1,
            "replicas": 1, "updatedReplicas": 1, **status}}  # fmt: skip


def test_the_conditions_say_stalled_or_reconciling_with_the_pods_reason() -> None:
    looping = _status([crashed(UNKNOWN_FLAG)], _deployment())
    ready, stalled, rec = (find(looping.conditions, t) for t in ("Ready", "Stalled", "Reconciling"))
    assert ready.reason == stalled.reason == "InvalidArgument"  # type: ignore[union-attr]
    assert stalled.status == "True" and rec.status == "False"  # type: ignore[union-attr]
    assert "unrecognized arguments" in ready.message  # type: ignore[union-attr]
    first = _status([crashed(UNKNOWN_FLAG, looping=False)], _deployment())
    ready, stalled, rec = (find(first.conditions, t) for t in ("Ready", "Stalled", "Reconciling"))
    assert ready.reason == rec.reason == "InvalidArgument"  # type: ignore[union-attr]
    assert stalled.status == "False" and rec.status == "True"  # type: ignore[union-attr]
    assert "unrecognized arguments" in rec.message  # type: ignore[union-attr]
    # A complete rollout reads no pod: an old pod's state is not the service's.
    done = _status([crashed(UNKNOWN_FLAG)], _deployment(readyReplicas=1, availableReplicas=1))
    assert find(done.conditions, "Ready").status == "True"  # type: ignore[union-attr]
