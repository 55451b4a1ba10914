"""Arrival processes: bounded, seeded, and with the statistics their names promise."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_operator.bench import arrivals


def gaps(offsets: tuple[float, ...]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(offsets)]


def cv(values: list[float]) -> float:
    return statistics.pstdev(values) / statistics.fmean(values)


def test_constant_sends_every_inverse_rate_without_drift() -> None:
    s = arrivals.constant(7.0, count=100_000)
    assert len(s.offsets) == 100_000
    assert s.offsets[0] == 0
    # i / rate, not a running sum: the last offset is exact.
    assert s.offsets[-1] == 99_999 / 7.0


def test_constant_bounded_by_duration_sends_rate_times_duration() -> None:
    assert len(arrivals.constant(10.0, duration=3.0).offsets) == 30
    assert len(arrivals.constant(10.0, count=5, duration=3.0).offsets) == 5


def test_poisson_gaps_are_exponential_with_the_rate() -> None:
    s = arrivals.poisson(50.0, random.Random(1), count=20_000)
    g = gaps(s.offsets)
    assert statistics.fmean(g) == pytest.approx(1 / 50, rel=0.03)
    assert cv(g) == pytest.approx(1.0, rel=0.05)  # exponential: CV 1


@pytest.mark.parametrize("shape", [0.25, 1.0, 4.0])
def test_gamma_burstiness_sets_the_coefficient_of_variation(shape: float) -> None:
    s = arrivals.gamma(20.0, shape, random.Random(2), count=20_000)
    g = gaps(s.offsets)
    assert statistics.fmean(g) == pytest.approx(1 / 20, rel=0.05)
    assert cv(g) == pytest.approx(1 / math.sqrt(shape), rel=0.07)


def test_pulse_puts_the_fraction_of_each_periods_requests_in_its_window() -> None:
    # docs/field-notes.md's example (9): 40 % of each minute's requests in its first 10 s.
    s = arrivals.pulse(10.0, 0.4, 10.0, 60.0, random.Random(3), duration=1800.0)
    in_window = sum(1 for t in s.offsets if t % 60.0 < 10.0)
    assert len(s.offsets) == pytest.approx(10.0 * 1800, rel=0.03)
    assert in_window / len(s.offsets) == pytest.approx(0.4, abs=0.02)
    assert max(s.offsets) < 1800.0


def test_the_same_seed_gives_the_same_schedule_and_another_seed_does_not() -> None:
    a = arrivals.poisson(5.0, random.Random(42), count=100)
    b = arrivals.poisson(5.0, random.Random(42), count=100)
    c = arrivals.poisson(5.0, random.Random(43), count=100)
    assert a == b
    assert a != c


def test_replay_sorts_shifts_and_scales_a_trace() -> None:
    s = arrivals.replay([105.0, 100.0, 101.0, 103.0], speedup=2.0)
    assert s.offsets == (0.0, 0.5, 1.5, 2.5)
    assert arrivals.replay([0.0, 1.0, 2.0, 3.0], duration=2.0).offsets == (0.0, 1.0)
    assert arrivals.replay([0.0, 1.0, 2.0, 3.0], count=1).offsets == (0.0,)


def test_offered_rate_of_a_schedule() -> None:
    assert arrivals.offered_rate(arrivals.constant(4.0, count=9)) == pytest.approx(4.0)
    assert arrivals.offered_rate(arrivals.OpenLoop((0.0,))) is None


@pytest.mark.parametrize(
    "call",
    [
        lambda: arrivals.constant(0.0, count=1),
        lambda: arrivals.constant(float("inf"), count=1),
        lambda: arrivals.poisson(1.0, random.Random(0)),
        lambda: arrivals.gamma(1.0, 0.0, random.Random(0), count=1),
        lambda: arrivals.pulse(1.0, 1.0, 1.0, 2.0, random.Random(0), count=1),
        lambda: arrivals.pulse(1.0, 0.5, 2.0, 2.0, random.Random(0), count=1),
    ],
    ids=[
        "a zero rate is refused",
        "an infinite rate is refused",
        "an unbounded schedule is refused",
        "a zero burstiness is refused",
        "a pulse fraction of 1 is refused",
        "a pulse window as long as the period is refused",
    ],
)
def test_invalid_processes_are_refused(call: object) -> None:
    with pytest.raises(ValueError, match=r"rate|bound|burstiness|fraction"):
        call()  # type: ignore[operator]


@settings(max_examples=60, deadline=None)
@given(
    process=st.sampled_from(["constant", "poisson", "gamma", "pulse"]),
    rate=st.floats(0.5, 200.0),
    count=st.integers(1, 300),
    duration=st.floats(0.5, 20.0),
    seed=st.integers(0, 2**31),
)
def test_every_schedule_is_sorted_starts_at_zero_or_later_and_respects_its_bounds(
    process: str, rate: float, count: int, duration: float, seed: int
) -> None:
    rng = random.Random(seed)
    match process:
        case "constant":
            s = arrivals.constant(rate, count=count, duration=duration)
        case "poisson":
            s = arrivals.poisson(rate, rng, count=count, duration=duration)
        case "gamma":
            s = arrivals.gamma(rate, 0.5, rng, count=count, duration=duration)
        case _:
            s = arrivals.pulse(rate, 0.4, 0.2, 1.0, rng, count=count, duration=duration)
    assert len(s.offsets) <= count
    assert all(0 <= t < duration for t in s.offsets)
    assert list(s.offsets) == sorted(s.offsets)
