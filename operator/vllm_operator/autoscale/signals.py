"""Histograms of vLLM's ``/metrics`` over time: what the autoscaler makes of one pod's
readings for a service-wide signal (a TTFT percentile).

The reading itself, vLLM's series names and the load a reading implies are
:mod:`vllm_operator.releases.metrics`'s: the benchmark's resource sampler reads the servers
through it too.
"""

from __future__ import annotations

import math
from collections import defaultdict

from vllm_operator.releases.metrics import Buckets


def delta(now: Buckets, before: Buckets | None) -> Buckets | None:
    """Observations between two readings of one pod's histogram. None without a baseline;
    a count that went down means the server restarted, so everything now is new."""
    if before is None:
        return None
    old = dict(before)
    if any(count < old.get(bound, 0.0) for bound, count in now):
        return now
    return tuple((bound, count - old.get(bound, 0.0)) for bound, count in now)


def merge(histograms: list[Buckets]) -> Buckets:
    """Sum histograms with the same bounds (pods of one service run one vLLM version)."""
    total: dict[float, float] = defaultdict(float)
    for hist in histograms:
        for bound, count in hist:
            total[bound] += count
    return tuple(sorted(total.items()))


def quantile(q: float, buckets: Buckets) -> float | None:
    """The q-quantile of a cumulative histogram, linear within the bucket (as PromQL's
    histogram_quantile does). None when it holds no observation. A quantile in the +Inf
    bucket is reported as the highest finite bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower
