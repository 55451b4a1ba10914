"""The knee and the rate search, on synthetic latency curves and pass/fail thresholds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_operator.bench.search import RateSearch, knee


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        # Linear, slope 1, until 40; slope 10 after.
        ([(10, 110), (20, 120), (30, 130), (40, 140), (50, 240), (60, 340)], 40),
        # Flat, then climbing.
        ([(1, 100), (2, 101), (3, 99), (4, 100), (5, 160), (6, 400)], 4),
        # The slope only doubles: no knee.
        ([(1, 100), (2, 110), (3, 120), (4, 140), (5, 160)], None),
        # Noise on a flat curve: rises of less than 10 % are not a knee.
        ([(1, 100), (2, 100), (3, 105), (4, 100), (5, 104)], None),
        # Too few points.
        ([(1, 100), (2, 500)], None),
        # Steep from the first segment: no earlier slope to compare with.
        ([(1, 100), (2, 200), (3, 300), (4, 400)], None),
        # Unsorted input, a repeated load (the last measurement wins).
        ([(30, 130), (10, 110), (50, 240), (20, 120), (40, 999), (40, 140), (60, 340)], 40),
    ],
    ids=[
        "slope rising tenfold marks the knee at the last linear point",
        "a flat curve that starts climbing has its knee where the climb starts",
        "a slope that only doubles has no knee",
        "noise on a flat curve is no knee",
        "two points have no knee",
        "a curve steep from the start has no knee",
        "points are sorted and a repeated load keeps its last value",
    ],
)
def test_knee(points: list[tuple[float, float]], expected: float | None) -> None:
    assert knee(points) == expected


def run_search(search: RateSearch, threshold: float) -> list[float]:
    rates = []
    while (rate := search.next_rate()) is not None:
        rates.append(rate)
        search.record(rate, rate <= threshold)
    return rates


def test_search_doubles_then_bisects() -> None:
    s = RateSearch(1.0, 100.0, max_probes=20, precision=0.05)
    rates = run_search(s, threshold=13.0)
    assert rates[:5] == [1, 2, 4, 8, 16]
    assert rates[5:] == [12, 14, 13, 13.5]
    assert s.best == 13.0


def test_search_stops_when_the_lowest_rate_fails() -> None:
    s = RateSearch(5.0, 100.0)
    assert run_search(s, threshold=1.0) == [5.0]
    assert s.best is None


def test_search_stops_at_the_highest_rate_when_it_passes() -> None:
    s = RateSearch(10.0, 50.0)
    assert run_search(s, threshold=1000.0) == [10, 20, 40, 50]
    assert s.best == 50


def test_a_failure_below_a_pass_wins() -> None:
    s = RateSearch(1.0, 100.0, max_probes=3)
    s.record(1.0, True)
    s.record(8.0, True)
    s.record(4.0, False)  # noisy: failed below a rate that passed
    assert s.best == 1.0


@settings(max_examples=200, deadline=None)
@given(
    low=st.floats(0.1, 10.0),
    span=st.floats(2.0, 1000.0),
    where=st.floats(0.0, 1.0),
)
def test_search_brackets_any_threshold_within_precision_or_uses_every_probe(
    low: float, span: float, where: float
) -> None:
    high = low * span
    threshold = low * span**where
    s = RateSearch(low, high, max_probes=30, precision=0.05)
    rates = run_search(s, threshold)
    assert len(rates) <= 30
    best = s.best
    assert best is not None and best <= threshold
    fail = s.lowest_failure
    if fail is None:
        assert best == high
    else:
        assert fail > threshold
        assert fail / best - 1 <= 0.05
    # Few probes: doubling up to the bracket, then about log2(1 / precision) halvings.
    assert len(rates) <= math.ceil(math.log2(span)) + 1 + 6


def test_search_refuses_an_empty_range() -> None:
    with pytest.raises(ValueError, match="low < high"):
        RateSearch(5.0, 5.0)
