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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
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
from vllm_operator.models.inference_service import AutoscalingStatus
from vllm_operator.reconcile.benchmark import active_lock
from vllm_operator.reconcile.conditions import manifest_condition, pod_condition
from vllm_operator.releases.metrics import MetricsError, PodReading, parse_metrics
from vllm_operator.render.hpa import hpa_name
from vllm_operator.render.meta import SERVER_PORT, selector_string

log = logging.getLogger(__name__)

# URL → the /metrics text; raises on failure.
Scrape = Callable[[str], Awaitable[str]]
SCRAPE_TIMEOUT_SECONDS = 3.0


def http_scraper(client: httpx.AsyncClient) -> Scrape:
    async def scrape(url: str) -> str:
        response = await client.get(url, timeout=SCRAPE_TIMEOUT_SECONDS)
        response.raise_for_status()
        return response.text

    return scrape


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
        except (httpx.HTTPError, OSError, MetricsError) as err:
            log.warning("Reading a pod's metrics failed.", extra={"pod": name, "error": str(err)})
            return None

    found = await asyncio.gather(*(one(p) for p in ready))
    return [r for r in found if r is not None]


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


async def _set_deletion_costs(api: ClusterAPI, pods: list[Manifest], sig: Signal) -> None:
    live = [p["metadata"] for p in pods if not p["metadata"].get("deletionTimestamp")]
    costs = deletion_costs(sig.loads, {m["name"]: m.get("creationTimestamp", "") for m in live})
    for meta in live:
        cost = str(costs[meta["name"]])
        if (meta.get("annotations") or {}).get(ANNOTATION_DELETION_COST) == cost:
            continue
        await api.patch(
            "v1",
            "Pod",
            meta["name"],
            meta["namespace"],
            {"metadata": {"annotations": {ANNOTATION_DELETION_COST: cost}}},
            field_manager=AUTOSCALER_FIELD_MANAGER,
        )


async def _hpa_view(api: ClusterAPI, isvc: InferenceService) -> AutoscalingStatus:
    auto = isvc.spec.autoscaling
    name = hpa_name(isvc)
    hpa = await api.get("autoscaling/v2", "HorizontalPodAutoscaler", name, isvc.metadata.namespace)
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
        horizontal_pod_autoscaler=name,
    )


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
    ns, name = isvc.metadata.namespace, isvc.metadata.name
    if not auto.enabled:
        states.pop(key, None)
        await _write(api, body, None)
        return None
    if auto.mode == "HPA":
        states.pop(key, None)
        await _write(api, body, await _hpa_view(api, isvc))
        return float(auto.period_seconds)

    now = clock()
    current = isvc.spec.replicas
    state = states.get(key)
    if state is None:
        state = states[key] = ScalerState.seeded(now, current)
    pods = await api.list("v1", "Pod", ns, label_selector=selector_string(isvc))
    readings = await read_pods(pods, scrape)
    sig = signal(auto, readings, current, state, now)
    held_by = await active_lock(api, isvc)
    decision = decide(auto, current, sig, state, now, held_by=held_by)

    old = isvc.status.autoscaling if isvc.status else None
    last_scale = old.last_scale_time if old else None
    if decision.desired != current:
        applied = await _scale(api, isvc, body, pods, sig, decision, current)
        if applied:
            state.record_change(now, decision.desired - current)
            last_scale = (wall or datetime.now(UTC)).replace(microsecond=0)
        else:
            decision = Decision(current, "Steady", decision.message + " (refused; see events)")
    elif decision.decision == "ScaleDownHeld" and (old is None or old.decision != "ScaleDownHeld"):
        await api.event(body, reason="ScaleDownHeld", message=decision.message)

    AUTOSCALER_DECISIONS.labels(decision.decision).inc()
    AUTOSCALER_DESIRED.labels(ns, name).set(decision.desired)
    if sig.value is not None:
        AUTOSCALER_SIGNAL.labels(ns, name, auto.metric).set(sig.value)
    log.debug("Autoscaler reading.", extra={"object": f"{ns}/{name}", "decision": decision.message})
    await _write(
        api,
        body,
        AutoscalingStatus(
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
        ),
    )
    return float(auto.period_seconds)


async def _scale(
    api: ClusterAPI,
    isvc: InferenceService,
    body: Manifest,
    pods: list[Manifest],
    sig: Signal,
    decision: Decision,
    current: int,
) -> bool:
    """Write spec.replicas through the scale subresource (costs first on a scale-down)."""
    ns, name = isvc.metadata.namespace, isvc.metadata.name
    try:
        if decision.desired < current:
            await _set_deletion_costs(api, pods, sig)
        await api.patch(
            API_VERSION,
            KIND_INFERENCE_SERVICE,
            name,
            ns,
            {"spec": {"replicas": decision.desired}},
            subresource="scale",
            field_manager=AUTOSCALER_FIELD_MANAGER,
        )
    except ApiError as err:
        if err.transient:
            raise
        # The admission policy refused it (a lock this reading did not see yet), or RBAC.
        await api.event(
            body, reason="ScaleRefused", message=f"{decision.message} Refused: {err}", warning=True
        )
        return False
    reason = "ScaledUp" if decision.desired > current else "ScaledDown"
    await api.event(body, reason=reason, message=decision.message)
    log.info("Autoscaled.", extra={"object": f"{ns}/{name}", "decision": decision.message})
    return True
