"""Finding the load a service can carry: the highest rate that meets the SLO, and the knee.

**Search.** Each probe is a whole load level, so probes are expensive; the search needs
few. It starts at the lowest rate and doubles while the SLO holds (exponential phase);
once a rate fails, the answer lies between the best passing rate and the lowest failing
one, and it bisects that bracket until it is narrower than ``precision`` (relative) or the
probes run out. From a bracket ``[r, 2r]`` reaching 5 % takes five more probes. A failure
at the lowest rate ends the search (nothing meets the SLO); a pass at the highest rate
ends it too (the service meets the SLO over the whole range).

**Knee.** Latency grows roughly linearly with load until the server starts queueing; then
P99 climbs much faster. With probes sorted by load, ``(x0, y0) ... (xn, yn)``, the knee is
the load ``xk`` of the first point (``k >= 1``) where the next segment's slope is at least
``factor`` (3) times the mean slope so far, ``(yk - y0) / (xk - x0)`` (taken as 0 when the
latency has been flat or falling), and the next segment rises by at least ``min_rise``
(10 %) of ``yk``, so that noise on a flat curve is not a knee. No knee is reported for
fewer than three points, or when the first segment is already the steep one.

Both are pure: the search is a state machine fed with results; the caller runs the probes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

KNEE_FACTOR = 3.0
KNEE_MIN_RISE = 0.10


def knee(
    points: Sequence[tuple[float, float]],
    *,
    factor: float = KNEE_FACTOR,
    min_rise: float = KNEE_MIN_RISE,
) -> float | None:
    """The load at which latency starts to climb ``factor`` times faster; see the module."""
    # One point per load: a repeated load keeps its last measurement.
    dedup: dict[float, float] = {}
    for x, y in points:
        if math.isfinite(x) and math.isfinite(y):
            dedup[x] = y
    pts = sorted(dedup.items())
    if len(pts) < 3:
        return None
    x0, y0 = pts[0]
    for k in range(1, len(pts) - 1):
        xk, yk = pts[k]
        xn, yn = pts[k + 1]
        earlier = max(0.0, (yk - y0) / (xk - x0))
        slope = (yn - yk) / (xn - xk)
        if slope > 0 and slope >= factor * earlier and yn - yk >= min_rise * abs(yk):
            return xk
    return None


@dataclass
class RateSearch:
    """Exponential-then-bisection search for the highest rate that passes; see the module.

    Use: ``while (rate := s.next_rate()) is not None: s.record(rate, run(rate))``.
    """

    low: float
    high: float
    max_probes: int = 8
    precision: float = 0.05
    growth: float = 2.0
    probes: list[tuple[float, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high:
            raise ValueError("need 0 < low < high")
        if self.max_probes < 1 or self.growth <= 1 or self.precision <= 0:
            raise ValueError("need max_probes >= 1, growth > 1, precision > 0")

    @property
    def best(self) -> float | None:
        """The highest rate that passed below every failing rate (None if none did).

        Probes are noisy: when a rate fails after a higher one passed, the failure wins.
        """
        fail = self.lowest_failure
        passed = [r for r, ok in self.probes if ok and (fail is None or r < fail)]
        return max(passed) if passed else None

    @property
    def lowest_failure(self) -> float | None:
        failed = [r for r, ok in self.probes if not ok]
        return min(failed) if failed else None

    def record(self, rate: float, passed: bool) -> None:
        self.probes.append((rate, passed))

    def next_rate(self) -> float | None:
        """The next rate to probe, or None when the search is over."""
        if len(self.probes) >= self.max_probes:
            return None
        if not self.probes:
            return self.low
        best, fail = self.best, self.lowest_failure
        if best is None:
            return None  # the lowest rate failed
        if fail is None:
            if best >= self.high:
                return None
            return min(self.high, best * self.growth)
        if fail / best - 1 <= self.precision:
            return None
        return (best + fail) / 2
