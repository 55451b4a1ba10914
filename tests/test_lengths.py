"""A length distribution's numbers (models/lengths.py): its mean, quantiles, draws, and the
log-normal two percentiles describe; the one reader the tuner, the bench and tune share."""

from __future__ import annotations

import random

import pytest

from vllm_operator.models import lengths
from vllm_operator.models.workload import LengthDistribution


def dist(**kw: object) -> LengthDistribution:
    return LengthDistribution.model_validate(kw)


BUCKETS = dist(
    type="Buckets",
    buckets=[{"min": 10, "max": 100, "weight": 3}, {"min": 1000, "max": 8000, "weight": 1}],
)


@pytest.mark.parametrize(
    ("d", "expected"),
    [
        pytest.param(dist(type="Fixed", value=17), 17, id="a fixed length is its own mean"),
        pytest.param(dist(type="Uniform", min=10, max=2000), 1005, id="uniform: the midpoint"),
        pytest.param(BUCKETS, (3 * 55 + 4500) / 4, id="buckets: midpoints by weight"),
        pytest.param(dist(type="Normal", mean=500, stddev=100), 500, id="normal: its mean"),
        pytest.param(
            dist(type="Normal", mean=500, stddev=100, max=300), 300, id="normal: clamped to max"
        ),
        pytest.param(
            dist(type="LogNormal", median=500, sigma=1.0),
            500 * 1.6487212707001282,
            id="log-normal: median times e to the half sigma squared",
        ),
        pytest.param(
            dist(type="LogNormal", median=500, sigma=1.0, max=600), 600, id="log-normal: clamped"
        ),
    ],
)
def test_mean(d: LengthDistribution, expected: float) -> None:
    assert lengths.mean(d) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("d", "q", "expected"),
    [
        pytest.param(dist(type="Fixed", value=17), 0.99, 17, id="fixed at any quantile"),
        pytest.param(dist(type="Uniform", min=1, max=1001), 0.99, 991, id="uniform p99"),
        pytest.param(BUCKETS, 0.5, 70, id="buckets: the median falls in the first"),
        pytest.param(BUCKETS, 0.99, 7720, id="buckets: the p99 in the second"),
        pytest.param(dist(type="Normal", mean=500, stddev=100), 0.5, 500, id="normal median"),
        pytest.param(dist(type="Normal", mean=500, stddev=100), 0.99, 733, id="normal p99"),
        pytest.param(
            dist(type="Normal", mean=500, stddev=100, max=600), 0.99, 600, id="normal p99 clamped"
        ),
        pytest.param(dist(type="LogNormal", median=300, sigma=1.0), 0.5, 300, id="log-normal p50"),
        pytest.param(
            dist(type="LogNormal", median=300, sigma=1.0), 0.99, 3073, id="log-normal p99"
        ),
        pytest.param(dist(type="Normal", mean=5, stddev=100), 0.01, 1, id="never below one token"),
    ],
)
def test_quantile(d: LengthDistribution, q: float, expected: int) -> None:
    assert lengths.quantile(d, q) == expected


@pytest.mark.parametrize(
    ("d", "low", "high"),
    [
        pytest.param(dist(type="Fixed", value=17), 17, 17, id="fixed"),
        pytest.param(dist(type="Uniform", min=10, max=20), 10, 20, id="uniform within bounds"),
        pytest.param(
            dist(type="Normal", mean=500, stddev=1000, min=100, max=700), 100, 700, id="clamped"
        ),
        pytest.param(dist(type="Normal", mean=1, stddev=100), 1, None, id="at least one token"),
        pytest.param(BUCKETS, 10, 8000, id="buckets within their bounds"),
    ],
)
def test_sample_stays_within_bounds(d: LengthDistribution, low: int, high: int | None) -> None:
    xs = lengths.sample(d, 2000, random.Random(0))
    assert len(xs) == 2000 and min(xs) >= low
    assert high is None or max(xs) <= high
    assert xs == lengths.sample(d, 2000, random.Random(0))  # seeded


@pytest.mark.parametrize(
    ("median", "value", "q", "top"),
    [
        pytest.param(500, 2000, 0.99, None, id="p50 and p99"),
        pytest.param(500, 8000, 0.999, 8000, id="p50 and a max taken as p99.9"),
        pytest.param(300, 9000, 0.99, 20000, id="p50 and p99 with a clamp"),
    ],
)
def test_from_percentile_gives_back_its_percentiles(
    median: int, value: int, q: float, top: int | None
) -> None:
    d = lengths.from_percentile(median, value, q, top=top)
    assert (d.type, d.max) == ("LogNormal", top)
    assert lengths.quantile(d, 0.5) == median
    assert lengths.quantile(d, q) == pytest.approx(value, abs=1)


def test_from_percentile_of_equal_values_has_a_tiny_spread() -> None:
    d = lengths.from_percentile(300, 300, 0.99)
    assert d.sigma == 1e-3
