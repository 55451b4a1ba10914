"""The scale-down lock: while a benchmark measures a service, the service does not lose
replicas under it.

A lock Job is any Job labelled ``scale-down-lock=true`` and ``lock-target=<service>``
(constants.py): the load Job of an InferenceBenchmark carries both
(render/benchmark.py), and anyone else's Job may too. The lock holds while such a Job
has not finished and is not being deleted. The chart's ValidatingAdmissionPolicy refuses
replica decreases of the target meanwhile; the operator's own writers read the lock here:
the service reconcile (its Deployment's rollout and HPA, status.scaleDownBlockedBy) and
the autoscaler (a scale-down held). The benchmark reconcile starts and ends a lock by
its load Job, and says so in its status (:func:`held_note`).

Shared by those reconciles, which do not import each other (pyproject's independence
contract)."""

from __future__ import annotations

from vllm_operator.constants import LABEL_BENCHMARK, LABEL_LOCK_TARGET, LABEL_SCALE_DOWN_LOCK
from vllm_operator.k8s.api import ClusterAPI
from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.reconcile.jobs import job_state


def lock_selector(isvc: InferenceService) -> str:
    """The Jobs that may hold a scale-down lock on ``isvc``: ours, or anyone's that carry
    the two labels."""
    return f"{LABEL_SCALE_DOWN_LOCK}=true,{LABEL_LOCK_TARGET}={isvc.metadata.name}"


def lock_holder(jobs: list[Manifest]) -> str | None:
    """Of the lock Jobs, the benchmark whose unfinished one holds the lock (the Job's own
    name when it names no benchmark)."""
    for job in jobs:
        if job["metadata"].get("deletionTimestamp") or job_state(job) != "Running":
            continue
        labels = job["metadata"].get("labels") or {}
        return str(labels.get(LABEL_BENCHMARK) or job["metadata"]["name"])
    return None


async def list_lock_jobs(api: ClusterAPI, isvc: InferenceService) -> list[Manifest]:
    return await api.list(
        "batch/v1", "Job", isvc.metadata.namespace, label_selector=lock_selector(isvc)
    )


async def active_lock(api: ClusterAPI, isvc: InferenceService) -> str | None:
    """The benchmark whose unfinished load Job holds a scale-down lock on ``isvc``."""
    return lock_holder(await list_lock_jobs(api, isvc))


def held_note(target: str) -> str:
    """What a benchmark's status says of the lock its running load Job holds."""
    return f"InferenceService {target} cannot scale down until it ends."
