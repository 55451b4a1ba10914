"""The autoscaler's reading of one InferenceService, every ``periodSeconds``.

Operator mode: read each Ready pod's /metrics, decide with the HPA's rules
(vllm_operator.autoscale.decide), and set ``spec.replicas`` through the scale
subresource, under a field manager of its own. Before a scale-down, each pod's deletion
cost is set from what it served over the averaging window (``decide.deletion_costs``), so
the ReplicaSet removes the least loaded pods; the pods then drain (preStop delay, vLLM's
--shutdown-timeout). Scale-down is held while a benchmark of the service runs.

HPA mode: the reconcile renders the HorizontalPodAutoscaler; this only copies its view
(current value, desired replicas) into status.autoscaling.

Either way the last reading is in ``status.autoscaling``, written only when it changes.

One reading is :func:`observe` (every read, the pods' /metrics among them) → the pure
:func:`next_step` (a copy of the scaler's memory moves on) → :func:`apply_step` (the
scale, then the events, the metrics and the status).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from vllm_operator.autoscale.decide import (
    Decision,
    ScalerState,
    Signal,
    decide,
    deletion_costs,
    signal,
)
from vllm_operator.constants import (
    ANNOTATION_DELETION_COST,
    API_VERSION,
    AUTOSCALER_FIELD_MANAGER,
    KIND_INFERENCE_SERVICE,
)
from vllm_operator.k8s.api import ApiError, ClusterAPI, apply_status
from vllm_operator.metrics import AUTOSCALER_DECISIONS, AUTOSCALER_DESIRED, AUTOSCALER_SIGNAL
from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.models.conditions import manifest_condition, pod_condition
from vllm_operator.models.inference_service import AutoscalingStatus
from vllm_operator.reconcile.lock import active_lock
from vllm_operator.reconcile.steps import Event, Ref, emit
from vllm_operator.releases.metrics import MetricsError, PodReading, parse_metrics
from vllm_operator.render.hpa import hpa_name
from vllm_operator.render.meta import SERVER_PORT, selector_string
from vllm_operator.servers.pods import PodHTTPError

log = logging.getLogger(__name__)

# URL → the /metrics text; raises PodHTTPError on failure (the runtime gives
# PodClient.metrics).
Scrape = Callable[[str], Awaitable[str]]


def _ready(pod: Manifest) -> bool:
    if pod["metadata"].get("deletionTimestamp") or not pod.get("status", {}).get("podIP"):
        return False
    return pod_condition(pod, "Ready")


async def read_pods(pods: list[Manifest], scrape: Scrape) -> list[PodReading]:
    """The signals of every Ready pod that answers; the others are left out (and logged)."""
    ready = [p for p in pods if _ready(p)]

    async def one(pod: Manifest) -> PodReading | None:
        name = pod["metadata"]["name"]
        url = f"http://{pod['status']['podIP']}:{SERVER_PORT}/metrics"
        try:
            return parse_metrics(name, await scrape(url))
        except (PodHTTPError, MetricsError) as err:
            log.warning("Reading a pod's metrics failed.", extra={"pod": name, "error": str(err)})
            return None

    found = await asyncio.gather(*(one(p) for p in ready))
    return [r for r in found if r is not None]


# --- observe ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """Everything one reading reads, before anything is decided: in Operator mode the
    service's pods, what the Ready ones answered, the benchmark holding the scale-down lock
    and the scaler's memory; in HPA mode the HorizontalPodAutoscaler."""

    # The monotonic time of the reading (the scaler's windows count in it).
    at: float = 0.0
    # The scaler's memory of this service as the reading found it (seeded on the first).
    state: ScalerState | None = None
    pods: list[Manifest] = field(default_factory=list)
    readings: list[PodReading] = field(default_factory=list)
    # The benchmark whose load Job holds the scale-down lock (reconcile/lock.py).
    held_by: str | None = None
    hpa: Manifest | None = None


async def observe(
    api: ClusterAPI, isvc: InferenceService, *, state: ScalerState | None, scrape: Scrape, at: float
) -> Observed:
    auto = isvc.spec.autoscaling
    if not auto.enabled:
        return Observed(at=at)
    if auto.mode == "HPA":
        name = hpa_name(isvc)
        hpa = await api.get(
            "autoscaling/v2", "HorizontalPodAutoscaler", name, isvc.metadata.namespace
        )
        return Observed(at=at, hpa=hpa)
    ns = isvc.metadata.namespace
    pods = await api.list("v1", "Pod", ns, label_selector=selector_string(isvc))
    readings = await read_pods(pods, scrape)
    held_by = await active_lock(api, isvc)
    return Observed(at, state, pods, readings, held_by)


