"""The one reconcile of an InferenceBenchmark: wait for a Ready target, run the load Job
under a scale-down lock, then record what it measured.

Phases: Pending (target missing or not Ready yet, or a dataset or trace ConfigMap the spec
names is missing) → Running (the Job runs; the lock holds) → Succeeded or Failed (the lock
is released; the Job, and anything left of the lock, go by TTL and garbage collection).
Terminal phases are never left: a benchmark is a record. Conditions mirror the phase
(Ready, Reconciling, Stalled) so kstatus and Argo CD read it.

Before the Job, the operator applies what the Job needs: the spec as a ConfigMap, the
empty results ConfigMap and the Job's own ServiceAccount, Role and RoleBinding (allowed
only to write that ConfigMap). The Job reports its headline numbers as its termination
message, including ``resultsConfigMap`` once every request's data is in that ConfigMap.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import ValidationError

from vllm_operator.constants import (
    API_VERSION,
    KIND_INFERENCE_SERVICE,
    LABEL_SERVICE,
    LABEL_WARMUP_FOR,
)
from vllm_operator.k8s.api import ClusterAPI
from vllm_operator.models import InferenceBenchmark, InferenceBenchmarkStatus, InferenceService
from vllm_operator.models.base import Condition, ConfigMapKeyReference, Manifest
from vllm_operator.models.conditions import pod_condition
from vllm_operator.models.inference_benchmark import REASON_TOO_MANY_REQUEST_ERRORS
from vllm_operator.reconcile.jobs import job_report, job_state
from vllm_operator.reconcile.last_benchmark import TERMINAL
from vllm_operator.reconcile.lock import held_note
from vllm_operator.reconcile.phases import phase_conditions, write_phase_status
from vllm_operator.reconcile.pods import pod_problem
from vllm_operator.render.benchmark import (
    build_load_job,
    build_load_role,
    build_load_role_binding,
    build_load_service_account,
    build_neighbour_job,
    build_results_config_map,
    build_spec_config_map,
    load_job_name,
    neighbour_job_name,
    results_config_map_name,
)
from vllm_operator.render.deployment import served_model_name
from vllm_operator.render.meta import SERVER_PORT, selector_string
from vllm_operator.render.service import endpoint_url
from vllm_operator.settings import OperatorSettings

log = logging.getLogger(__name__)

# Pending while an input the spec names is missing (looked at again every few seconds).
REASON_DATASET_NOT_FOUND: Final = "DatasetNotFound"
REASON_DATASET_KEY_NOT_FOUND: Final = "DatasetKeyNotFound"
REASON_TRACE_NOT_FOUND: Final = "TraceNotFound"
REASON_TRACE_KEY_NOT_FOUND: Final = "TraceKeyNotFound"
REASON_ADAPTER_NOT_FOUND: Final = "AdapterNotFound"
REASON_ADAPTER_NOT_LOADED: Final = "AdapterNotLoaded"


async def _missing_input(
    api: ClusterAPI, bench: InferenceBenchmark, ns: str
) -> tuple[str, str] | None:
    """Reason and message when a dataset or trace the spec names is not there: the
    ConfigMap, or its key (in data or binaryData; the Job mounts either as a file)."""
    inputs: tuple[tuple[ConfigMapKeyReference | None, str, str, str], ...] = (
        (
            bench.spec.workload.dataset,
            "spec.workload.dataset",
            REASON_DATASET_NOT_FOUND,
            REASON_DATASET_KEY_NOT_FOUND,
        ),
        (
            bench.spec.arrival.trace,
            "spec.arrival.trace",
            REASON_TRACE_NOT_FOUND,
            REASON_TRACE_KEY_NOT_FOUND,
        ),
    )
    for ref, field, no_config_map, no_key in inputs:
        if ref is None:
            continue
        cm = await api.get("v1", "ConfigMap", ref.name, ns)
        if cm is None:
            return no_config_map, (
                f"ConfigMap {ref.name} ({field}.name) does not exist in namespace {ns}; the "
                "benchmark starts once it does."
            )
        if ref.key not in (cm.get("data") or {}) and ref.key not in (cm.get("binaryData") or {}):
            return no_key, (
                f"ConfigMap {ref.name} has no key {ref.key} ({field}.key); the benchmark "
                "starts once it does."
            )
    return None


def _conditions(
    phase: str, reason: str, message: str, *, gen: int | None, now: datetime, old: list[Condition]
) -> list[Condition]:
    done, failed = phase == "Succeeded", phase == "Failed"
    return phase_conditions(
        reason, message, ready=done, reconciling=not (done or failed), stalled=failed,
        now=now, generation=gen, previous=old,
    )  # fmt: skip


async def _write(
    api: ClusterAPI, body: Manifest, bench: InferenceBenchmark, status: InferenceBenchmarkStatus
) -> None:
    await write_phase_status(api, body, bench.status, status)


def _adapter_wait(target: InferenceService, adapter: str | None) -> tuple[str, str] | None:
    """(reason, message) while spec.adapter cannot be measured yet: the target does not
    declare it, or not every Ready server has it loaded."""
    if adapter is None:
        return None
    name = target.metadata.name
    declared = [a.name for a in target.spec.adapters]
    if adapter not in declared:
        return (
            REASON_ADAPTER_NOT_FOUND,
            f"spec.adapter {adapter} is not an adapter of InferenceService {name} "
            f"(its spec.adapters: {', '.join(declared) or 'none'}).",
        )
    seen = target.status.adapters if target.status and target.status.adapters else []
    found = next((a for a in seen if a.name == adapter), None)
    ready = (target.status.ready_replicas if target.status else None) or 0
    loaded = found.loaded_replicas if found is not None else 0
    if loaded < max(1, ready):
        why = f": {found.message}" if found is not None and found.message else ""
        return (
            REASON_ADAPTER_NOT_LOADED,
            f"Waiting for adapter {adapter} to be loaded on every Ready server of "
            f"InferenceService {name} ({loaded} of {ready}){why}.",
        )
    return None


async def reconcile_inference_benchmark(
    api: ClusterAPI,
    body: Manifest,
    *,
    settings: OperatorSettings,
    now: datetime | None = None,
) -> str:
    """Advance one InferenceBenchmark; returns its phase."""
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    try:
        bench = InferenceBenchmark.model_validate(body)
    except ValidationError as err:
        log.warning("InferenceBenchmark is invalid.", extra={"error": str(err)})
        return "Failed"
    ns = bench.metadata.namespace or ""
    gen = bench.metadata.generation
    old = bench.status or InferenceBenchmarkStatus()
    old_conditions = old.conditions

    def status(phase: str, reason: str, message: str, **fields: Any) -> InferenceBenchmarkStatus:
        base = old.model_dump(exclude={"conditions", "phase", "observed_generation"})
        base.update(fields)
        return InferenceBenchmarkStatus(
            observed_generation=gen,
            phase=phase,
            conditions=_conditions(phase, reason, message, gen=gen, now=now, old=old_conditions),
            **{k: v for k, v in base.items() if k not in ("observed_generation", "phase")},
        )

    if old.phase in TERMINAL:
        return old.phase

    job = await api.get("batch/v1", "Job", load_job_name(bench), ns)
    if job is None:
        if old.phase == "Running":
            # The Job finished and went by TTL while no operator collected it.
            await _write(
                api,
                body,
                bench,
                status(
                    "Failed",
                    "ResultsLost",
                    "The load Job finished and was cleaned up before the operator read its "
                    "results (was the operator down?).",
                    completion_time=now,
                ),
            )
            return "Failed"
        target_body = await api.get(
            API_VERSION, KIND_INFERENCE_SERVICE, bench.spec.target_ref.name, ns
        )
        if target_body is None:
            await _write(
                api,
                body,
                bench,
                status(
                    "Pending",
                    "TargetNotFound",
                    f"InferenceService {bench.spec.target_ref.name} (spec.targetRef) does not "
                    f"exist in namespace {ns}.",
                ),
            )
            return "Pending"
        target = InferenceService.model_validate(target_body)
        ready = next(
            (c for c in (target.status.conditions if target.status else []) if c.type == "Ready"),
            None,
        )
        if ready is None or ready.status != "True":
            await _write(
                api,
                body,
                bench,
                status(
                    "Pending",
                    "TargetNotReady",
                    f"Waiting for InferenceService {target.metadata.name} to be Ready.",
                ),
            )
            return "Pending"
        waiting = _adapter_wait(target, bench.spec.adapter)
        if waiting is not None:
            await _write(api, body, bench, status("Pending", *waiting))
            return "Pending"
        missing = await _missing_input(api, bench, ns)
        if missing is not None:
            await _write(api, body, bench, status("Pending", *missing))
            return "Pending"
        servers = serving_target_pods(
            await api.list("v1", "Pod", ns, label_selector=selector_string(target))
        )
        restart_pods = (
            [p["metadata"]["name"] for p in servers]
            if bench.spec.chaos and bench.spec.chaos.restart
            else []
        )
        for child in (
            build_spec_config_map(bench),
            build_results_config_map(bench),
            build_load_service_account(bench),
            build_load_role(bench, restart_pods),
            build_load_role_binding(bench),
        ):
            await api.apply(child)
        chaos = bench.spec.chaos
        if chaos is not None and chaos.noisy_neighbour is not None and servers:
            beside = servers[0]
            await api.apply(
                build_neighbour_job(
                    bench,
                    image=settings.warmup_image,
                    node={
                        "name": beside["spec"]["nodeName"],
                        "tolerations": beside["spec"].get("tolerations") or [],
                    },
                    beside={
                        "name": beside["metadata"]["name"],
                        "qosClass": beside.get("status", {}).get("qosClass"),
                    },
                )
            )
        job = await api.apply(
            build_load_job(
                bench,
                image=settings.warmup_image,
                resources=settings.load_resources.to_wire(),
                endpoint=endpoint_url(target).removesuffix("/v1"),
                model=bench.spec.adapter or served_model_name(target),
                metrics_urls=[
                    f"http://{p['status']['podIP']}:{SERVER_PORT}/metrics"
                    for p in servers[:MAX_METRICS_PODS]
                ],
                restart_pods=restart_pods,
            )
        )
    state = job_state(job)
    if state == "Running":
        name = job["metadata"]["name"]
        lock = held_note(bench.spec.target_ref.name)
        # A load pod that cannot start (no node has the CPU it requests, its image cannot
        # be pulled, ...) sends nothing: the status says why rather than "sending load".
        pods = await api.list(
            "v1", "Pod", ns, label_selector=f"batch.kubernetes.io/job-name={name}"
        )
        # A pod that has ended is the Job's to count (its conditions follow within moments).
        ended = ("Succeeded", "Failed")
        problem = pod_problem(
            None, [p for p in pods if p.get("status", {}).get("phase") not in ended]
        )
        if problem is not None:
            reason, message = (
                problem.reason,
                f"Job {name} sends no load yet: {problem.message} {lock}",
            )
        else:
            shared = await _beside_target(api, ns, bench, pods)
            reason, message = "LoadRunning", f"Job {name} is sending load; {lock}{shared}"
        await _write(
            api,
            body,
            bench,
            status("Running", reason, message, start_time=old.start_time or now),
        )
        return "Running"
    if state == "Failed" and bench.spec.chaos is not None and bench.spec.chaos.noisy_neighbour:
        # A load Job that failed may not have dismissed its neighbour, which then sits out
        # its order's time limit and its own deadline (holding its CPU request): gone now.
        # (A load Job that ends well dismisses it, and the neighbour's Job completes.)
        await api.delete("batch/v1", "Job", neighbour_job_name(bench), ns)
    report = await job_report(api, ns, job["metadata"]["name"])
    results = results_config_map_name(bench)
    measured = _measured(report)

    def final(phase: str, reason: str, message: str) -> InferenceBenchmarkStatus:
        """The final status, with everything the Job's report measured."""
        return status(
            phase,
            reason,
            message,
            start_time=old.start_time or now,
            completion_time=now,
            levels=measured.levels,
            headline=measured.headline,
            knee_rate_per_second=measured.knee_rate_per_second,
            chaos=measured.chaos,
            chaos_note=measured.chaos_note,
            results_config_map=results if written else None,
        )

    written = report.get("resultsConfigMap") == results
    failure = report.get("failure")
    if (
        state == "Failed"
        and isinstance(failure, dict)
        and failure.get("reason") == REASON_TOO_MANY_REQUEST_ERRORS
    ):
        # The load ran to the end, but too many of its requests errored: a record of what
        # it measured, failed with the Job's reason.
        why = failure.get("message") or "too many requests errored"
        await _write(
            api,
            body,
            bench,
            final(
                "Failed",
                REASON_TOO_MANY_REQUEST_ERRORS,
                f"Job {job['metadata']['name']} failed: {why}",
            ),
        )
        return "Failed"
    if state == "Succeeded":
        load_pods = await api.list(
            "v1",
            "Pod",
            ns,
            label_selector=f"batch.kubernetes.io/job-name={job['metadata']['name']}",
        )
        shared = await _beside_target(api, ns, bench, load_pods)
        if "headline" in report:
            reason, message = (
                "Completed",
                (
                    f"The benchmark ran to the end; its per-request data is in ConfigMap {results}."
                    if written
                    else f"The benchmark ran to the end, but the per-request data did not reach "
                    f"ConfigMap {results} (see the log of Job {job['metadata']['name']})."
                ),
            )
        else:
            # The load ran to the end and exited 0, but no level is the headline: say why,
            # with every level and chaos phase it measured (issue 44: this read "the load
            # Job failed" with the levels dropped).
            reason, why = no_headline(measured, bench.spec.target_attainment(), report)
            data = (
                f" Its per-request data is in ConfigMap {results}."
                if written
                else f" The per-request data did not reach ConfigMap {results}."
            )
            message = f"The benchmark ran to the end without a headline level: {why}{data}"
        await _write(api, body, bench, final("Succeeded", reason, message + shared))
        return "Succeeded"
    why = report.get("message") or "the load Job failed"
    await _write(
        api,
        body,
        bench,
        status(
            "Failed",
            "LoadFailed",
            f"Job {job['metadata']['name']} failed: {why}",
            start_time=old.start_time or now,
            completion_time=now,
        ),
    )
    return "Failed"


