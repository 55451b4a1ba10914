"""Warmup-gated readiness: a warmup Job per pod, then the pod's readiness gate.

For each server pod whose vLLM answers /health (ContainersReady), the operator makes the
pod's warmup Job; when the Job succeeds it sets the pod's condition
``inference.vllm-operator.dev/warmed-up`` to True, so the pod becomes Ready and joins the
Service. A failed Job (after its own bounded retries) leaves the condition False with the
reason. A restarted container makes a new incarnation: its condition goes back to False
and it is warmed again. The condition's message names the Job that warmed the pod, which
is how the operator tells a current warmup from one of an earlier incarnation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from vllm_operator.constants import LABEL_WARMUP_FOR, WARMED_UP_CONDITION
from vllm_operator.k8s.api import ClusterAPI
from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.models.inference_service import EffectiveTuning
from vllm_operator.reconcile.conditions import manifest_condition
from vllm_operator.reconcile.jobs import job_report, job_state
from vllm_operator.render.warmup import build_warmup_job, container_restarts, warmup_job_name


@dataclass
class WarmupObservation:
    """What the warmups of one InferenceService's pods came to."""

    warmed: int = 0
    failures: list[str] = field(default_factory=list)
    cold_ttft_ms: float | None = None
    warm_ttft_ms: float | None = None


async def _set_gate(
    api: ClusterAPI, pod: Manifest, *, ok: bool, reason: str, message: str, now: datetime
) -> None:
    """Server-side apply of our one condition on the pod's status (a map keyed by type,
    so nothing else in the pod's status is touched)."""
    old = manifest_condition(pod, WARMED_UP_CONDITION)
    status = "True" if ok else "False"
    if old and (old.get("status"), old.get("reason"), old.get("message")) == (
        status,
        reason,
        message,
    ):
        return
    since = old["lastTransitionTime"] if old and old.get("status") == status else now
    stamp = since if isinstance(since, str) else since.strftime("%Y-%m-%dT%H:%M:%SZ")
    meta = pod["metadata"]
    await api.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "status": {
                "conditions": [
                    {
                        "type": WARMED_UP_CONDITION,
                        "status": status,
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": stamp,
                    }
                ]
            },
        },
        subresource="status",
    )


def _ms(seconds: Any) -> float | None:
    return round(float(seconds) * 1000, 1) if isinstance(seconds, int | float) else None


async def reconcile_warmups(
    api: ClusterAPI,
    isvc: InferenceService,
    tuning: EffectiveTuning,
    pods: list[Manifest],
    *,
    image: str,
    resources: Manifest,
    now: datetime,
) -> WarmupObservation:
    """Drive every live server pod of ``isvc`` through warmup; report what came of it."""
    seen = WarmupObservation()
    if not isvc.spec.warmup.enabled:
        return seen
    ns, name = isvc.metadata.namespace or "", isvc.metadata.name
    jobs = {
        j["metadata"]["name"]: j
        for j in await api.list("batch/v1", "Job", ns, label_selector=f"{LABEL_WARMUP_FOR}={name}")
    }
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        restarts = container_restarts(pod)
        job_name = warmup_job_name(isvc, pod, restarts)
        gate = manifest_condition(pod, WARMED_UP_CONDITION)
        if gate and gate.get("status") == "True":
            if job_name in gate.get("message", ""):
                seen.warmed += 1
                continue
            await _set_gate(
                api,
                pod,
                ok=False,
                reason="ContainerRestarted",
                message=f"The server restarted ({restarts} restarts); warming it up again.",
                now=now,
            )
        ready = manifest_condition(pod, "ContainersReady")
        if not ready or ready.get("status") != "True":
            continue  # vLLM is not answering /health yet; warmup starts once it does
        job = jobs.get(job_name)
        if job is None:
            await api.apply(
                build_warmup_job(
                    isvc, pod, tuning, image=image, resources=resources, restarts=restarts
                )
            )
            await _set_gate(
                api,
                pod,
                ok=False,
                reason="WarmingUp",
                message=f"Job {job_name} is warming up the server.",
                now=now,
            )
            continue
        state = job_state(job)
        if state == "Running":
            continue
        report = await job_report(api, ns, job_name)
        if state == "Succeeded":
            cold, warm = _ms(report.get("cold_ttft_s")), _ms(report.get("warm_ttft_s"))
            seen.cold_ttft_ms = cold if cold is not None else seen.cold_ttft_ms
            seen.warm_ttft_ms = warm if warm is not None else seen.warm_ttft_ms
            await _set_gate(
                api,
                pod,
                ok=True,
                reason="WarmedUp",
                message=f"Job {job_name} warmed the server: cold TTFT {cold} ms, "
                f"warm TTFT {warm} ms, {report.get('requests_sent', '?')} requests.",
                now=now,
            )
            seen.warmed += 1
        else:
            why = report.get("message") or "the warmup Job failed without a report"
            outcome = report.get("outcome", "Failed")
            message = f"Job {job_name} failed ({outcome}): {why}"
            await _set_gate(api, pod, ok=False, reason="WarmupFailed", message=message, now=now)
            seen.failures.append(f"pod {pod['metadata']['name']}: {message}")
    return seen
