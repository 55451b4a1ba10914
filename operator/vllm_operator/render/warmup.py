"""The warmup Job of one pod: ``vllm-operator warmup`` against that pod's vLLM server.

One Job per container incarnation of a pod: its name is derived from the pod's uid and
the container's restart count, so a restarted container is warmed again, a restarted
operator finds the Job it already made, and two are never made for the same pod. The
Job is owned by the pod, so deleting the pod (mid-warmup or not) deletes the Job.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

from vllm_operator.constants import (
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_WARMUP_FOR,
    MANAGED_BY,
    PREFIX,
)
from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.models.inference_service import EffectiveTuning
from vllm_operator.render.adapters import loadable
from vllm_operator.render.deployment import served_model_name
from vllm_operator.render.meta import SERVER_PORT, restricted_security_context

ANNOTATION_POD: Final = f"{PREFIX}/warmup-pod"
ANNOTATION_RESTARTS: Final = f"{PREFIX}/warmup-restarts"
COMPONENT: Final = "warmup"
# Finished Jobs linger an hour for kubectl describe, then go by TTL.
TTL_SECONDS: Final = 3600
# The arguments of the plan that tell warmup which shapes the server will meet.
_PLAN_FLAGS: Final = ("max-model-len", "max-num-seqs", "max-num-batched-tokens")


def warmup_job_name(isvc: InferenceService, pod: Manifest, restarts: int) -> str:
    """Deterministic, short (a Job name labels its pods, so at most 63 characters)."""
    digest = hashlib.sha256(f"{pod['metadata']['uid']}/{restarts}".encode()).hexdigest()[:10]
    return f"{isvc.metadata.name[:40]}-warmup-{digest}"


def container_restarts(pod: Manifest) -> int:
    statuses = pod.get("status", {}).get("containerStatuses", [])
    return sum(int(s.get("restartCount", 0)) for s in statuses)


def _plan_args(tuning: EffectiveTuning) -> list[str]:
    values = {a.name: a.value for a in tuning.arguments}
    args: list[str] = []
    for flag in _PLAN_FLAGS:
        if flag in values and values[flag].isdigit():
            args += [f"--{flag}", values[flag]]
    capture = values.get("cuda-graph-sizes") or values.get("cudagraph-capture-sizes")
    if capture:
        args += ["--cudagraph-capture-sizes", capture.replace(" ", ",")]
    return args


def build_warmup_job(
    isvc: InferenceService,
    pod: Manifest,
    tuning: EffectiveTuning,
    *,
    image: str,
    resources: Manifest,
    restarts: int,
) -> Manifest:
    """The Job that warms ``pod`` (whose container has restarted ``restarts`` times);
    ``resources`` are its container's (the operator's setting)."""
    meta = pod["metadata"]
    warmup = isvc.spec.warmup
    pod_ip = pod.get("status", {}).get("podIP")
    if not pod_ip:
        raise ValueError(f"pod {meta['name']} has no IP yet")
    endpoint = f"http://{pod_ip}:{SERVER_PORT}"
    labels = {
        LABEL_NAME: "vllm",
        LABEL_INSTANCE: isvc.metadata.name,
        LABEL_COMPONENT: COMPONENT,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_WARMUP_FOR: isvc.metadata.name,
    }
    container: dict[str, Any] = {
        "name": "warmup",
        "image": image,
        "command": ["vllm-operator", "warmup"],
        "args": [
            "--endpoint",
            endpoint,
            "--model",
            served_model_name(isvc),
            "--budget",
            str(warmup.timeout_seconds),
            *_plan_args(tuning),
            *(f"--adapter={name}={path}" for name, path in loadable(isvc, tuning)),
        ],
        "resources": resources,
        "terminationMessagePolicy": "File",
        "securityContext": restricted_security_context(),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": warmup_job_name(isvc, pod, restarts),
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": {ANNOTATION_POD: meta["name"], ANNOTATION_RESTARTS: str(restarts)},
            # Owned by the pod, not the InferenceService: the Job goes with its pod.
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": False,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": {
            # Attempts after the first; each gets the whole budget.
            "backoffLimit": warmup.max_retries,
            "activeDeadlineSeconds": warmup.timeout_seconds * (warmup.max_retries + 1) + 60,
            "ttlSecondsAfterFinished": TTL_SECONDS,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "containers": [container],
                },
            },
        },
    }
