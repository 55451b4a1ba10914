"""Signal → desired replicas, with the HorizontalPodAutoscaler's rules.

The same rules as the HPA controller, so a service behaves alike in both modes:

- per-pod signals (requests waiting or running, KV-cache usage) are averaged over the pods
  read; the recommendation is ``ceil(sum / target)``, which counts pods still warming up as
  idle, so a scale-up in progress is not repeated while new pods start;
- a service-wide signal (a TTFT percentile) scales the current replicas by
  ``value / target``;
- nothing changes while the signal is within 10 % of the target (the HPA's tolerance);
- stabilisation: a scale-up uses the lowest recommendation of the scale-up window, a
  scale-down the highest of the scale-down window;
- rates: at most ``scaleUpPods`` added and ``scaleDownPods`` removed per period;
- bounds: min and max replicas;
- a scale-down is held while a benchmark of the service runs (scale-up is not);
- the pods that served the least over the averaging window get the lowest deletion costs
  (``deletion_costs``), so the ReplicaSet removes them first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from vllm_operator.autoscale.signals import delta, merge, quantile
from vllm_operator.models.inference_service import (
    PER_POD_METRICS,
    AutoscalingDecision,
    AutoscalingSpec,
)
from vllm_operator.releases.metrics import PodLoad, PodReading, load, restarted

TOLERANCE = 0.1
# Requests in the server are averaged over at least this long (see ``signal``).
AVERAGE_SECONDS = 15.0
_QUANTILES = {"TTFTP90": 0.9, "TTFTP99": 0.99}


@dataclass
class ScalerState:
    """What one service's autoscaler remembers between readings (in memory, as the HPA
    controller does). It starts with the current replicas as a floor for scale-down, so a
    scale-down after an operator restart still waits a whole window."""

    recommendations: list[tuple[float, int]] = field(default_factory=list)
    # (time, replicas) when the autoscaler started: a floor for scale-down for one window.
    seed: tuple[float, int] | None = None
    changes: list[tuple[float, int]] = field(default_factory=list)
    # Each pod's recent readings with their times, oldest first: the last one is the
    # baseline for histogram deltas, the oldest (about one averaging window back) the
    # baseline for the requests-in-server averages and the served rates. A pod that was
    # not read this time keeps its history for two windows (one missed reading at least).
    readings: dict[str, list[tuple[float, PodReading]]] = field(default_factory=dict)

    @classmethod
    def seeded(cls, now: float, replicas: int) -> ScalerState:
        return cls(seed=(now, replicas))

    def record_change(self, now: float, change: int) -> None:
        self.changes.append((now, change))

    def prune(self, now: float, keep_seconds: float) -> None:
        self.recommendations = [r for r in self.recommendations if r[0] > now - keep_seconds]
        self.changes = [c for c in self.changes if c[0] > now - keep_seconds]


@dataclass(frozen=True)
class Signal:
    """The signal's value (None: nothing to read), the raw recommendation, and the load of
    each pod read now or within the last two windows (for the deletion costs)."""

    value: float | None
    recommendation: int | None
    pods: int
    loads: dict[str, PodLoad] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    desired: int
    decision: AutoscalingDecision
    message: str


def _per_pod(metric: str, reading: PodReading, pod_load: PodLoad) -> float:
    if metric == "RequestsWaiting":
        return pod_load.waiting
    if metric == "RequestsRunning":
        return pod_load.running
    return reading.kv_cache_usage


def _average_seconds(spec: AutoscalingSpec) -> float:
    return max(AVERAGE_SECONDS, float(spec.period_seconds))


def _remember(
    history: list[tuple[float, PodReading]], now: float, reading: PodReading, window: float
) -> list[tuple[float, PodReading]]:
    """The pod's history with this reading added, keeping the newest reading at least
    ``window`` old (the averages' baseline) and everything after it. A server whose
    counters went down restarted: its history starts again."""
    if history and restarted(reading, history[-1][1]):
        history = []
    history = [*history, (now, reading)]
    while len(history) > 2 and history[1][0] <= now - window:
        history.pop(0)
    return history


def _window_load(history: list[tuple[float, PodReading]], window: float) -> PodLoad:
    """A pod's load from its remembered readings: its last reading against the oldest, over
    that span or ``window``, whichever is longer."""
    last_t, last = history[-1]
    if len(history) == 1:
        return load(last, None, 0)
    first_t, first = history[0]
    # The gauges too are averaged over the readings since the baseline: a snapshot that
    # caught a short request is one reading among several, not the signal.
    since = [h for _, h in history[1:]]
    smoothed = replace(
        last,
        running=sum(h.running for h in since) / len(since),
        waiting=sum(h.waiting for h in since) / len(since),
    )
    return load(smoothed, first, max(last_t - first_t, window))


def signal(
    spec: AutoscalingSpec,
    readings: list[PodReading],
    current: int,
    state: ScalerState,
    now: float,
) -> Signal:
    """The signal from this reading's pods; the baselines in ``state`` move forward.

    Requests in the server are averaged (Little's law, see ``releases.metrics.load``) from the
    oldest remembered reading, over at least ``AVERAGE_SECONDS``: a request's whole time
    is counted when it finishes, so over one short period a single long request that ends
    would read as several in flight (a 6 s request ending in a 2 s period: 3). Over 15 s
    it reads as 0.4. A pod read for less than that is averaged over the full 15 s
    (biased low while it is new, never spiking). The request gauges are averaged over the
    same readings, so both sides of the larger-of are 15 s averages.

    A pod not read this time (its scrape failed) keeps its history for two windows, so a
    failed scrape neither drops its baseline (its next reading would have only the gauges)
    nor leaves it out of the deletion costs: its load is the one of its last reading."""
    target = float(spec.target)
    window = _average_seconds(spec)
    before = state.readings
    # The last reading of each pod: the baseline for histogram deltas.
    previous = {pod: history[-1] for pod, history in before.items() if history}
    state.readings = {}
    loads: dict[str, PodLoad] = {}
    for r in readings:
        history = _remember(before.get(r.pod, []), now, r, window)
        state.readings[r.pod] = history
        loads[r.pod] = _window_load(history, window)
    for pod, history in before.items():
        if pod not in state.readings and history and history[-1][0] > now - 2 * window:
            state.readings[pod] = history
            loads[pod] = _window_load(history, window)
    n = len(readings)
    if spec.metric in PER_POD_METRICS:
        if not readings:
            return Signal(None, None, 0, loads)
        total = sum(_per_pod(spec.metric, r, loads[r.pod]) for r in readings)
        average = total / n
        if abs(average / target - 1) <= TOLERANCE:
            return Signal(average, current, n, loads)
        return Signal(average, math.ceil(total / target - 1e-9), n, loads)
    # A service-wide TTFT percentile over the observations since the last reading.
    deltas = []
    for r in readings:
        last = previous.get(r.pod)
        d = delta(r.ttft, last[1].ttft if last else None)
        if d is not None:
            deltas.append(d)
    if not deltas:
        return Signal(None, None, n, loads)
    value = quantile(_QUANTILES[spec.metric], merge(deltas))
    if value is None:
        value = 0.0  # no request in the period: nothing to serve quickly
    ratio = value / target
    if abs(ratio - 1) <= TOLERANCE:
        return Signal(value, current, n, loads)
    return Signal(value, math.ceil(current * ratio - 1e-9), n, loads)


def decide(
    spec: AutoscalingSpec,
    current: int,
    sig: Signal,
    state: ScalerState,
    now: float,
    *,
    held_by: str | None = None,
) -> Decision:
    """The replicas to set now, and why.

    A pass without a reading (no pod answered, or none had a baseline yet) keeps the
    replicas and records nothing: it is no evidence either way. (Recorded as "the current
    replicas are needed", one missed scrape restarted the scale-down window, and a service
    whose benchmark had just ended waited a whole window more.) The HPA also skips a pass
    whose metrics it cannot read. Replicas outside a changed min or max still move to it."""
    low, high = spec.min_replicas, spec.max_replicas
    if sig.recommendation is None and low <= current <= high:
        return Decision(
            current,
            "NoSignal",
            f"{spec.metric} no reading (target {spec.target}, {sig.pods} pods read): "
            f"keeping {current} replicas.",
        )
    # Without a reading only the bounds move the replicas (a changed min or max).
    raw = sig.recommendation if sig.recommendation is not None else current
    recommendation = min(max(raw, low), high)
    history = state.recommendations
    up = min(
        (r for t, r in history if t > now - spec.scale_up_window_seconds),
        default=recommendation,
    )
    down = max(
        (r for t, r in history if t > now - spec.scale_down_window_seconds),
        default=recommendation,
    )
    if state.seed is not None and state.seed[0] > now - spec.scale_down_window_seconds:
        down = max(down, state.seed[1])
    up, down = min(up, recommendation), max(down, recommendation)
    history.append((now, recommendation))
    stabilised = min(max(current, up), down)

    period_from = now - spec.period_seconds
    added = sum(c for t, c in state.changes if t > period_from and c > 0)
    removed = -sum(c for t, c in state.changes if t > period_from and c < 0)
    desired = stabilised
    if desired > current:
        desired = min(desired, max(current, current - added + spec.scale_up_pods))
    elif desired < current:
        desired = max(desired, min(current, current + removed - spec.scale_down_pods))
    desired = min(max(desired, low), high)
    state.prune(
        now,
        max(spec.scale_up_window_seconds, spec.scale_down_window_seconds, spec.period_seconds) + 1,
    )

    shown = "no reading" if sig.value is None else f"{sig.value:.3g}"
    about = f"{spec.metric} {shown} (target {spec.target}, {sig.pods} pods read)"
    if desired < current and held_by is not None:
        return Decision(
            current,
            "ScaleDownHeld",
            f"{about}: would scale down to {desired}, held while InferenceBenchmark "
            f"{held_by} runs.",
        )
    if desired > current:
        return Decision(desired, "ScaleUp", f"{about}: {current} → {desired} replicas.")
    if desired < current:
        return Decision(desired, "ScaleDown", f"{about}: {current} → {desired} replicas.")
    if recommendation < current:
        return Decision(
            current,
            "Steady",
            f"{about}: {recommendation} would do; waiting out the "
            f"{spec.scale_down_window_seconds} s scale-down window.",
        )
    return Decision(current, "Steady", f"{about}: {current} replicas.")


def _served(pod_load: PodLoad) -> tuple[float, float, float]:
    return (pod_load.tokens_per_second, pod_load.finished_per_second, pod_load.in_flight)


def deletion_costs(loads: dict[str, PodLoad], created: dict[str, str]) -> dict[str, int]:
    """Pod deletion costs (controller.kubernetes.io/pod-deletion-cost) for the pods in
    ``created`` (name → creationTimestamp): the ReplicaSet removes the lowest cost first.

    The pods are ranked by what they served over the averaging window: tokens per second
    (prompt and generated), then requests finished per second, then the requests they hold
    (running and waiting, averaged); a pod with no load known (not read in the last two
    windows) ranks above every pod read, since it may be the busiest. Equal pods: the
    newer goes first (the ReplicaSet's own preference), then the name in order. The costs
    are the ranks, 0 for the pod to remove first, so no two are equal and the ReplicaSet
    never falls back on its own tie-break among Ready pods."""
    order = sorted(created)
    order.sort(key=created.__getitem__, reverse=True)  # stable: newer first, then by name
    order.sort(key=lambda pod: (0, *_served(loads[pod])) if pod in loads else (1, 0, 0, 0))
    return {pod: rank for rank, pod in enumerate(order)}