# --- decide -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """The write of spec.replicas through the scale subresource, with the deletion costs
    set first on a scale-down, and what the status and events say either way."""

    replicas: int
    # (pod, namespace, cost) for each pod whose deletion cost changes.
    costs: tuple[tuple[str, str, str], ...]
    # The event when the write goes through; the decision's words for a refusal's event.
    done: Event
    message: str
    # The reading's status when the apiserver refuses the write (a lock this reading did
    # not see yet, or RBAC): Steady at the current replicas.
    refused: AutoscalingStatus


@dataclass(frozen=True)
class Step:
    """What one reading does, and the seconds until the next (None: autoscaling is off;
    the next InferenceService event starts it again)."""

    # status.autoscaling (written only when it differs); None: none.
    status: AutoscalingStatus | None = None
    apply: tuple[Manifest, ...] = ()
    delete: tuple[Ref, ...] = ()
    events: tuple[Event, ...] = ()
    requeue: float | None = None
    # The scaler's memory after this reading (None: forgotten), and the signal it read.
    state: ScalerState | None = None
    signal: float | None = None
    scale: Scale | None = None


def _hpa_view(isvc: InferenceService, hpa: Manifest | None) -> AutoscalingStatus:
    auto = isvc.spec.autoscaling
    status: dict[str, Any] = (hpa or {}).get("status") or {}
    value = None
    for metric in status.get("currentMetrics") or []:
        value = (metric.get("pods") or {}).get("current", {}).get("averageValue") or value
    active = manifest_condition(hpa or {}, "ScalingActive")
    return AutoscalingStatus(
        mode="HPA",
        metric=auto.metric,
        target=auto.target,
        current_value=value,
        current_replicas=status.get("currentReplicas"),
        desired_replicas=status.get("desiredReplicas"),
        message=(active or {}).get("message"),
        horizontal_pod_autoscaler=hpa_name(isvc),
    )


def _costs(pods: list[Manifest], sig: Signal) -> tuple[tuple[str, str, str], ...]:
    """Each live pod's deletion cost from what it served, where it changes."""
    live = [p["metadata"] for p in pods if not p["metadata"].get("deletionTimestamp")]
    costs = deletion_costs(sig.loads, {m["name"]: m.get("creationTimestamp", "") for m in live})
    return tuple(
        (meta["name"], meta["namespace"], str(costs[meta["name"]]))
        for meta in live
        if (meta.get("annotations") or {}).get(ANNOTATION_DELETION_COST) != str(costs[meta["name"]])
    )


def next_step(isvc: InferenceService, observed: Observed, now: datetime) -> Step:
    """The reading's step, pure: nothing when autoscaling is off, the HPA's view in HPA
    mode, else the HPA's rules over the pods' signals (scale-down held under a lock).
    ``now``: the wall time a scale is recorded at."""
    auto = isvc.spec.autoscaling
    if not auto.enabled:
        return Step()
    if auto.mode == "HPA":
        return Step(_hpa_view(isvc, observed.hpa), requeue=float(auto.period_seconds))
    assert observed.state is not None  # seeded by the caller in Operator mode
    # The scaler's memory moves on a copy: the decision leaves what it was given as it was.
    state = copy.deepcopy(observed.state)
    current = isvc.spec.replicas
    sig = signal(auto, observed.readings, current, state, observed.at)
    decision = decide(auto, current, sig, state, observed.at, held_by=observed.held_by)
    old = isvc.status.autoscaling if isvc.status else None

    def status(decision: Decision, last_scale: datetime | None) -> AutoscalingStatus:
        return AutoscalingStatus(
            mode="Operator",
            metric=auto.metric,
            target=auto.target,
            current_value=None if sig.value is None else f"{sig.value:.3g}",
            pods_read=sig.pods,
            current_replicas=current,
            desired_replicas=decision.desired,
            decision=decision.decision,
            message=decision.message,
            last_scale_time=last_scale,
        )

    last_scale = old.last_scale_time if old else None
    step = Step(requeue=float(auto.period_seconds), state=state, signal=sig.value)
    if decision.desired != current:
        refused = Decision(current, "Steady", decision.message + " (refused; see events)")
        reason = "ScaledUp" if decision.desired > current else "ScaledDown"
        scale = Scale(
            replicas=decision.desired,
            costs=_costs(observed.pods, sig) if decision.desired < current else (),
            done=Event(reason, decision.message),
            message=decision.message,
            refused=status(refused, last_scale),
        )
        return replace(step, status=status(decision, now), scale=scale)
    events: tuple[Event, ...] = ()
    if decision.decision == "ScaleDownHeld" and (old is None or old.decision != "ScaleDownHeld"):
        events = (Event("ScaleDownHeld", decision.message),)
    return replace(step, status=status(decision, last_scale), events=events)


