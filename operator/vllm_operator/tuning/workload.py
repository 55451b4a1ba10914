"""What a declared workload implies for sizing: typical and longest request lengths.

A service declares its prompt and output lengths as distributions (the same types a
benchmark draws from). The tuner needs two numbers from each:

- the **mean**, to size how many sequences the KV cache holds at once;
- the **longest** length a request will have, to size ``--max-model-len``. vLLM rejects a
  request longer than that outright, so this is the distribution's maximum where it has
  one (Fixed, Uniform, Buckets, or a clamp ``max``) and its 99.9th percentile where it has
  none (Normal and LogNormal without a clamp): one request in a thousand is then refused
  rather than the context sized for a tail that almost never comes.

The numbers themselves (mean, quantiles) are :mod:`vllm_operator.models.lengths`'s, the one
reader of a length distribution.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Final

from vllm_operator.models import lengths
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


def length_stats(dist: LengthDistribution) -> LengthStats:
    """Mean and longest length of a declared distribution (see the module docstring)."""
    average = lengths.mean(dist)
    if dist.type in ("Fixed", "Uniform", "Buckets") or dist.max is not None:
        return LengthStats(average, _maximum(dist), True)
    tail = lengths.unclamped_quantile(dist, TAIL_QUANTILE)
    return LengthStats(average, max(1, math.ceil(tail)), False)


def _maximum(dist: LengthDistribution) -> int:
    """The hard maximum of a bounded distribution."""
    if dist.type == "Fixed":
        assert dist.value is not None
        return dist.value
    if dist.type == "Buckets":
        assert dist.buckets
        return max(b.max for b in dist.buckets)
    assert dist.max is not None
    return dist.max