# The load Job reads at most this many servers' /metrics (one read a second each): more
# would take the load generator's CPU from the load.
MAX_METRICS_PODS: Final = 16
# LeaderWorkerSet's label of a pod's place in its group; the leader (0) serves the API.
LWS_WORKER_INDEX: Final = "leaderworkerset.sigs.k8s.io/worker-index"


def serving_target_pods(pods: list[Manifest]) -> list[Manifest]:
    """The target's pods that serve the API now (Ready, not going, the leader of a
    group), by name: the servers whose /metrics the load Job reads, and the pods a chaos
    restart may evict."""
    return sorted(
        (
            p
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
            and p.get("status", {}).get("podIP")
            and p.get("spec", {}).get("nodeName")
            and pod_condition(p, "Ready")
            and p["metadata"].get("labels", {}).get(LWS_WORKER_INDEX, "0") == "0"
        ),
        key=lambda p: str(p["metadata"]["name"]),
    )


async def _beside_target(
    api: ClusterAPI, ns: str, bench: InferenceBenchmark, load_pods: list[Manifest]
) -> str:
    """A sentence when the load pod runs on a node of the target's pods (its preferred
    anti-affinity found no other), else "": said once in the status, not per level."""
    nodes = {p.get("spec", {}).get("nodeName") for p in load_pods} - {None}
    if not nodes:
        return ""
    target = await api.list(
        "v1", "Pod", ns, label_selector=f"{LABEL_SERVICE}={bench.spec.target_ref.name}"
    )
    beside = sorted(
        p["metadata"]["name"]
        for p in target
        if p.get("spec", {}).get("nodeName") in nodes
        and LABEL_WARMUP_FOR not in (p["metadata"].get("labels") or {})
    )
    if not beside:
        return ""
    node = sorted(str(n) for n in nodes)[0]
    pods = f"pod{'s' if len(beside) > 1 else ''} {', '.join(beside)}"
    return (
        f" The load ran on node {node} beside the target's {pods} (no other node could take "
        "it): its schedule lag there is partly the server's load."
    )


