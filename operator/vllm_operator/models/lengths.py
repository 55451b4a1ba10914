"""What a declared length distribution (:class:`~vllm_operator.models.workload.LengthDistribution`)
means in numbers: its mean, its quantiles, draws from it, and the log-normal that two of
its percentiles describe. One home for the three readers that each had their own: the
tuner (the mean sizes the KV cache's sequences, a tail quantile the context, the p99
prompt the batch budget), the benchmark (draws a request's lengths) and ``vllm-operator
tune`` (a distribution from the p50 and p99 it is given).

Normal and LogNormal are clamped by ``min`` and ``max`` where set. Quantiles of those two
use the standard library's :class:`statistics.NormalDist` (inverse CDF) rather than a
hand-written approximation; those of Buckets are found by bisection of the piecewise-linear
CDF. Pure: randomness comes from a seeded ``random.Random`` passed in.
"""

from __future__ import annotations

import math
import random
from statistics import NormalDist

from vllm_operator.models.workload import LengthDistribution

__all__ = ["from_percentile", "mean", "quantile", "sample", "unclamped_quantile", "z_score"]

# Requests never ask for fewer tokens than this.
MIN_TOKENS = 1


def z_score(q: float) -> float:
    """The standard normal's ``q`` quantile."""
    return NormalDist().inv_cdf(q)


def _clamp(value: float, low: int | None, high: int | None) -> float:
    if low is not None:
        value = max(value, low)
    if high is not None:
        value = min(value, high)
    return value


def mean(dist: LengthDistribution) -> float:
    """The mean length (a Normal's or LogNormal's clamped to its ``[min, max]``)."""
    if dist.type == "Fixed":
        assert dist.value is not None
        return dist.value
    if dist.type == "Uniform":
        assert dist.min is not None and dist.max is not None
        return (dist.min + dist.max) / 2
    if dist.type == "Buckets":
        assert dist.buckets
        total = sum(b.weight for b in dist.buckets)
        return sum(b.weight * (b.min + b.max) / 2 for b in dist.buckets) / total
    if dist.type == "Normal":
        assert dist.mean is not None and dist.stddev is not None
        return _clamp(dist.mean, dist.min, dist.max)
    assert dist.type == "LogNormal" and dist.median is not None and dist.sigma is not None
    return _clamp(dist.median * math.exp(dist.sigma**2 / 2), dist.min, dist.max)


def unclamped_quantile(dist: LengthDistribution, q: float) -> float:
    """The ``q`` quantile of a Normal or LogNormal, before any clamp or rounding."""
    z = z_score(q)
    if dist.type == "Normal":
        assert dist.mean is not None and dist.stddev is not None
        return dist.mean + z * dist.stddev
    assert dist.type == "LogNormal" and dist.median is not None and dist.sigma is not None
    return dist.median * math.exp(z * dist.sigma)


def _buckets_quantile(dist: LengthDistribution, q: float) -> int:
    assert dist.buckets
    total = sum(b.weight for b in dist.buckets)

    def cdf(x: float) -> float:
        share = 0.0
        for b in dist.buckets or ():
            width = b.max - b.min
            inside = 1.0 if x >= b.max else 0.0 if x < b.min or width == 0 else (x - b.min) / width
            share += b.weight * inside
        return share / total

    low, high = float(min(b.min for b in dist.buckets)), float(max(b.max for b in dist.buckets))
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < q else (low, mid)
    return math.ceil(high)


def quantile(dist: LengthDistribution, q: float) -> int:
    """The ``q`` quantile, in whole tokens (rounded up, clamped, at least 1)."""
    if dist.type == "Fixed":
        assert dist.value is not None
        return dist.value
    if dist.type == "Uniform":
        assert dist.min is not None and dist.max is not None
        return math.ceil(dist.min + q * (dist.max - dist.min))
    if dist.type == "Buckets":
        return _buckets_quantile(dist, q)
    value = unclamped_quantile(dist, q)
    if dist.max is not None:
        value = min(value, dist.max)
    if dist.min is not None:
        value = max(value, dist.min)
    return max(1, math.ceil(value))


def sample(dist: LengthDistribution, n: int, rng: random.Random) -> list[int]:
    """``n`` token counts drawn from ``dist``, each at least 1.

    Normal and LogNormal are clamped to ``[min, max]`` when those are set (and always to at
    least 1); Buckets picks a bucket by weight, then a length uniformly within it.
    """
    lo = max(MIN_TOKENS, dist.min or MIN_TOKENS)
    hi = dist.max

    def clamp(x: float) -> int:
        value = max(lo, round(x))
        return value if hi is None else min(hi, value)

    match dist.type:
        case "Fixed":
            assert dist.value is not None
            return [dist.value] * n
        case "Uniform":
            assert dist.min is not None and dist.max is not None
            return [rng.randint(dist.min, dist.max) for _ in range(n)]
        case "Normal":
            assert dist.mean is not None and dist.stddev is not None
            return [clamp(rng.gauss(dist.mean, dist.stddev)) for _ in range(n)]
        case "LogNormal":
            assert dist.median is not None and dist.sigma is not None
            mu = math.log(dist.median)
            return [clamp(rng.lognormvariate(mu, dist.sigma)) for _ in range(n)]
        case "Buckets":
            assert dist.buckets
            buckets = dist.buckets
            weights = [b.weight for b in buckets]
            lengths = []
            for _ in range(n):
                # One bucket then one length per request, so that a longer draw starts
                # with the same lengths as a shorter one.
                b = buckets[rng.choices(range(len(buckets)), weights=weights)[0]]
                lengths.append(rng.randint(b.min, b.max))
            return lengths
    raise ValueError(f"unknown distribution type {dist.type}")


def from_percentile(
    median: int, value: int, q: float, *, top: int | None = None
) -> LengthDistribution:
    """The LogNormal whose median is ``median`` and whose ``q`` quantile is ``value``
    (clamped at ``top`` where given); a near-zero spread when they are equal."""
    sigma = max(1e-3, math.log(value / median) / z_score(q))
    return LengthDistribution(type="LogNormal", median=median, sigma=sigma, max=top)
