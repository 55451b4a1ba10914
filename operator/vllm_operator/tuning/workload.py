"""What a declared workload implies for sizing: typical and longest request lengths.

A service declares its prompt and output lengths as distributions (the same types a
benchmark draws from). The tuner needs two numbers from each:

- the **mean**, to size how many sequences the KV cache holds at once;
- the **longest** length a request will have, to size ``--max-model-len``. vLLM rejects a
  request longer than that outright, so this is the distribution's maximum where it has
  one (Fixed, Uniform, Buckets, or a clamp ``max``) and its 99.9th percentile where it has
  none (Normal and LogNormal without a clamp): one request in a thousand is then refused
  rather than the context sized for a tail that almost never comes.

Quantiles use the standard library's :class:`statistics.NormalDist` (inverse CDF) rather
than a hand-written approximation.
"""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist
from typing import Final

from vllm_operator.models.workload import LengthDistribution

__all__ = ["TAIL_QUANTILE", "LengthStats", "length_stats"]

TAIL_QUANTILE: Final = 0.999


@dataclasses.dataclass(frozen=True)
class LengthStats:
    """Mean and longest length of one distribution, and how the longest was found."""

    mean: float
    longest: int
    bounded: bool  # longest is a hard maximum, not a percentile

    def describe_longest(self) -> str:
        return f"max {self.longest:,}" if self.bounded else f"p99.9 {self.longest:,}"


def _clamp(value: float, low: int | None, high: int | None) -> float:
    if low is not None:
        value = max(value, low)
    if high is not None:
        value = min(value, high)
    return value


def length_stats(dist: LengthDistribution) -> LengthStats:
    """Mean and longest length of a declared distribution (see the module docstring)."""
    z = NormalDist().inv_cdf(TAIL_QUANTILE)
    if dist.type == "Fixed":
        assert dist.value is not None
        return LengthStats(dist.value, dist.value, True)
    if dist.type == "Uniform":
        assert dist.min is not None and dist.max is not None
        return LengthStats((dist.min + dist.max) / 2, dist.max, True)
    if dist.type == "Buckets":
        assert dist.buckets
        total = sum(b.weight for b in dist.buckets)
        mean = sum(b.weight * (b.min + b.max) / 2 for b in dist.buckets) / total
        return LengthStats(mean, max(b.max for b in dist.buckets), True)
    if dist.type == "Normal":
        assert dist.mean is not None and dist.stddev is not None
        mean = _clamp(dist.mean, dist.min, dist.max)
        if dist.max is not None:
            return LengthStats(mean, dist.max, True)
        return LengthStats(mean, max(1, math.ceil(dist.mean + z * dist.stddev)), False)
    assert dist.type == "LogNormal" and dist.median is not None and dist.sigma is not None
    mean = _clamp(dist.median * math.exp(dist.sigma**2 / 2), dist.min, dist.max)
    if dist.max is not None:
        return LengthStats(mean, dist.max, True)
    return LengthStats(mean, max(1, math.ceil(dist.median * math.exp(z * dist.sigma))), False)
