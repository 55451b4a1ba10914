"""Summaries of one load level, computed from the raw instants the client recorded.

Latencies, for each request that got an answer:

- **TTFT**: first content chunk minus the start instant.
- **E2E**: end of the response minus the start instant.
- **TPOT**: (last content chunk - first content chunk) / (completion tokens - 1), with the
  token count from the server's usage; only for requests with at least two tokens.
- **ITL**: every gap between consecutive content chunks, pooled over all requests (a chunk
  may carry several tokens: ITL is per chunk, TPOT per token).

TTFT and E2E are reported twice: from the instant the request was actually **sent**, and
from the instant it was **scheduled**. They differ by the client's schedule lag; a client
that cannot keep up hides queueing in the first and shows it in the second. TPOT and ITL do
not depend on the start instant and are the same in both sets.

A request abandoned at a deadline has no complete latency, only a lower bound (the
deadline). Such **censored** values enter the percentiles at that bound, so a P99 above the
SLO is not hidden by dropping the requests that missed it, and each summary counts them.
Requests that failed otherwise (HTTP errors, refused connections) have no latency and are
counted only as errors.

Percentiles interpolate linearly between order statistics (the default of numpy and of
most tools): for ``n`` sorted values, percentile ``p`` sits at rank ``(n - 1) * p / 100``.

**Client saturation.** The client was the bottleneck when it could not send on schedule:
its P99 schedule lag exceeded a limit (default 5 ms: small against the latencies measured,
large against a client's own overhead, which is well under a millisecond), or, in an open
loop, it sent fewer than 95 % of the scheduled requests per second, or it never sent some.
The verdict comes with the numbers: how far behind the schedule it fell (the largest lag),
and whether due requests waited because every connection of the client's cap was busy. A
busy machine (other processes taking the cores) makes the client late too; the verdict
then says so, rightly: the load offered was not the load scheduled.
Whether a level with such a client still counts toward the SLO is decided apart
(``bench.result.judge``): a client that only lagged, at a level that met the SLO from the
schedule or missed it even from the send, does not decide it.

**Errors.** A request *errored* when it got no answer for a reason other than a deadline
(refused or lost connections, HTTP errors, timeouts, still running when the level ended)
or was never sent. A deadline miss is an SLO failure, not an error. The share of errored
requests is what a run fails on (``maxErrorFraction`` of the spec): a level whose requests
mostly errored measured the failures, not the server.

Everything here is pure: it reads records and returns frozen dataclasses.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from vllm_operator.bench.records import (
    DEADLINE_KINDS,
    E2E_DEADLINE,
    TPOT_DEADLINE,
    TTFT_DEADLINE,
    LevelRecording,
    RequestRecord,
)

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)
DEFAULT_LAG_LIMIT_S = 0.005
SEND_RATE_FLOOR = 0.95


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks of an ascending sequence."""
    if not sorted_values:
        raise ValueError("no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile out of range: {p}")
    rank = (len(sorted_values) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = rank - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


@dataclass(frozen=True, slots=True)
class Summary:
    """Distribution of one quantity, in seconds."""

    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    p999: float
    max: float
    # Values that are lower bounds (requests abandoned at a deadline).
    censored: int = 0

    @classmethod
    def of(cls, values: Iterable[float], censored: int = 0) -> Summary | None:
        ordered = sorted(values)
        if not ordered:
            return None
        p50, p90, p95, p99, p999 = (percentile(ordered, p) for p in PERCENTILES)
        return cls(
            count=len(ordered),
            mean=math.fsum(ordered) / len(ordered),
            p50=p50,
            p90=p90,
            p95=p95,
            p99=p99,
            p999=p999,
            max=ordered[-1],
            censored=censored,
        )


@dataclass(frozen=True, slots=True)
class LatencySummary:
    ttft: Summary | None
    tpot: Summary | None
    itl: Summary | None
    e2e: Summary | None


@dataclass(frozen=True, slots=True)
class Slo:
    """Per-request objectives in seconds; TTFT and E2E count from the scheduled instant."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    @property
    def empty(self) -> bool:
        return self.ttft_s is None and self.tpot_s is None and self.e2e_s is None


@dataclass(frozen=True, slots=True)
class BucketStats:
    """Results for requests whose prompt length is within [min_tokens, max_tokens]."""

    min_tokens: int
    max_tokens: int
    requests: int
    ttft: Summary | None
    e2e: Summary | None


@dataclass(frozen=True, slots=True)
class LevelStats:
    """Everything reported about one load level (durations in seconds)."""

    rate_per_second: float | None
    concurrency: int | None
    process: str
    requests: int
    completed: int
    succeeded: int
    failed: int
    errors_by_kind: dict[str, int]
    duration_s: float
    requests_per_second: float
    output_tokens_per_second: float
    goodput_per_second: float
    slo_attainment: float | None
    from_send: LatencySummary
    from_scheduled: LatencySummary
    schedule_lag: Summary | None
    send_rate_per_second: float | None
    client_cpu_utilization: float | None
    client_saturated: bool
    verdict: str
    buckets: tuple[BucketStats, ...] = field(default_factory=tuple)
    # The share that met the SLO measured from the send, not the schedule (without the
    # client's lag); and whether the client's only fault was that lag (it sent every
    # request, at the scheduled rate, never waiting for a connection).
    slo_attainment_from_send: float | None = None
    client_lag_only: bool = False
    # Scheduled requests never sent; errored requests (see the module docstring: no
    # answer for a reason other than a deadline, or never sent) and their share.
    unsent: int = 0
    errored: int = 0
    error_fraction: float = 0.0
    # Connections the level opened, the most open at once, the cap on them, and the due
    # requests that found every connection of the cap busy (None: not recorded).
    connections_opened: int | None = None
    connections_peak: int | None = None
    max_connections: int | None = None
    requests_at_connection_cap: int | None = None


def tpot(rec: RequestRecord) -> float | None:
    """Time per output token from the usage's token count (None below two tokens)."""
    n = rec.completion_tokens
    if rec.first_token is None or not rec.chunk_times or n is None or n < 2:
        return None
    return (rec.chunk_times[-1] - rec.first_token) / (n - 1)


def itls(rec: RequestRecord) -> list[float]:
    times = rec.chunk_times
    return [b - a for a, b in itertools.pairwise(times)]


def meets_slo(rec: RequestRecord, slo: Slo, *, from_send: bool = False) -> bool:
    """Answered without error and within every objective (TTFT, E2E from scheduled; with
    ``from_send``, from the moment the client sent it: without the client's lag)."""
    if not rec.ok or rec.end is None:
        return False
    start = rec.sent if from_send and rec.sent is not None else rec.scheduled
    if slo.ttft_s is not None and (rec.first_token is None or rec.first_token - start > slo.ttft_s):
        return False
    if slo.e2e_s is not None and rec.end - start > slo.e2e_s:
        return False
    t = tpot(rec)
    return not (slo.tpot_s is not None and t is not None and t > slo.tpot_s)


def _latencies(records: Sequence[RequestRecord], *, from_scheduled: bool) -> LatencySummary:
    ttft: list[float] = []
    e2e: list[float] = []
    ttft_censored = e2e_censored = 0
    for r in records:
        start = r.scheduled if from_scheduled else r.sent
        if start is None or r.end is None:
            continue
        censored = r.error in DEADLINE_KINDS
        if not (r.ok or censored):
            continue
        if r.first_token is not None:
            ttft.append(r.first_token - start)
        elif censored:
            ttft.append(r.end - start)
            ttft_censored += 1
        e2e.append(r.end - start)
        e2e_censored += censored
    tpots = [t for r in records if r.ok and (t := tpot(r)) is not None]
    gaps = [g for r in records if r.ok for g in itls(r)]
    return LatencySummary(
        ttft=Summary.of(ttft, ttft_censored),
        tpot=Summary.of(tpots),
        itl=Summary.of(gaps),
        e2e=Summary.of(e2e, e2e_censored),
    )


def summarize(
    recording: LevelRecording,
    *,
    slo: Slo = Slo(),
    buckets: Sequence[tuple[int, int]] = (),
    lag_limit_s: float = DEFAULT_LAG_LIMIT_S,
) -> LevelStats:
    """Summarise one level. ``buckets`` are inclusive prompt-token ranges."""
    records = recording.records
    load = recording.load
    sent = [r for r in records if r.sent is not None]
    ok = [r for r in records if r.ok]
    good = [r for r in ok if meets_slo(r, slo)]
    errors = Counter(r.error for r in records if r.error is not None)
    # SLO misses of requests that did complete are failures too, by the objective missed.
    for r in ok:
        if not meets_slo(r, slo):
            errors[_missed(r, slo)] += 1
    duration = max(recording.end - recording.start, 1e-9)
    out_tokens = sum(r.completion_tokens or 0 for r in ok)
    lags = [r.sent - r.scheduled for r in sent if r.sent is not None]
    lag = Summary.of(lags)
    send_rate = None
    if load.concurrency is None and len(sent) >= 2:
        times = [r.sent for r in sent if r.sent is not None]
        if max(times) > min(times):
            send_rate = (len(times) - 1) / (max(times) - min(times))
    scheduled_rate = _scheduled_rate(records) if load.concurrency is None else None
    unsent = len(records) - len(sent)
    errored = sum(
        1
        for r in records
        if r.sent is None or (r.error is not None and r.error not in DEADLINE_KINDS)
    )
    saturated, lag_only, verdict = _verdict(
        lag,
        lag_limit_s,
        send_rate,
        scheduled_rate,
        recording.max_in_flight,
        unsent,
        recording.max_connections,
        recording.requests_at_connection_cap or 0,
    )
    cpu = (
        recording.client_cpu_seconds / duration
        if recording.client_cpu_seconds is not None
        else None
    )
    return LevelStats(
        rate_per_second=load.rate_per_second,
        concurrency=load.concurrency,
        process=load.process,
        requests=len(records),
        completed=len(ok),
        succeeded=len(good),
        failed=len(records) - len(good),
        errors_by_kind=dict(sorted(errors.items())),
        duration_s=duration,
        requests_per_second=len(ok) / duration,
        output_tokens_per_second=out_tokens / duration,
        goodput_per_second=len(good) / duration,
        slo_attainment=(len(good) / len(records) if records else None),
        slo_attainment_from_send=(
            sum(1 for r in ok if meets_slo(r, slo, from_send=True)) / len(records)
            if records
            else None
        ),
        client_lag_only=lag_only,
        from_send=_latencies(records, from_scheduled=False),
        from_scheduled=_latencies(records, from_scheduled=True),
        schedule_lag=lag,
        send_rate_per_second=send_rate,
        client_cpu_utilization=cpu,
        client_saturated=saturated,
        verdict=verdict,
        buckets=tuple(_buckets(records, buckets)),
        unsent=unsent,
        errored=errored,
        error_fraction=errored / len(records) if records else 0.0,
        connections_opened=recording.connections_opened,
        connections_peak=recording.connections_peak,
        max_connections=recording.max_connections,
        requests_at_connection_cap=recording.requests_at_connection_cap,
    )


def _scheduled_rate(records: Sequence[RequestRecord]) -> float | None:
    if len(records) < 2:
        return None
    times = [r.scheduled for r in records]
    span = max(times) - min(times)
    return (len(times) - 1) / span if span > 0 else None


def _missed(rec: RequestRecord, slo: Slo) -> str:
    if slo.ttft_s is not None and (
        rec.first_token is None or rec.first_token - rec.scheduled > slo.ttft_s
    ):
        return TTFT_DEADLINE
    if slo.e2e_s is not None and rec.end is not None and rec.end - rec.scheduled > slo.e2e_s:
        return E2E_DEADLINE
    return TPOT_DEADLINE


def _verdict(
    lag: Summary | None,
    limit: float,
    send_rate: float | None,
    scheduled_rate: float | None,
    max_in_flight: int | None,
    unsent: int,
    max_connections: int | None = None,
    at_connection_cap: int = 0,
) -> tuple[bool, bool, str]:
    """(the client was the bottleneck, its schedule lag was its only fault, the verdict)."""
    if lag is None:
        return False, False, "no request was sent" + (f" ({unsent} scheduled)" if unsent else "")
    reasons = []
    lagged = lag.p99 > limit
    if lagged:
        reasons.append(f"schedule lag P99 {lag.p99 * 1e3:.3g} ms > {limit * 1e3:.3g} ms")
    if send_rate is not None and scheduled_rate and send_rate < SEND_RATE_FLOOR * scheduled_rate:
        reasons.append(
            f"sent {send_rate:.4g} req/s of {scheduled_rate:.4g} scheduled "
            f"({send_rate / scheduled_rate:.0%}), up to {_seconds(lag.max)} behind schedule"
        )
    if unsent:
        reasons.append(f"{unsent} scheduled requests never sent")
    if at_connection_cap:
        reasons.append(
            f"{at_connection_cap} due requests waited for one of its {max_connections} "
            "connections (the cap)"
        )
    if reasons:
        cap = f" (in-flight cap {max_in_flight})" if max_in_flight is not None else ""
        return (
            True,
            lagged and len(reasons) == 1,
            (
                "client was the bottleneck"
                + cap
                + ": "
                + "; ".join(reasons)
                + "; latency from the scheduled time includes the client's queueing"
            ),
        )
    return False, False, f"client kept up: schedule lag P99 {lag.p99 * 1e3:.3g} ms"


def _seconds(value: float) -> str:
    return f"{value:.3g} s" if value >= 1 else f"{value * 1e3:.3g} ms"


def _bucket_of(rec: RequestRecord) -> int:
    # The planned length is the workload's intent; a dataset without counts has only the
    # server's (which includes special tokens and any chat template).
    return rec.prompt_tokens_planned or rec.prompt_tokens or 0


def _buckets(
    records: Sequence[RequestRecord], edges: Sequence[tuple[int, int]]
) -> Iterable[BucketStats]:
    for lo, hi in edges:
        members = [r for r in records if lo <= _bucket_of(r) <= hi]
        if not members:
            continue
        lat = _latencies(members, from_scheduled=True)
        yield BucketStats(lo, hi, len(members), lat.ttft, lat.e2e)
