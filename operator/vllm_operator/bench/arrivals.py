"""Arrival processes: when each request of an open-loop load level is due, as absolute
offsets in seconds from the level's start.

Uniform arrivals understate latency: real traffic comes in bursts (40 % of a minute's
requests in its first 10 s, docs/field-notes.md, 9). The processes:

- **Constant**: every ``1/rate`` seconds.
- **Poisson**: exponential gaps with mean ``1/rate`` (independent users).
- **Gamma**: gamma-distributed gaps with shape ``k`` (the burstiness) and mean ``1/rate``;
  the gaps' coefficient of variation is ``1/sqrt(k)``: ``k = 1`` is Poisson, ``k < 1``
  burstier, ``k > 1`` more regular.
- **Pulse**: Poisson with a rate that is piecewise constant over each period, so that a
  ``fraction`` of each period's expected requests falls in its first ``window`` seconds
  and the rest spread over the remainder; the mean rate stays ``rate``.
- **Trace**: the offsets of a recorded trace, replayed as they are.
- **ClosedLoop** has no offsets: each of ``concurrency`` workers sends its next request as
  soon as its last one ends (:class:`ClosedLoop`).

The schedule is computed before the level starts, from a seeded ``random.Random``, so a
run is reproducible and the client only has to send at given instants. Sending at
absolute instants (not sleeping for relative gaps) keeps lateness from accumulating: one
late send does not delay every later one.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# A schedule that would never end (no count, no duration) is a programming error; this
# bounds every generator even then.
MAX_REQUESTS = 10_000_000


@dataclass(frozen=True, slots=True)
class OpenLoop:
    """Requests sent at these offsets (seconds from the level's start), whatever the
    server does."""

    offsets: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """``concurrency`` requests in flight: each ends, then the next is sent.

    The level ends after ``count`` requests, or once ``duration`` seconds have passed (no
    request is sent after that), whichever comes first.
    """

    concurrency: int
    count: int | None = None
    duration: float | None = None


Schedule = OpenLoop | ClosedLoop


def _bounded(
    gaps: Callable[[], float], count: int | None, duration: float | None, first: float = 0.0
) -> list[float]:
    if count is None and duration is None:
        raise ValueError("bound the schedule by a count or a duration")
    limit = MAX_REQUESTS if count is None else min(count, MAX_REQUESTS)
    offsets: list[float] = []
    t = first
    while len(offsets) < limit:
        if duration is not None and t >= duration:
            break
        offsets.append(t)
        t += gaps()
    return offsets


def constant(rate: float, *, count: int | None = None, duration: float | None = None) -> OpenLoop:
    """One request every ``1/rate`` seconds, the first at 0."""
    _check_rate(rate)
    limit = MAX_REQUESTS if count is None else min(count, MAX_REQUESTS)
    if duration is not None:
        limit = min(limit, math.ceil(duration * rate - 1e-9))
    elif count is None:
        raise ValueError("bound the schedule by a count or a duration")
    # i / rate, not a running sum: no floating-point drift over long runs.
    return OpenLoop(tuple(i / rate for i in range(max(0, limit))))


def poisson(
    rate: float, rng: random.Random, *, count: int | None = None, duration: float | None = None
) -> OpenLoop:
    """Exponential gaps of mean ``1/rate``; the first request at 0."""
    _check_rate(rate)
    return OpenLoop(tuple(_bounded(lambda: rng.expovariate(rate), count, duration)))


def gamma(
    rate: float,
    burstiness: float,
    rng: random.Random,
    *,
    count: int | None = None,
    duration: float | None = None,
) -> OpenLoop:
    """Gamma gaps with shape ``burstiness`` and mean ``1/rate``; the first request at 0."""
    _check_rate(rate)
    if not burstiness > 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    scale = 1.0 / (rate * burstiness)
    return OpenLoop(tuple(_bounded(lambda: rng.gammavariate(burstiness, scale), count, duration)))


def pulse(
    rate: float,
    fraction: float,
    window: float,
    period: float,
    rng: random.Random,
    *,
    count: int | None = None,
    duration: float | None = None,
) -> OpenLoop:
    """Poisson arrivals, ``fraction`` of each period's requests in its first ``window`` s.

    Within the window the rate is ``rate * period * fraction / window``, in the rest of the
    period ``rate * period * (1 - fraction) / (period - window)``. A Poisson process is
    memoryless, so restarting the exponential gaps at each rate change is exact.
    """
    _check_rate(rate)
    if not 0 < fraction < 1 or not 0 < window < period:
        raise ValueError("need 0 < fraction < 1 and 0 < window < period")
    if count is None and duration is None:
        raise ValueError("bound the schedule by a count or a duration")
    burst = rate * period * fraction / window
    calm = rate * period * (1 - fraction) / (period - window)
    limit = MAX_REQUESTS if count is None else min(count, MAX_REQUESTS)
    offsets: list[float] = []
    start = 0.0
    while len(offsets) < limit and (duration is None or start < duration):
        for lo, hi, lam in ((start, start + window, burst), (start + window, start + period, calm)):
            t = lo + rng.expovariate(lam)
            while t < hi and len(offsets) < limit:
                if duration is not None and t >= duration:
                    return OpenLoop(tuple(offsets))
                offsets.append(t)
                t += rng.expovariate(lam)
        start += period
    return OpenLoop(tuple(offsets))


def replay(
    offsets: Sequence[float],
    *,
    count: int | None = None,
    duration: float | None = None,
    speedup: float = 1.0,
) -> OpenLoop:
    """A trace's offsets (sorted, shifted to start at 0), optionally played ``speedup``
    times faster, cut at ``count`` requests or ``duration`` seconds."""
    if not speedup > 0:
        raise ValueError("speedup must be positive")
    ordered = sorted(offsets)
    if not ordered:
        return OpenLoop(())
    origin = ordered[0]
    out: list[float] = []
    for t in ordered:
        rel = (t - origin) / speedup
        if (count is not None and len(out) >= count) or (duration is not None and rel >= duration):
            break
        out.append(rel)
    return OpenLoop(tuple(out))


def _check_rate(rate: float) -> None:
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be positive and finite, got {rate}")


def offered_rate(schedule: OpenLoop) -> float | None:
    """Mean rate of a schedule: requests per second over its span (None for < 2 requests)."""
    offsets = schedule.offsets
    if len(offsets) < 2 or offsets[-1] <= offsets[0]:
        return None
    return (len(offsets) - 1) / (offsets[-1] - offsets[0])