# --- apply --------------------------------------------------------------------------------


async def _write(api: ClusterAPI, body: Manifest, autoscaling: AutoscalingStatus | None) -> None:
    old = (body.get("status") or {}).get("autoscaling")
    new = autoscaling.to_wire() if autoscaling is not None else None
    if old == new:
        return
    await apply_status(
        api,
        body,
        {"autoscaling": new} if new is not None else {},
        field_manager=AUTOSCALER_FIELD_MANAGER,
    )


async def _scale(api: ClusterAPI, isvc: InferenceService, body: Manifest, scale: Scale) -> bool:
    """Write spec.replicas through the scale subresource (costs first on a scale-down);
    whether the apiserver took it."""
    ns, name = isvc.metadata.namespace, isvc.metadata.name
    try:
        for pod, pod_ns, cost in scale.costs:
            await api.patch(
                "v1",
                "Pod",
                pod,
                pod_ns,
                {"metadata": {"annotations": {ANNOTATION_DELETION_COST: cost}}},
                field_manager=AUTOSCALER_FIELD_MANAGER,
            )
        await api.patch(
            API_VERSION,
            KIND_INFERENCE_SERVICE,
            name,
            ns,
            {"spec": {"replicas": scale.replicas}},
            subresource="scale",
            field_manager=AUTOSCALER_FIELD_MANAGER,
        )
    except ApiError as err:
        if err.transient:
            raise
        # The admission policy refused it (a lock this reading did not see yet), or RBAC.
        await api.event(
            body, reason="ScaleRefused", message=f"{scale.message} Refused: {err}", warning=True
        )
        return False
    await emit(api, body, (scale.done,))
    log.info("Autoscaled.", extra={"object": f"{ns}/{name}", "decision": scale.message})
    return True


async def apply_step(
    api: ClusterAPI, body: Manifest, isvc: InferenceService, step: Step, *, at: float
) -> None:
    """The scale (when decided), the events, the metrics, then status.autoscaling."""
    status = step.status
    if step.scale is not None:
        assert step.state is not None
        if await _scale(api, isvc, body, step.scale):
            step.state.record_change(at, step.scale.replicas - isvc.spec.replicas)
        else:
            status = step.scale.refused
    await emit(api, body, step.events)
    if status is not None and status.mode == "Operator":
        ns, name = isvc.metadata.namespace, isvc.metadata.name
        AUTOSCALER_DECISIONS.labels(status.decision).inc()
        assert status.desired_replicas is not None  # the Operator's readings say
        AUTOSCALER_DESIRED.labels(ns, name).set(status.desired_replicas)
        if step.signal is not None:
            AUTOSCALER_SIGNAL.labels(ns, name, status.metric).set(step.signal)
        log.debug(
            "Autoscaler reading.", extra={"object": f"{ns}/{name}", "decision": status.message}
        )
    await _write(api, body, status)


async def autoscale_inference_service(
    api: ClusterAPI,
    body: Manifest,
    *,
    states: dict[str, ScalerState],
    scrape: Scrape,
    clock: Callable[[], float] = time.monotonic,
    wall: datetime | None = None,
) -> float | None:
    """One reading; returns the seconds until the next one, or None when autoscaling is
    off (the next InferenceService event starts it again)."""
    key = str(body["metadata"].get("uid") or body["metadata"]["name"])
    try:
        isvc = InferenceService.model_validate(body)
    except ValidationError:
        states.pop(key, None)
        return None  # the reconcile reports the invalid spec
    auto = isvc.spec.autoscaling
    operator = auto.enabled and auto.mode == "Operator"
    at = clock() if operator else 0.0
    state: ScalerState | None = None
    if operator:
        # The memory is seeded before any read, so a failed reading keeps the seed's time.
        state = states.setdefault(key, ScalerState.seeded(at, isvc.spec.replicas))
    observed = await observe(api, isvc, state=state, scrape=scrape, at=at)
    now = (wall or datetime.now(UTC)).replace(microsecond=0)
    step = next_step(isvc, observed, now)
    if step.state is None:
        states.pop(key, None)
    else:
        states[key] = step.state
    await apply_step(api, body, isvc, step, at=at)
    return step.requeue
