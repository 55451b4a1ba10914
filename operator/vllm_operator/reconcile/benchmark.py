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

One pass is :func:`observe` (every read) → the pure :func:`next_step` (the whole status,
the objects to apply and delete, the events) → :func:`apply_step`, the InferenceService's
gather → decide → apply.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
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
from vllm_operator.models.conditions import find, pod_condition
from vllm_operator.models.inference_benchmark import REASON_TOO_MANY_REQUEST_ERRORS
from vllm_operator.reconcile.jobs import job_pods_selector, job_state, report_of
from vllm_operator.reconcile.last_benchmark import TERMINAL
from vllm_operator.reconcile.lock import held_note
from vllm_operator.reconcile.phases import phase_conditions, phase_event, write_phase_status
from vllm_operator.reconcile.pods import pod_problem
from vllm_operator.reconcile.steps import Event, Ref, apply_all, delete_all
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
from vllm_operator.render.meta import SERVER_PORT
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
REASON_TARGET_NOT_READY: Final = "TargetNotReady"


# --- observe ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """Everything one pass reads for a benchmark, read before anything is decided. What a
    pass does not need is not read, and left empty: nothing of a terminal benchmark (a
    record); the target and the inputs only while there is no load Job; the inputs once
    the target is Ready (and serves spec.adapter); the pods once the Job exists or is due."""

    # The load Job; None when there is none (not made yet, or gone by TTL).
    job: Manifest | None = None
    # The target InferenceService (spec.targetRef); None when missing or not read.
    target: InferenceService | None = None
    # The ConfigMaps spec.workload.dataset and spec.arrival.trace name, by name (None: missing).
    config_maps: Mapping[str, Manifest | None] = field(default_factory=dict)
    # The load Job's pods, and the target's pods: its servers (whose /metrics the load Job
    # reads) and the pods the load pod may share a node with.
    load_pods: list[Manifest] = field(default_factory=list)
    target_pods: list[Manifest] = field(default_factory=list)


async def observe(api: ClusterAPI, bench: InferenceBenchmark) -> Observed:
    """Every read of a pass, in the order the decision needs them (a later read only when
    an earlier one says the decision will use it)."""
    old = bench.status or InferenceBenchmarkStatus()
    ns = bench.metadata.namespace or ""
    if old.phase in TERMINAL:
        return Observed()
    job = await api.get("batch/v1", "Job", load_job_name(bench), ns)
    target: InferenceService | None = None
    config_maps: dict[str, Manifest | None] = {}
    if job is None:
        if old.phase == "Running":
            return Observed()  # the results are lost: nothing else matters
        body = await api.get(API_VERSION, KIND_INFERENCE_SERVICE, bench.spec.target_ref.name, ns)
        target = InferenceService.model_validate(body) if body is not None else None
        if target is None or _target_wait(target, bench.spec.adapter) is not None:
            return Observed(target=target)
        for ref in (bench.spec.workload.dataset, bench.spec.arrival.trace):
            if ref is None:
                continue
            cm = await api.get("v1", "ConfigMap", ref.name, ns)
            config_maps[ref.name] = cm
            if cm is None or not _has_key(cm, ref.key):
                break  # the first input missing is the one the status names
        if _missing_input(bench, config_maps) is not None:
            return Observed(target=target, config_maps=config_maps)
    load_pods, target_pods = await asyncio.gather(
        api.list("v1", "Pod", ns, label_selector=job_pods_selector(load_job_name(bench))),
        api.list("v1", "Pod", ns, label_selector=f"{LABEL_SERVICE}={bench.spec.target_ref.name}"),
    )
    return Observed(job, target, config_maps, load_pods, target_pods)


# --- decide -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """What one pass does: ``phase`` is what the reconcile returns (the runtime looks at a
    Pending benchmark again soon, by its phase)."""

    phase: str
    # The whole status to write (written only when it differs); None: a terminal record,
    # left as it is.
    status: InferenceBenchmarkStatus | None = None
    # Applied in this order: everything the load Job's pod needs, then the Job.
    apply: tuple[Manifest, ...] = ()
    delete: tuple[Ref, ...] = ()
    events: tuple[Event, ...] = ()
    requeue: float | None = None


def _missing_input(
    bench: InferenceBenchmark, config_maps: Mapping[str, Manifest | None]
) -> tuple[str, str] | None:
    """Reason and message when a dataset or trace the spec names is not there: the
    ConfigMap, or its key (in data or binaryData; the Job mounts either as a file)."""
    ns = bench.metadata.namespace or ""
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
    for ref, field_, no_config_map, no_key in inputs:
        if ref is None:
            continue
        cm = config_maps.get(ref.name)
        if cm is None:
            return no_config_map, (
                f"ConfigMap {ref.name} ({field_}.name) does not exist in namespace {ns}; the "
                "benchmark starts once it does."
            )
        if not _has_key(cm, ref.key):
            return no_key, (
                f"ConfigMap {ref.name} has no key {ref.key} ({field_}.key); the benchmark "
                "starts once it does."
            )
    return None


def _has_key(cm: Manifest, key: str) -> bool:
    return key in (cm.get("data") or {}) or key in (cm.get("binaryData") or {})


def _conditions(
    phase: str, reason: str, message: str, *, gen: int | None, now: datetime, old: list[Condition]
) -> list[Condition]:
    done, failed = phase == "Succeeded", phase == "Failed"
    return phase_conditions(
        reason, message, ready=done, reconciling=not (done or failed), stalled=failed,
        now=now, generation=gen, previous=old,
    )  # fmt: skip


def _status(
    bench: InferenceBenchmark, now: datetime, phase: str, reason: str, message: str, **fields: Any
) -> InferenceBenchmarkStatus:
    """The whole status in ``phase``: what the last one measured, with ``fields`` over it."""
    old = bench.status or InferenceBenchmarkStatus()
    gen = bench.metadata.generation
    base = old.model_dump(exclude={"conditions", "phase", "observed_generation"})
    base.update(fields)
    return InferenceBenchmarkStatus(
        observed_generation=gen,
        phase=phase,
        conditions=_conditions(phase, reason, message, gen=gen, now=now, old=old.conditions),
        **{k: v for k, v in base.items() if k not in ("observed_generation", "phase")},
    )


def _target_wait(target: InferenceService, adapter: str | None) -> tuple[str, str] | None:
    """(reason, message) while the target cannot be measured yet: not Ready, or not
    serving spec.adapter everywhere."""
    ready = find(target.status.conditions if target.status else [], "Ready")
    if ready is None or ready.status != "True":
        name = target.metadata.name
        return REASON_TARGET_NOT_READY, f"Waiting for InferenceService {name} to be Ready."
    return _adapter_wait(target, adapter)


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


def next_step(
    bench: InferenceBenchmark, observed: Observed, now: datetime, *, settings: OperatorSettings
) -> Step:
    """The pass's step, pure: Pending until the target is Ready and the inputs are there,
    then the load Job (Running, holding the lock), then what it measured (Succeeded or
    Failed)."""
    old = bench.status or InferenceBenchmarkStatus()
    if old.phase in TERMINAL:
        return Step(old.phase)
    ns = bench.metadata.namespace or ""
    job = observed.job
    started: dict[str, Any] = {"start_time": old.start_time or now}
    if job is None:
        if old.phase == "Running":
            # The Job finished and went by TTL while no operator collected it.
            return _step(bench, _status(
                bench, now, "Failed", "ResultsLost",
                "The load Job finished and was cleaned up before the operator read its "
                "results (was the operator down?).",
                completion_time=now,
            ))  # fmt: skip
        target = observed.target
        if target is None:
            return _step(bench, _status(
                bench, now, "Pending", "TargetNotFound",
                f"InferenceService {bench.spec.target_ref.name} (spec.targetRef) does not "
                f"exist in namespace {ns}.",
            ))  # fmt: skip
        waiting = _target_wait(target, bench.spec.adapter) or _missing_input(
            bench, observed.config_maps
        )
        if waiting is not None:
            return _step(bench, _status(bench, now, "Pending", *waiting))
        children = _load_children(bench, target, observed, settings)
        running = _status(bench, now, "Running", *_running(bench, observed), **started)
        return _step(bench, running, apply=children)
    state = job_state(job)
    if state == "Running":
        return _step(bench, _status(bench, now, "Running", *_running(bench, observed), **started))
    delete: tuple[Ref, ...] = ()
    if state == "Failed" and bench.spec.chaos is not None and bench.spec.chaos.noisy_neighbour:
        # A load Job that failed may not have dismissed its neighbour, which then sits out
        # its order's time limit and its own deadline (holding its CPU request): gone now.
        # (A load Job that ends well dismisses it, and the neighbour's Job completes.)
        delete = (Ref("batch/v1", "Job", neighbour_job_name(bench), ns),)
    return _step(bench, _finished(bench, observed, state, now, started), delete=delete)


def _step(
    bench: InferenceBenchmark,
    status: InferenceBenchmarkStatus,
    *,
    apply: tuple[Manifest, ...] = (),
    delete: tuple[Ref, ...] = (),
) -> Step:
    """The step that writes ``status``: its phase, and the event of a new phase."""
    event = phase_event(bench.status, status)
    assert status.phase is not None
    return Step(status.phase, status, apply, delete, (event,) if event else ())


def _load_children(
    bench: InferenceBenchmark,
    target: InferenceService,
    observed: Observed,
    settings: OperatorSettings,
) -> tuple[Manifest, ...]:
    """What the load Job needs (the spec and results ConfigMaps, its account and role, a
    noisy neighbour), then the Job."""
    servers = serving_target_pods(observed.target_pods)
    chaos = bench.spec.chaos
    restart_pods = [p["metadata"]["name"] for p in servers] if chaos and chaos.restart else []
    children = [
        build_spec_config_map(bench),
        build_results_config_map(bench),
        build_load_service_account(bench),
        build_load_role(bench, restart_pods),
        build_load_role_binding(bench),
    ]
    if chaos is not None and chaos.noisy_neighbour is not None and servers:
        beside = servers[0]
        children.append(
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
    children.append(
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
    return tuple(children)


def _running(bench: InferenceBenchmark, observed: Observed) -> tuple[str, str]:
    """(reason, message) while the load Job runs: sending load, or why its pod does not."""
    name = load_job_name(bench)
    lock = held_note(bench.spec.target_ref.name)
    # A load pod that cannot start (no node has the CPU it requests, its image cannot
    # be pulled, ...) sends nothing: the status says why rather than "sending load".
    # A pod that has ended is the Job's to count (its conditions follow within moments).
    ended = ("Succeeded", "Failed")
    problem = pod_problem(
        None, [p for p in observed.load_pods if p.get("status", {}).get("phase") not in ended]
    )
    if problem is not None:
        return problem.reason, f"Job {name} sends no load yet: {problem.message} {lock}"
    shared = _beside_target(observed.load_pods, observed.target_pods)
    return "LoadRunning", f"Job {name} is sending load; {lock}{shared}"


def _finished(
    bench: InferenceBenchmark,
    observed: Observed,
    state: str,
    now: datetime,
    started: Mapping[str, Any],
) -> InferenceBenchmarkStatus:
    """The final status of a load Job that ended, with everything its report measured."""
    name = load_job_name(bench)
    report = report_of(observed.load_pods)
    results = results_config_map_name(bench)
    measured = _measured(report)
    written = report.get("resultsConfigMap") == results
    final = {
        **started,
        "completion_time": now,
        "levels": measured.levels,
        "headline": measured.headline,
        "knee_rate_per_second": measured.knee_rate_per_second,
        "chaos": measured.chaos,
        "chaos_note": measured.chaos_note,
        "results_config_map": results if written else None,
    }
    failure = report.get("failure")
    if (
        state == "Failed"
        and isinstance(failure, dict)
        and failure.get("reason") == REASON_TOO_MANY_REQUEST_ERRORS
    ):
        # The load ran to the end, but too many of its requests errored: a record of what
        # it measured, failed with the Job's reason.
        why = failure.get("message") or "too many requests errored"
        return _status(
            bench, now, "Failed", REASON_TOO_MANY_REQUEST_ERRORS, f"Job {name} failed: {why}",
            **final,
        )  # fmt: skip
    if state == "Succeeded":
        shared = _beside_target(observed.load_pods, observed.target_pods)
        if "headline" in report:
            reason, message = (
                "Completed",
                (
                    f"The benchmark ran to the end; its per-request data is in ConfigMap {results}."
                    if written
                    else f"The benchmark ran to the end, but the per-request data did not reach "
                    f"ConfigMap {results} (see the log of Job {name})."
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
        return _status(bench, now, "Succeeded", reason, message + shared, **final)
    why = report.get("message") or "the load Job failed"
    return _status(
        bench, now, "Failed", "LoadFailed", f"Job {name} failed: {why}",
        **started, completion_time=now,
    )  # fmt: skip


# --- apply --------------------------------------------------------------------------------


async def apply_step(
    api: ClusterAPI, body: Manifest, bench: InferenceBenchmark, step: Step
) -> None:
    """The step's objects in order, its deletions, then its status (only when it changed)
    with its events."""
    await apply_all(api, step.apply)
    await delete_all(api, step.delete)
    if step.status is not None:
        await write_phase_status(api, body, bench.status, step.status, step.events)


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
    step = next_step(bench, await observe(api, bench), now, settings=settings)
    await apply_step(api, body, bench, step)
    return step.phase


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


def _beside_target(load_pods: list[Manifest], target_pods: list[Manifest]) -> str:
    """A sentence when the load pod runs on a node of the target's pods (its preferred
    anti-affinity found no other), else "": said once in the status, not per level."""
    nodes = {p.get("spec", {}).get("nodeName") for p in load_pods} - {None}
    if not nodes:
        return ""
    beside = sorted(
        p["metadata"]["name"]
        for p in target_pods
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
