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

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from vllm_operator.constants import LABEL_WARMUP_FOR, WARMED_UP_CONDITION
from vllm_operator.k8s.api import ClusterAPI
from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.models.conditions import manifest_condition, manifest_condition_update
from vllm_operator.models.inference_service import EffectiveTuning
from vllm_operator.reconcile.jobs import job_report, job_state
from vllm_operator.render.warmup import build_warmup_job, container_restarts, warmup_job_name


@dataclass
class WarmupObservation:
    """What the warmups of one InferenceService's pods came to."""

    warmed: int = 0
    failures: list[str] = field(default_factory=list)
    cold_ttft_ms: float | None = None
    warm_ttft_ms: float | None = None


@dataclass(frozen=True)
class Write:
    """One server-side apply the warmup decided on: a warmup Job, or our condition on a
    pod's status (``subresource="status"``)."""

    manifest: Manifest
    subresource: str | None = None


@dataclass
class WarmupDecision:
    """The writes of one pass, in order, and what the status reports of them."""

    writes: list[Write] = field(default_factory=list)
    seen: WarmupObservation = field(default_factory=WarmupObservation)


def _gate(pod: Manifest, *, ok: bool, reason: str, message: str, now: datetime) -> Write | None:
    """The apply of our one condition on the pod's status (a map keyed by type, so
    nothing else in the pod's status is touched); none when it already says that."""
    cond = manifest_condition_update(pod, WARMED_UP_CONDITION, ok, reason, message, now=now)
    if cond is None:
        return None
    meta = pod["metadata"]
    patch = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "status": {"conditions": [cond]},
    }
    return Write(patch, subresource="status")


def _ms(seconds: Any) -> float | None:
    return round(float(seconds) * 1000, 1) if isinstance(seconds, int | float) else None


def warmup_selector(isvc: InferenceService) -> str:
    return f"{LABEL_WARMUP_FOR}={isvc.metadata.name}"


def _current(isvc: InferenceService, pods: list[Manifest]) -> Iterator[tuple[Manifest, int, str]]:
    """Each live pod with its container restarts and the name of its current warmup Job."""
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        restarts = container_restarts(pod)
        yield pod, restarts, warmup_job_name(isvc, pod, restarts)


def _recorded(pod: Manifest, job_name: str) -> bool:
    gate = manifest_condition(pod, WARMED_UP_CONDITION)
    return bool(gate and gate.get("status") == "True" and job_name in gate.get("message", ""))


def reports_wanted(isvc: InferenceService, pods: list[Manifest], jobs: list[Manifest]) -> list[str]:
    """The finished warmup Jobs whose outcome is not on their pod's gate yet: the only
    ones whose report a pass reads."""
    by_name = {j["metadata"]["name"]: j for j in jobs}
    wanted = []
    for pod, _, job_name in _current(isvc, pods):
        job = by_name.get(job_name)
        if job is not None and job_state(job) != "Running" and not _recorded(pod, job_name):
            wanted.append(job_name)
    return wanted


def decide_warmups(
    isvc: InferenceService,
    tuning: EffectiveTuning,
    pods: list[Manifest],
    jobs: list[Manifest],
    reports: Mapping[str, Mapping[str, Any]],
    *,
    image: str,
    resources: Manifest,
    now: datetime,
) -> WarmupDecision:
    """Every live server pod of ``isvc`` one step further through warmup: pure, from
    the pods, their warmup Jobs and the reports of the finished ones."""
    out = WarmupDecision()
    seen = out.seen
    if not isvc.spec.warmup.enabled:
        return out

    def gate(pod: Manifest, **kw: Any) -> None:
        write = _gate(pod, now=now, **kw)
        if write is not None:
            out.writes.append(write)

    by_name = {j["metadata"]["name"]: j for j in jobs}
    for pod, restarts, job_name in _current(isvc, pods):
        if _recorded(pod, job_name):
            seen.warmed += 1
            continue
        old = manifest_condition(pod, WARMED_UP_CONDITION)
        if old and old.get("status") == "True":
            gate(
                pod,
                ok=False,
                reason="ContainerRestarted",
                message=f"The server restarted ({restarts} restarts); warming it up again.",
            )
        ready = manifest_condition(pod, "ContainersReady")
        if not ready or ready.get("status") != "True":
            continue  # vLLM is not answering /health yet; warmup starts once it does
        job = by_name.get(job_name)
        if job is None:
            out.writes.append(
                Write(
                    build_warmup_job(
                        isvc, pod, tuning, image=image, resources=resources, restarts=restarts
                    )
                )
            )
            gate(
                pod,
                ok=False,
                reason="WarmingUp",
                message=f"Job {job_name} is warming up the server.",
            )
            continue
        state = job_state(job)
        if state == "Running":
            continue
        report = reports.get(job_name, {})
        if state == "Succeeded":
            cold, warm = _ms(report.get("cold_ttft_s")), _ms(report.get("warm_ttft_s"))
            seen.cold_ttft_ms = cold if cold is not None else seen.cold_ttft_ms
            seen.warm_ttft_ms = warm if warm is not None else seen.warm_ttft_ms
            gate(
                pod,
                ok=True,
                reason="WarmedUp",
                message=f"Job {job_name} warmed the server: cold TTFT {cold} ms, "
                f"warm TTFT {warm} ms, {report.get('requests_sent', '?')} requests.",
            )
            seen.warmed += 1
        else:
            why = report.get("message") or "the warmup Job failed without a report"
            outcome = report.get("outcome", "Failed")
            message = f"Job {job_name} failed ({outcome}): {why}"
            gate(pod, ok=False, reason="WarmupFailed", message=message)
            seen.failures.append(f"pod {pod['metadata']['name']}: {message}")
    return out


async def list_warmup_jobs(api: ClusterAPI, isvc: InferenceService) -> list[Manifest]:
    return await api.list(
        "batch/v1", "Job", isvc.metadata.namespace or "", label_selector=warmup_selector(isvc)
    )


async def read_reports(
    api: ClusterAPI, isvc: InferenceService, pods: list[Manifest], jobs: list[Manifest]
) -> dict[str, dict[str, Any]]:
    ns = isvc.metadata.namespace or ""
    return {name: await job_report(api, ns, name) for name in reports_wanted(isvc, pods, jobs)}


async def apply_writes(api: ClusterAPI, writes: list[Write]) -> None:
    for write in writes:
        await api.apply(write.manifest, subresource=write.subresource)


async def reconcile_warmups(
    api: ClusterAPI,
    isvc: InferenceService,
    tuning: EffectiveTuning,
    pods: list[Manifest],
    *,
    image: str,
    resources: Manifest,
    now: datetime,
    jobs: list[Manifest] | None = None,
) -> WarmupObservation:
    """Read (the warmup Jobs, unless given, and the reports of finished ones), decide,
    write: every live server pod of ``isvc`` through warmup; report what came of it."""
    if not isvc.spec.warmup.enabled:
        return WarmupObservation()
    if jobs is None:
        jobs = await list_warmup_jobs(api, isvc)
    reports = await read_reports(api, isvc, pods, jobs)
    decision = decide_warmups(
        isvc, tuning, pods, jobs, reports, image=image, resources=resources, now=now
    )
    await apply_writes(api, decision.writes)
    return decision.seen
