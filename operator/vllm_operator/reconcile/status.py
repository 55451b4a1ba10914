"""The InferenceService's status, computed as a whole from the spec and what was observed.

Pure: no I/O, the clock passed in. The reconcile writes the result only when it differs
from what is stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from vllm_operator.constants import WARMED_UP_CONDITION
from vllm_operator.models import InferenceService, InferenceServiceStatus
from vllm_operator.models.base import Manifest
from vllm_operator.models.conditions import condition, manifest_condition, pod_condition
from vllm_operator.models.inference_service import (
    BenchmarkSummary,
    EffectiveTuning,
    RolloutStatus,
    WarmupStatus,
)
from vllm_operator.reconcile.adapters import AdaptersObserved
from vllm_operator.reconcile.measured import MeasuredChoice
from vllm_operator.reconcile.pods import PodProblem, pod_problem
from vllm_operator.reconcile.rollout import RolloutChoice
from vllm_operator.render.deployment import served_model_name
from vllm_operator.render.meta import selector_string, service_name
from vllm_operator.render.service import endpoint_url


@dataclass(frozen=True)
class Problem:
    """Why the spec cannot be satisfied as it stands (Stalled=True)."""

    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """What the reconcile saw and decided, as input to the status."""

    tuning: EffectiveTuning
    desired_replicas: int
    deployment: Manifest | None = None
    pods: list[Manifest] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    scale_down_blocked_by: str | None = None
    warmup: WarmupStatus | None = None
    # From the warmup orchestration, when it ran: pods warmed now, and why others failed.
    warmed: int | None = None
    warmup_failures: list[str] = field(default_factory=list)
    last_benchmark: BenchmarkSummary | None = None
    # The LoRA adapters on the running servers, when the plan has LoRA on.
    adapters: AdaptersObserved | None = None
    # How the pods roll out (spec.rollout), when a Deployment is rendered.
    rollout: RolloutChoice | None = None
    # What the service waits for before anything is rolled out (a ModelCache still
    # downloading): Ready=False and Reconciling=True with its reason, not Stalled.
    waiting: Problem | None = None
    # The kind ``deployment`` is (a multi-node plan's LeaderWorkerSet, read by
    # reconcile/groups.py in a Deployment's shape, counted in groups), for the messages.
    workload: str = "Deployment"
    # The ready endpoints the Service's EndpointSlices list (None: not read). Ready waits
    # for one: a Service routes to a ready pod only once its EndpointSlice lists it.
    endpoints: int | None = None
    # The measured result the arguments come from, or the one asked for and why it is
    # not applied (reconcile/measured.py): status.measuredFrom and the Tuned condition;
    # None when none is asked for (neither is shown).
    measured: MeasuredChoice | None = None


# The label the EndpointSlice controller puts on each slice: the Service's name.
SLICE_SERVICE_LABEL = "kubernetes.io/service-name"


def ready_endpoints(slices: list[Manifest], service: str) -> int:
    """The ready endpoints the EndpointSlices of Service ``service`` list. An endpoint
    whose ``ready`` is unset counts as ready, as the EndpointSlice API says consumers must
    read it."""
    return sum(
        1
        for s in slices
        if ((s.get("metadata") or {}).get("labels") or {}).get(SLICE_SERVICE_LABEL) == service
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready") is not False
    )


def _live(pods: list[Manifest]) -> list[Manifest]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _rollout(
    deployment: Manifest | None, desired: int, kind: str = "Deployment"
) -> tuple[bool, int, str]:
    """(complete, ready replicas, what is still going on)."""
    if deployment is None:
        return False, 0, f"The {kind} does not exist yet."
    meta, status = deployment["metadata"], deployment.get("status", {})
    ready = int(status.get("readyReplicas", 0))
    if int(status.get("observedGeneration", 0)) < int(meta.get("generation", 0)):
        return False, ready, f"The {kind} controller has not seen the latest change yet."
    updated = int(status.get("updatedReplicas", 0))
    total = int(status.get("replicas", 0))
    available = int(status.get("availableReplicas", 0))
    if updated < desired:
        return (
            False,
            ready,
            (
                f"{updated} of {desired} replicas run the latest pod template."
                + _replica_failure(deployment)
            ),
        )
    if total > desired:
        return False, ready, f"{total - desired} old replicas are still terminating."
    if available < desired:
        return False, ready, f"{ready} of {desired} replicas are ready."
    return True, ready, f"{ready} of {desired} replicas are ready."


def _replica_failure(workload: Manifest) -> str:
    """ " Pods cannot be created: <why>" while the workload's controller is refused its pods
    (PodSecurity, a quota, an admission policy): a rollout that is not merely slow."""
    cond = manifest_condition(workload, "ReplicaFailure") or {}
    if cond.get("status") != "True":
        return ""
    why = str(cond.get("message") or cond.get("reason") or "")
    return f" Pods cannot be created: {why[:600]}"


def _warmed_up(cond: Any, warmup_on: bool, warmed: int, desired: int, failed: list[str]) -> Any:
    if not warmup_on:
        message = "Warmup is disabled; pods take traffic once /health answers."
        return cond("WarmedUp", True, "WarmupDisabled", message)
    progress = f"{warmed} of {desired} replicas are warmed up."
    if warmed >= desired:
        return cond("WarmedUp", True, "AllReplicasWarmedUp", progress)
    if failed:
        return cond("WarmedUp", False, "WarmupFailed", "; ".join(failed)[:1000])
    return cond("WarmedUp", False, "WarmingUp", progress)


def compute_status(
    isvc: InferenceService, observed: Observed, *, now: datetime
) -> InferenceServiceStatus:
    """The whole status of ``isvc`` from what was observed."""
    previous = isvc.status.conditions if isvc.status else []
    gen = isvc.metadata.generation
    desired = observed.desired_replicas
    pods = _live(observed.pods)
    complete, ready, progress = _rollout(observed.deployment, desired, observed.workload)
    warmup_on = isvc.spec.warmup.enabled
    if not warmup_on:
        warmed = ready
    elif observed.warmed is not None:
        warmed = observed.warmed
    else:
        warmed = sum(pod_condition(p, WARMED_UP_CONDITION) for p in pods)
    failed = observed.warmup_failures
    stalled = observed.problems[0] if observed.problems else None
    # Why the pods are not ready, while the rollout is not complete (a crash loop, an image
    # that cannot be pulled, a pod that cannot be scheduled).
    trouble = None if complete else pod_problem(observed.deployment, pods)
    if trouble is not None and trouble.reason == "Unschedulable" and _surging(observed):
        trouble = PodProblem(
            trouble.reason,
            f"{trouble.message.rstrip('.')}. It is the rollout's surge pod (spec.rollout: "
            "Surge): spec.rollout Replace (one replica stopped first) or room for one more "
            "replica lets the rollout through.",
            trouble.stalled,
        )
    if stalled is None and trouble is not None and trouble.stalled:
        stalled = Problem(trouble.reason, trouble.message)

    def cond(type_: str, status: bool, reason: str, message: str) -> Any:
        return condition(type_, status, reason, message, now=now, generation=gen, previous=previous)

    if stalled is not None:
        ready_cond = cond("Ready", False, stalled.reason, stalled.message)
    elif observed.waiting is not None:
        ready_cond = cond("Ready", False, observed.waiting.reason, observed.waiting.message)
        progress = observed.waiting.message
    elif desired == 0 and complete:
        ready_cond = cond("Ready", True, "ScaledToZero", "No replicas are wanted.")
    elif complete and desired > 0 and observed.endpoints == 0:
        progress = (
            f"{progress.rstrip('.')}; the Service {service_name(isvc)} does not list any of "
            "them as a ready endpoint yet."
        )
        ready_cond = cond("Ready", False, "AwaitingEndpoints", progress)
    elif complete:
        ready_cond = cond("Ready", True, "AllReplicasReady", progress)
    elif observed.deployment is None:
        ready_cond = cond("Ready", False, "Creating", progress)
    elif trouble is not None:
        ready_cond = cond("Ready", False, trouble.reason, trouble.message)
    elif warmup_on and failed and ready < desired:
        ready_cond = cond("Ready", False, "WarmupFailed", failed[0])
    elif (
        warmup_on
        and ready < desired
        and warmed < desired
        and pods
        and all(pod_condition(p, "ContainersReady") for p in pods)
    ):
        ready_cond = cond(
            "Ready", False, "WarmingUp", f"{warmed} of {desired} replicas are warmed up."
        )
    else:
        ready_cond = cond("Ready", False, "RollingOut", progress)

    conditions = [
        ready_cond,
        cond(
            "Reconciling",
            stalled is None and ready_cond.status != "True",
            ready_cond.reason if ready_cond.status != "True" else "Reconciled",
            (progress if trouble is None else trouble.message)
            if ready_cond.status != "True"
            else "Nothing left to do.",
        ),
        cond(
            "Stalled",
            stalled is not None,
            stalled.reason if stalled else "NoProblems",
            stalled.message if stalled else "The spec can be satisfied.",
        ),
        _warmed_up(cond, warmup_on, warmed, desired, failed),
        cond(
            "ScaleDownBlocked",
            observed.scale_down_blocked_by is not None,
            "BenchmarkRunning" if observed.scale_down_blocked_by else "NoBenchmarkRunning",
            f"InferenceBenchmark {observed.scale_down_blocked_by} is running; replicas "
            "will not go down until it ends."
            if observed.scale_down_blocked_by
            else "Replicas may go down.",
        ),
    ]
    if observed.adapters is not None:
        seen = observed.adapters
        conditions.append(cond("AdaptersLoaded", seen.ok, seen.reason, seen.message))
    measured = observed.measured
    if measured is not None:
        conditions.append(cond("Tuned", measured.applied, measured.reason, measured.message))
    deployment_status = (observed.deployment or {}).get("status", {})
    last_benchmark = observed.last_benchmark
    return InferenceServiceStatus(
        observed_generation=gen,
        conditions=conditions,
        replicas=int(deployment_status.get("replicas", 0)),
        desired_replicas=desired,
        ready_replicas=ready,
        warmed_replicas=warmed,
        selector=selector_string(isvc),
        endpoint=endpoint_url(isvc),
        served_model_name=served_model_name(isvc),
        tuning=observed.tuning,
        warmup=observed.warmup,
        last_benchmark=last_benchmark,
        adapters=observed.adapters.statuses if observed.adapters is not None else None,
        rollout=(
            RolloutStatus(strategy=observed.rollout.strategy, message=observed.rollout.message)
            if observed.rollout is not None
            else None
        ),
        measured_from=measured.status() if measured is not None else None,
    )


def _surging(observed: Observed) -> bool:
    """A Surge rollout under way: pods of the old template still run beside the new."""
    status = (observed.deployment or {}).get("status") or {}
    return (
        observed.rollout is not None
        and observed.rollout.strategy == "Surge"
        and int(status.get("replicas") or 0) > int(status.get("updatedReplicas") or 0)
    )
