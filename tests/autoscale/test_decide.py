"""The scaling decision as table tests: signal → recommendation → stabilisation, rates,
bounds and the benchmark hold; and the deletion-cost ordering."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_operator.autoscale.decide import ScalerState, Signal, decide, deletion_costs, signal
from vllm_operator.models.inference_service import AutoscalingSpec
from vllm_operator.releases.metrics import PodLoad, PodReading


def spec(**fields: Any) -> AutoscalingSpec:
    base: dict[str, Any] = {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": 8,
        "metric": "RequestsRunning",
        "target": "4",
        "periodSeconds": 15,
        "scaleUpWindowSeconds": 0,
        "scaleDownWindowSeconds": 60,
        "scaleUpPods": 4,
        "scaleDownPods": 1,
    }
    base.update(fields)
    return AutoscalingSpec.model_validate(base)


def pod(name: str, running: float = 0, waiting: float = 0, kv: float = 0.0) -> PodReading:
    return PodReading(name, running, waiting, kv, ())


def ttft(name: str, *counts: float) -> PodReading:
    """A pod whose TTFT histogram has cumulative counts at 0.05, 0.1, 0.5, 1 s and +Inf."""
    bounds = (0.05, 0.1, 0.5, 1.0, float("inf"))
    return PodReading(name, 0, 0, 0.0, tuple(zip(bounds, counts, strict=True)))


@pytest.mark.parametrize(
    ("fields", "readings", "current", "value", "recommendation"),
    [
        # per pod: ceil(sum / target)
        ({}, [pod("a", running=12)], 1, 12.0, 3),
        ({}, [pod("a", running=6), pod("b", running=6)], 2, 6.0, 3),
        # within 10 % of the target: no change
        ({}, [pod("a", running=4.3), pod("b", running=4.1)], 2, 4.2, 2),
        # pods still warming up are not read: they count as idle (no repeated scale-up)
        ({}, [pod("a", running=12)], 3, 12.0, 3),
        ({}, [pod("a", running=0), pod("b", running=1)], 2, 0.5, 1),
        ({"metric": "RequestsWaiting", "target": "2"}, [pod("a", waiting=5)], 1, 5.0, 3),
        (
            {"metric": "KVCacheUsage", "target": "0.5"},
            [pod("a", kv=0.9), pod("b", kv=0.9)],
            2,
            0.9,
            4,
        ),
        ({}, [], 3, None, None),
    ],
)
def test_signal_to_recommendation(
    fields: dict[str, Any],
    readings: list[PodReading],
    current: int,
    value: float | None,
    recommendation: int | None,
) -> None:
    sig = signal(spec(**fields), readings, current, ScalerState(), 0.0)
    assert sig.value == pytest.approx(value) if value is not None else sig.value is None
    assert sig.recommendation == recommendation


def test_a_ttft_percentile_comes_from_the_observations_since_the_last_reading() -> None:
    s = spec(metric="TTFTP90", target="0.2")
    state = ScalerState()
    # First reading: no baseline, no signal.
    first = signal(s, [ttft("a", 100, 100, 100, 100, 100)], 2, state, 0)
    assert first.value is None and first.recommendation is None
    # 100 new requests, 80 under 0.1 s and 20 in (0.1, 0.5]: P90 = 0.1 + 0.4 * 10/20.
    second = signal(s, [ttft("a", 150, 180, 200, 200, 200)], 2, state, 15)
    assert second.value == pytest.approx(0.3)
    assert second.recommendation == 3  # ceil(2 * 0.3 / 0.2)
    # Nothing new: nothing to serve quickly, the recommendation goes to zero (then min).
    third = signal(s, [ttft("a", 150, 180, 200, 200, 200)], 3, state, 30)
    assert third.value == 0.0 and third.recommendation == 0


def test_a_restarted_pod_counts_all_its_observations_as_new() -> None:
    s = spec(metric="TTFTP99", target="1")
    state = ScalerState()
    signal(s, [ttft("a", 500, 500, 500, 500, 500)], 1, state, 0)
    sig = signal(s, [ttft("a", 0, 0, 10, 10, 10)], 1, state, 15)
    assert sig.value is not None and 0.1 < sig.value <= 0.5


def run(s: AutoscalingSpec, steps: list[tuple[float, int | None]], start: int) -> list[int]:
    """Feed recommendations at times; apply each decision; return replicas after each."""
    state = ScalerState.seeded(steps[0][0], start)
    current, out = start, []
    for now, rec in steps:
        d = decide(s, current, Signal(1.0 if rec is not None else None, rec, 1), state, now)
        if d.desired != current:
            state.record_change(now, d.desired - current)
            current = d.desired
        out.append(current)
    return out


@pytest.mark.parametrize(
    ("fields", "start", "steps", "expected"),
    [
        # Scale-up is immediate with no window, limited to scaleUpPods per period.
        ({}, 1, [(0, 3)], [3]),
        ({"scaleUpPods": 2}, 1, [(0, 8), (5, 8), (16, 8), (32, 8)], [3, 3, 5, 7]),
        # Bounds.
        ({"maxReplicas": 4}, 1, [(0, 10)], [4]),
        ({"minReplicas": 2}, 3, [(0, 0), (61, 0), (80, 0)], [3, 2, 2]),
        # Scale-down waits the whole window (the seed counts: the window starts at start).
        ({}, 3, [(0, 1), (30, 1), (59, 1), (61, 1)], [3, 3, 3, 2]),
        # ... one pod per period.
        ({}, 3, [(0, 1), (61, 1), (70, 1), (77, 1)], [3, 2, 2, 1]),
        # A spike inside the window restarts the wait.
        ({}, 2, [(0, 1), (40, 2), (70, 1), (99, 1), (101, 1)], [2, 2, 2, 2, 1]),
        # Flapping below the window never scales down.
        ({}, 2, [(t, 1 if t % 20 else 2) for t in range(0, 200, 10)], [2] * 20),
        # A scale-up window takes the lowest recommendation of the window.
        (
            {"scaleUpWindowSeconds": 30},
            1,
            [(0, 1), (10, 4), (20, 2), (30, 4), (41, 4), (51, 4)],
            [1, 1, 1, 2, 2, 4],
        ),
        # No signal: replicas stay (within bounds).
        ({}, 3, [(0, None), (100, None)], [3, 3]),
        ({"maxReplicas": 2}, 3, [(0, None)], [2]),
        # Scale to zero when allowed.
        ({"minReplicas": 0, "scaleToZero": True, "scaleDownWindowSeconds": 0}, 1, [(0, 0)], [0]),
    ],
)
def test_stabilisation_rates_and_bounds(
    fields: dict[str, Any],
    start: int,
    steps: list[tuple[float, int | None]],
    expected: list[int],
) -> None:
    assert run(spec(**fields), steps, start) == expected


def test_a_benchmark_holds_scale_down_but_not_scale_up() -> None:
    s = spec(scaleDownWindowSeconds=0)
    state = ScalerState.seeded(0, 3)
    held = decide(s, 3, Signal(0.0, 1, 2), state, 10, held_by="load")
    assert (held.desired, held.decision) == (3, "ScaleDownHeld")
    assert "InferenceBenchmark load" in held.message
    up = decide(s, 3, Signal(9.0, 5, 2), state, 20, held_by="load")
    assert (up.desired, up.decision) == (5, "ScaleUp")
    # After the benchmark, the held recommendation applies at once (its window is over).
    after = decide(s, 5, Signal(0.0, 1, 2), state, 30)
    assert (after.desired, after.decision) == (4, "ScaleDown")


def test_decisions_say_why() -> None:
    s = spec()
    state = ScalerState.seeded(0, 2)
    steady = decide(s, 2, Signal(1.0, 1, 2), state, 5)
    assert steady.decision == "Steady"
    assert "scale-down window" in steady.message
    none = decide(s, 2, Signal(None, None, 0), state, 10)
    assert none.decision == "NoSignal"


def test_a_pass_without_a_reading_neither_scales_nor_restarts_the_scale_down_window() -> None:
    s = spec(scaleDownWindowSeconds=60)
    state = ScalerState.seeded(0, 2)
    # One replica would do from t=10 on; the window runs out at t=70, the seed's at t=60.
    for t in (10, 20, 30):
        assert decide(s, 2, Signal(0.1, 1, 2), state, t).decision == "Steady"
    missed = decide(s, 2, Signal(None, None, 0), state, 35)
    assert (missed.desired, missed.decision) == (2, "NoSignal")
    assert "no reading" in missed.message and "keeping 2 replicas" in missed.message
    assert decide(s, 2, Signal(0.1, 1, 2), state, 50).decision == "Steady"
    # 60 s after the first reading asking for one: down, the missed pass notwithstanding.
    late = decide(s, 2, Signal(0.1, 1, 2), state, 71)
    assert (late.desired, late.decision) == (1, "ScaleDown")


def timed(name: str, e2e: float, queue: float, running: float = 0) -> PodReading:
    return PodReading(name, running, 0, 0.0, (), e2e_seconds=e2e, queue_seconds=queue)


def test_requests_in_flight_are_also_averaged_between_readings() -> None:
    """Little's law: 45 s of request time in 15 s is 3 requests in the server on average,
    of which 0.5 queued; the gauge (a snapshot) said 0. A long request the snapshot sees
    running counts even when little finished."""
    s = spec(target="1")
    state = ScalerState()
    first = signal(s, [timed("a", 100, 10), timed("b", 5, 0, running=2)], 2, state, 0)
    assert first.value == pytest.approx(1.0)  # no baseline yet: the gauges alone
    sig = signal(s, [timed("a", 145, 17.5), timed("b", 6, 0, running=2)], 2, state, 15)
    assert sig.loads["a"] == PodLoad(running=2.5, waiting=0.5)
    assert sig.loads["b"] == PodLoad(running=2.0, waiting=0.0)
    assert sig.value == pytest.approx(2.25) and sig.recommendation == 5
    waiting = signal(spec(metric="RequestsWaiting", target="1"),
                     [timed("a", 190, 32.5)], 2, state, 30)  # fmt: skip
    assert waiting.value == pytest.approx(1.0)
    # A server that restarted (its sums went down) has no baseline.
    restarted = signal(s, [timed("a", 1, 0)], 2, state, 45)
    assert restarted.loads["a"] == PodLoad(0, 0)


def test_one_long_request_ending_does_not_read_as_many_in_flight() -> None:
    """A request's whole time counts when it ends. Read every 2 s, a 6 s request ending
    would be 3 requests in flight over the last period; the average runs over the last
    15 s at least, so it is 0.4, and a steady load still reads at its level. The gauges
    are averaged over the same readings."""
    s = spec(target="3", periodSeconds=2)
    state = ScalerState()
    for t in range(0, 20, 2):  # an idle pod, read every 2 s
        signal(s, [timed("a", 0, 0)], 1, state, t)
    spike = signal(s, [timed("a", 6, 0)], 1, state, 20)
    assert spike.loads["a"].running == pytest.approx(6 / 16)  # baseline 16 s back
    assert spike.recommendation == 1
    # A gauge snapshot that caught two short requests is one reading of eight since the
    # baseline (16 s back), not the signal.
    quiet = ScalerState()
    for t in range(0, 20, 2):
        signal(s, [timed("q", 0, 0)], 1, quiet, t)
    caught = signal(s, [timed("q", 0, 0, running=2)], 1, quiet, 20)
    assert caught.loads["q"].running == pytest.approx(2 / 8)
    # A pod new to the autoscaler is averaged over the full window too: low, not high.
    fresh = ScalerState()
    signal(s, [timed("b", 0, 0)], 1, fresh, 0)
    assert signal(s, [timed("b", 6, 0)], 1, fresh, 2).loads["b"].running == pytest.approx(0.4)
    # Steady: 4 requests in the server all the time (4 s of request time a second).
    steady = ScalerState()
    for t in range(0, 40, 2):
        sig = signal(s, [timed("c", 4.0 * t, 0)], 1, steady, t)
    assert sig.loads["c"].running == pytest.approx(4.0)
    assert sig.recommendation == 2
    # The history stays one window long.
    assert steady.readings["c"][0][0] >= 38 - 15 - 2


def test_a_request_counts_at_most_the_span_it_was_read_over() -> None:
    """Two requests that stalled for 70 s end within one 15 s span: their 140 s of request
    time is two requests in the server over the span (as the gauge had shown them), not
    9.3. Without the finished counter nothing bounds the sum."""
    s = spec(target="3")

    def reading(e2e: float, finished: float | None, running: float) -> PodReading:
        return PodReading("a", running, 0, 0.0, (), e2e_seconds=e2e, finished=finished)

    bounded, unbounded = ScalerState(), ScalerState()
    signal(s, [reading(0, 10, 2)], 1, bounded, 0)
    ended = signal(s, [reading(140, 12, 0)], 1, bounded, 15)
    assert ended.loads["a"].running == pytest.approx(2.0)
    assert ended.recommendation == 1
    signal(s, [reading(0, None, 2)], 1, unbounded, 0)
    assert signal(s, [reading(140, None, 0)], 1, unbounded, 15).loads["a"].running == pytest.approx(
        140 / 15
    )


def served(name: str, tokens: float, finished: float, e2e: float = 0.0) -> PodReading:
    """A pod whose gauges read 0 and whose counters read ``tokens`` and ``finished``."""
    return PodReading(name, 0, 0, 0.0, (), e2e_seconds=e2e, tokens=tokens, finished=finished)


def test_the_pods_that_served_least_get_the_lowest_deletion_costs() -> None:
    loads = {
        "busy": PodLoad(0, 0, tokens_per_second=300, finished_per_second=2),
        "light": PodLoad(0, 0, tokens_per_second=40, finished_per_second=0.5),
        "idle": PodLoad(0, 0),
    }
    created = {
        "busy": "2026-01-01T00:09:00Z",
        "light": "2026-01-01T00:05:00Z",
        "idle": "2026-01-01T00:00:00Z",
    }
    costs = deletion_costs(loads, created)
    # The ReplicaSet removes the lowest cost first: the idle pod, though it is the oldest.
    assert costs == {"idle": 0, "light": 1, "busy": 2}


def test_deletion_costs_fall_back_to_requests_finished_then_to_requests_held() -> None:
    """Without token counters (a server that does not report them) the requests finished
    rank the pods; without those either, the requests they hold (as before)."""
    loads = {
        "finished-more": PodLoad(0, 0, finished_per_second=1.0),
        "finished-less": PodLoad(5, 1, finished_per_second=0.5),
        "holds-more": PodLoad(6, 2),
        "holds-less": PodLoad(0.4, 0),
    }
    costs = deletion_costs(loads, dict.fromkeys(loads, ""))
    ranked = sorted(costs, key=costs.__getitem__)
    assert ranked == ["holds-less", "holds-more", "finished-less", "finished-more"]


def test_equal_pods_get_distinct_costs_the_newer_pod_lowest_then_by_name() -> None:
    """Ties are broken here, not left to the ReplicaSet: the newer pod goes first (the
    ReplicaSet's own preference, kept explicit), then the name in order. A pod with no load
    known (not read) ranks above every pod read."""
    idle = PodLoad(0, 0)
    created = {
        "b-old": "2026-01-01T00:00:00Z",
        "c-new": "2026-01-01T00:09:00Z",
        "a-new": "2026-01-01T00:09:00Z",
        "unread": "2026-01-01T00:10:00Z",
    }
    costs = deletion_costs({"b-old": idle, "c-new": idle, "a-new": idle}, created)
    assert costs == {"a-new": 0, "c-new": 1, "b-old": 2, "unread": 3}
    # Pods not in ``created`` (gone, or being deleted) get no cost.
    assert deletion_costs({"gone": idle}, {"b-old": ""}) == {"b-old": 0}


def test_the_pod_that_served_over_the_window_is_kept_though_both_gauges_read_zero() -> None:
    """Both pods' request gauges read 0 at every reading, as vLLM's snapshots do under a
    light load of short requests; one pod served a request (20 tokens, 15 ms) every 4 s,
    so its latency sums make 0.004 requests in the server on average: 0 in the old
    cost of 100 * requests, a tie with the idle pod. The counters saw every request: that pod
    ranks above the idle one, although it is the newer, which the ReplicaSet's tie-break
    would remove."""
    s = spec(target="3", periodSeconds=2)
    state = ScalerState()
    for t in range(0, 32, 2):
        n = t // 4
        busy = served("busy", tokens=20.0 * n, finished=n, e2e=0.015 * n)
        sig = signal(s, [served("idle", 500, 40), busy], 2, state, t)
    # From the baseline 16 s back (t = 14, 3 requests) to t = 30 (7 requests).
    assert sig.loads["busy"].in_flight == pytest.approx(0.06 / 16)
    assert sig.loads["busy"].tokens_per_second == pytest.approx(80 / 16)
    assert sig.loads["busy"].finished_per_second == pytest.approx(4 / 16)
    assert sig.loads["idle"] == PodLoad(0, 0)
    costs = deletion_costs(
        sig.loads, {"idle": "2026-01-01T00:00:00Z", "busy": "2026-01-01T00:05:00Z"}
    )
    assert costs == {"idle": 0, "busy": 1}


def test_a_pod_not_read_once_keeps_its_history_and_its_load() -> None:
    """A failed scrape neither drops a pod's baseline (its next load would come from the
    gauges alone) nor leaves it out of the loads the deletion costs rank: it is the load
    of its last reading, for two windows; after that the pod is forgotten."""
    s = spec(target="3", periodSeconds=2)
    state = ScalerState()
    for t in range(0, 20, 2):
        signal(s, [served("idle", 0, 0), served("busy", 30.0 * t, t / 4)], 2, state, t)
    missed = signal(s, [served("idle", 0, 0)], 2, state, 20)
    assert missed.pods == 1 and missed.value == 0.0  # the signal is the pods read
    assert missed.loads["busy"].tokens_per_second == pytest.approx(30.0)
    assert deletion_costs(missed.loads, {"idle": "", "busy": ""}) == {"idle": 0, "busy": 1}
    # Read again: averaged from the baseline it kept, not the gauges of one reading.
    back = signal(s, [served("idle", 0, 0), served("busy", 30.0 * 22, 22 / 4)], 2, state, 22)
    assert back.loads["busy"].tokens_per_second == pytest.approx(30.0)
    assert back.loads["busy"].finished_per_second == pytest.approx(0.25)
    # Not read for two windows (30 s): forgotten.
    late = signal(s, [served("idle", 0, 0)], 2, state, 52)
    assert "busy" not in late.loads and "busy" not in state.readings
    # A pod whose counters went down restarted: no baseline.
    signal(s, [served("r", 100, 10)], 1, state, 54)
    assert signal(s, [served("r", 5, 1)], 1, state, 56).loads["r"] == PodLoad(0, 0)