# Why a run that ended well has no headline level (phase Succeeded, one of these reasons).
REASON_CLIENT_LIMITED: Final = "ClientLimited"
REASON_NO_LEVEL_MET_SLO: Final = "NoLevelMetSLO"
REASON_LEVELS_NOT_REPORTED: Final = "LevelsNotReported"


def no_headline(
    measured: InferenceBenchmarkStatus, target_attainment: float, report: Manifest
) -> tuple[str, str]:
    """(reason, sentence) for a load Job that ended well with no headline level: which of
    its levels the load client limited, which missed the SLO, and what to do next."""
    levels = measured.levels
    if not levels:
        truncated = (
            " (its report did not fit the termination message)" if report.get("truncated") else ""
        )
        return REASON_LEVELS_NOT_REPORTED, (
            f"the load Job reported no level{truncated}; see its log for what it measured"
        )

    def load(lv: Any) -> str:
        if lv.rate_per_second is not None:
            return f"{lv.rate_per_second:g} req/s"
        return f"concurrency {lv.concurrency}" if lv.concurrency is not None else "the load"

    # Each level's own verdict where the load Job gave one (sloVerdict), else as it was
    # judged before there was one: a saturated client decides its level.
    limited = [
        lv
        for lv in levels
        if lv.slo_verdict == "ClientLimited" or (lv.slo_verdict is None and lv.client_saturated)
    ]
    missed = [
        lv
        for lv in levels
        if lv.slo_verdict == "Missed"
        or (
            lv.slo_verdict is None
            and not lv.client_saturated
            and (lv.slo_attainment is None or lv.slo_attainment < target_attainment)
        )
    ]
    if len(limited) == len(levels):
        lags = [lv.schedule_lag_p99_milliseconds for lv in limited]
        worst = max((lag for lag in lags if lag is not None), default=None)
        lag = f" (schedule lag P99 up to {worst:.3g} ms)" if worst is not None else ""
        return REASON_CLIENT_LIMITED, (
            f"the load client could not keep to the schedule at any of the {len(levels)} "
            f"levels{lag}, so none counts toward the SLO; give the load Job a CPU of its own "
            "(a node without the target's pods, or a larger CPU request) or lower the load"
        )
    parts = []
    if missed:
        worst_attained = min((lv.slo_attainment or 0.0) for lv in missed)
        parts.append(
            f"{len(missed)} of {len(levels)} levels missed the SLO (target attainment "
            f"{target_attainment:.0%}; lowest measured {worst_attained:.1%}, at "
            f"{load(min(missed, key=lambda lv: lv.slo_attainment or 0.0))})"
        )
    if limited:
        parts.append(
            f"the load client was the bottleneck at {', '.join(load(lv) for lv in limited)}"
        )
    return REASON_NO_LEVEL_MET_SLO, (
        "; ".join(parts) + "; lower the load (spec.arrival, spec.sweep, spec.search) or relax "
        "the objective (spec.slo)"
    )


def _measured(report: dict[str, Any]) -> InferenceBenchmarkStatus:
    """The measured part of a load Job's report (its termination message); an invalid
    one measured nothing."""
    try:
        return InferenceBenchmarkStatus.model_validate(
            {
                k: v
                for k, v in report.items()
                if k in ("levels", "headline", "kneeRatePerSecond", "chaos", "chaosNote")
            }
        )
    except ValidationError:
        return InferenceBenchmarkStatus()
