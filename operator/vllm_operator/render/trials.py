"""What an InferenceTuning creates, as manifests: a trial's InferenceService (strategy
Beside), a trial's InferenceBenchmark, and an InPlace run's scale-down lock Job.

Every one is named from the tuning's name and the trial's (``<tuning>-<trial>``, the lock
``<tuning>-lock``), so that a restarted operator finds them by name, and carries a
controller owner reference to the tuning, so that garbage collection removes them when
the tuning is deleted (no finalizer). Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from vllm_operator.constants import (
    API_VERSION,
    KIND_INFERENCE_BENCHMARK,
    KIND_INFERENCE_SERVICE,
    KIND_INFERENCE_TUNING,
    LABEL_LOCK_TARGET,
    LABEL_SCALE_DOWN_LOCK,
    LABEL_TRIAL,
    LABEL_TUNING,
)
from vllm_operator.models import InferenceService, InferenceTuning
from vllm_operator.models.base import LocalObjectReference, Manifest
from vllm_operator.models.inference_benchmark import (
    ArrivalSpec,
    BenchmarkWorkload,
    InferenceBenchmarkSpec,
    SearchSpec,
)
from vllm_operator.models.workload import SLO
from vllm_operator.render.meta import controller_reference, job_labels, restricted_security_context

APP: Final = "vllm-tuning"


def trial_object_name(tuning: InferenceTuning, trial: str) -> str:
    """The name of a trial's InferenceService and InferenceBenchmark."""
    return f"{tuning.metadata.name}-{trial}"


def lock_job_name(tuning: InferenceTuning) -> str:
    """The name of an InPlace run's lock Job."""
    return f"{tuning.metadata.name}-lock"


def tuning_labels(tuning: InferenceTuning, component: str, trial: str | None = None) -> Manifest:
    labels = job_labels(APP, LABEL_TUNING, tuning.metadata.name, component)
    if trial is not None:
        labels[LABEL_TRIAL] = trial
    return labels


def _owned(tuning: InferenceTuning) -> list[Manifest]:
    meta = tuning.metadata
    return [controller_reference(KIND_INFERENCE_TUNING, meta.name, meta.uid)]


def _metadata(tuning: InferenceTuning, name: str, component: str, trial: str | None) -> Manifest:
    return {
        "name": name,
        "namespace": tuning.metadata.namespace,
        "labels": tuning_labels(tuning, component, trial),
        "ownerReferences": _owned(tuning),
    }


def build_trial_service(
    tuning: InferenceTuning, target: InferenceService, trial: str, overrides: Mapping[str, str]
) -> Manifest:
    """A trial's InferenceService: the target's spec with the trial's overrides over the
    target's own, one replica, autoscaling off (a trial measures one replica; nothing
    scales it under the load)."""
    spec = target.spec.model_copy(deep=True)
    spec.replicas = 1
    spec.autoscaling = spec.autoscaling.model_copy(update={"enabled": False})
    spec.tuning = spec.tuning.model_copy(
        update={"overrides": {**target.spec.tuning.overrides, **overrides}}
    )
    return {
        "apiVersion": API_VERSION,
        "kind": KIND_INFERENCE_SERVICE,
        "metadata": _metadata(tuning, trial_object_name(tuning, trial), "trial", trial),
        "spec": spec.to_wire(),
    }


def build_trial_benchmark(
    tuning: InferenceTuning,
    trial: str,
    *,
    target: str,
    workload: BenchmarkWorkload,
    slo: SLO,
    search: SearchSpec,
) -> Manifest:
    """A trial's InferenceBenchmark: a Search of ``target`` (the trial's InferenceService,
    or the target itself in place) with the tuning's measure, over ``search`` (whose lowest
    rate is the incumbent's goodput for a candidate). Validated as the apiserver would."""
    measure = tuning.spec.measure
    arrival = measure.arrival or ArrivalSpec(
        process="Poisson", rate_per_second=search.min_rate_per_second
    )
    spec = InferenceBenchmarkSpec(
        target_ref=LocalObjectReference(name=target),
        workload=workload,
        arrival=arrival,
        duration_seconds=measure.duration_seconds,
        requests=measure.requests,
        slo=slo,
        mode="Search",
        search=search,
        endpoint=measure.endpoint,
        seed=measure.seed,
        max_error_fraction=measure.max_error_fraction,
    )
    return {
        "apiVersion": API_VERSION,
        "kind": KIND_INFERENCE_BENCHMARK,
        "metadata": _metadata(tuning, trial_object_name(tuning, trial), "trial-benchmark", trial),
        "spec": spec.to_wire(),
    }


def build_lock_job(tuning: InferenceTuning, *, target: str, image: str) -> Manifest:
    """The scale-down lock of an InPlace run: a suspended Job (no pod ever runs) carrying
    the lock's two labels. A Job holds the lock until it has finished (reconcile/lock.py,
    and the chart's admission policy); a suspended one never finishes, so the lock holds
    until the run deletes the Job at its end, or garbage collection does with the tuning."""
    name = lock_job_name(tuning)
    meta = _metadata(tuning, name, "scale-down-lock", None)
    meta["labels"] |= {LABEL_SCALE_DOWN_LOCK: "true", LABEL_LOCK_TARGET: target}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "suspend": True,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": tuning_labels(tuning, "scale-down-lock")},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "securityContext": {"runAsNonRoot": True},
                    "containers": [
                        {
                            "name": "lock",
                            "image": image,
                            "command": ["true"],
                            "securityContext": restricted_security_context(),
                            "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}},
                        }
                    ],
                },
            },
        },
    }
