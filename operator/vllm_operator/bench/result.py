"""The result of a benchmark run, and its mapping onto the InferenceBenchmark status.

A run is one or more load levels (one for ``Single``, the listed rates or concurrencies for
``Sweep``, the probes of ``Search``). Each level keeps its raw recording and its summary.
The run adds what only shows across levels: the knee and, for a search, the highest rate
that met the SLO. A chaos phase (``spec.chaos``) adds, per perturbation, a plain level and
a perturbed one at the same load, and a verdict comparing them; those levels are not among
``levels`` (they decide neither the headline, the knee nor the error failure: what breaks
under a perturbation is the finding, not a fault of the run).

:func:`to_status` turns a result into the API's
:class:`~vllm_operator.models.inference_benchmark.InferenceBenchmarkStatus` (latencies in
milliseconds, measured from the scheduled send time where the API has one set). It fills
the measured fields only; phase, conditions and ``observedGeneration`` belong to the
reconcile. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from vllm_operator.bench.records import DEADLINE_KINDS, LevelRecording
from vllm_operator.bench.resources import ResourceStats
from vllm_operator.bench.search import knee
from vllm_operator.bench.stats import LatencySummary, LevelStats, Summary
from vllm_operator.models.inference_benchmark import (
    DEFAULT_TARGET_ATTAINMENT,
    BucketResult,
    ChaosResult,
    InferenceBenchmarkSpec,
    InferenceBenchmarkStatus,
    LatencySet,
    LevelResult,
    Percentiles,
)


@dataclass(frozen=True)
class LevelOutcome:
    recording: LevelRecording
    stats: LevelStats
    # Whether the level met the SLO (attainment at or above the target, client not the
    # bottleneck); True when there is no SLO and the client kept up.
    passed: bool
    # What the server's resources did meanwhile, where the run read them (bench.resources).
    resources: ResourceStats | None = None


@dataclass(frozen=True)
class ChaosOutcome:
    """One perturbation of the chaos phase and the plain run at the same load before it."""

    perturbation: str
    rate_per_second: float
    baseline: LevelOutcome
    perturbed: LevelOutcome
    verdict: str


def chaos_verdict(baseline: LevelStats, perturbed: LevelStats, *, has_slo: bool) -> str:
    """What the perturbation did, in one sentence: P99s (TTFT and E2E, from the scheduled
    send), SLO attainment (the share of requests that succeeded, without an SLO) and
    errors, each plain -> perturbed; the SLO held when attainment fell by at most one
    point."""
    parts = []
    for name in ("ttft", "e2e"):
        a = getattr(baseline.from_scheduled, name)
        b = getattr(perturbed.from_scheduled, name)
        if a is not None and b is not None:
            change = f" ({(b.p99 / a.p99 - 1):+.0%})" if a.p99 > 0 else ""
            parts.append(f"{name.upper()} P99 {a.p99 * 1e3:.4g} -> {b.p99 * 1e3:.4g} ms{change}")
    a_att, b_att = baseline.slo_attainment, perturbed.slo_attainment
    if a_att is not None and b_att is not None:
        label = "SLO attainment" if has_slo else "succeeded"
        parts.append(f"{label} {a_att:.1%} -> {b_att:.1%}")
    parts.append(f"errors {baseline.errored} -> {perturbed.errored}")
    if perturbed.client_saturated:
        parts.append("the client could not keep up under the perturbation")
    if not has_slo or a_att is None or b_att is None:
        tail = "no SLO to hold"
    elif b_att >= a_att - 0.01:
        tail = "the SLO held"
    else:
        tail = "the SLO did not hold"
    return ", ".join(parts) + f": {tail}"


@dataclass(frozen=True)
class BenchmarkResult:
    spec: InferenceBenchmarkSpec
    endpoint: str
    model: str
    levels: tuple[LevelOutcome, ...]
    start_time: datetime
    end_time: datetime
    # How prompts were sized: "local", "server" (its /tokenize) or "words" (approximate).
    tokenizer: str
    # Search: the highest rate that met the SLO (None: none did, or not a search).
    best_rate_per_second: float | None = None
    # Facts about the client machine and versions, for reports.
    client: dict[str, Any] | None = None
    # The chaos phase: one entry per perturbation; or why it did not run.
    chaos: tuple[ChaosOutcome, ...] = ()
    chaos_note: str | None = None

    @property
    def headline(self) -> LevelOutcome | None:
        """The only level, or the highest load that passed."""
        if len(self.levels) == 1:
            return self.levels[0]
        passed = [lv for lv in self.levels if lv.passed]
        if not passed:
            return None
        return max(passed, key=lambda lv: _load_key(lv.stats))

    @property
    def knee(self) -> tuple[float, str] | None:
        """The knee as (load, unit): "req/s" for rate levels, "concurrency" otherwise."""
        return knee_of(tuple(lv.stats for lv in self.levels))

    @property
    def knee_rate_per_second(self) -> float | None:
        """The knee as a request rate: the offered rate there, or for concurrency levels
        the rate achieved at the knee's concurrency."""
        found = self.knee
        if found is None:
            return None
        load, unit = found
        if unit == "req/s":
            return load
        for lv in self.levels:
            if lv.stats.concurrency == load:
                return lv.stats.requests_per_second
        return None


def knee_resource(result: BenchmarkResult) -> tuple[str, float, float] | None:
    """What the server was nearest to running out of at the knee: (resource, saturation,
    the level's load) of the first level at or beyond the knee whose resources were read."""
    found = result.knee
    if found is None:
        return None
    at, _unit = found
    read = sorted(
        (lv for lv in result.levels if lv.resources is not None and lv.resources.nearest),
        key=lambda lv: _load_key(lv.stats),
    )
    for lv in read:
        if _load_key(lv.stats) >= at:
            assert lv.resources is not None and lv.resources.nearest is not None
            name = lv.resources.nearest
            return name, lv.resources.saturation[name], _load_key(lv.stats)
    return None


def _load_key(stats: LevelStats) -> float:
    if stats.rate_per_second is not None:
        return stats.rate_per_second
    if stats.concurrency is not None:
        return float(stats.concurrency)
    return stats.requests_per_second


def knee_metric(stats: LevelStats) -> float | None:
    """P99 latency the knee is found on: TTFT from the scheduled time (queueing shows
    there first), else E2E for non-streaming runs."""
    lat = stats.from_scheduled
    s = lat.ttft or lat.e2e
    return None if s is None else s.p99


def knee_of(levels: tuple[LevelStats, ...]) -> tuple[float, str] | None:
    rated = [(s.rate_per_second, knee_metric(s)) for s in levels if s.rate_per_second]
    points = [(x, y) for x, y in rated if x is not None and y is not None]
    if len(points) >= 3:
        found = knee(points)
        return None if found is None else (found, "req/s")
    conc = [(float(s.concurrency), knee_metric(s)) for s in levels if s.concurrency]
    cpoints = [(x, y) for x, y in conc if y is not None]
    found = knee(cpoints)
    return None if found is None else (found, "concurrency")


def error_failure(result: BenchmarkResult) -> str | None:
    """Why the run failed on its errors, or None: the level whose share of errored
    requests (no answer for a reason other than a deadline, or never sent) is the
    largest, when it is above the spec's ``maxErrorFraction``."""
    limit = result.spec.max_error_fraction
    over = [lv.stats for lv in result.levels if lv.stats.error_fraction > limit]
    if not over:
        return None
    worst = max(over, key=lambda s: s.error_fraction)
    kinds = sorted(
        ((k, n) for k, n in worst.errors_by_kind.items() if k not in DEADLINE_KINDS),
        key=lambda kn: -kn[1],
    )
    parts = [f"{k} {n}" for k, n in kinds[:4]]
    if worst.unsent:
        parts.append(f"{worst.unsent} never sent")
    more = len(over) - 1
    return (
        f"at {_load_label(worst)}, {worst.errored} of {worst.requests} requests "
        f"({worst.error_fraction:.1%}) got no answer or were never sent ({', '.join(parts)}), "
        f"more than maxErrorFraction {limit:g} allows"
        + (f"; {more} more level{'s' if more > 1 else ''} too" if more else "")
    )


def _load_label(stats: LevelStats) -> str:
    if stats.concurrency is not None:
        return f"concurrency {stats.concurrency}"
    if stats.rate_per_second is not None:
        return f"{stats.rate_per_second:g} req/s"
    return stats.process


def judge(stats: LevelStats, target_attainment: float = DEFAULT_TARGET_ATTAINMENT) -> str:
    """How a level counts toward the SLO: ``"met"``, ``"missed"``, or ``"client"`` (the
    load client decided it, so it counts neither way).

    Latencies are measured from the scheduled send, so a client's lag is already inside
    them: a level that met the objective from the schedule met it whatever the client
    did, and one that missed it even from the send (the lag taken out) missed it whatever
    the client did. Only a level where the two disagree is the client's to decide. That
    holds when the lag is the client's only fault; a client that sent fewer requests than
    scheduled, or held them for a connection, offered another load than the one named, and
    its level is the client's."""
    attainment = stats.slo_attainment
    met = attainment is not None and attainment >= target_attainment
    if not stats.client_saturated:
        return "met" if met else "missed"
    if not stats.client_lag_only:
        return "client"
    if met:
        return "met"
    from_send = stats.slo_attainment_from_send
    if from_send is not None and from_send < target_attainment:
        return "missed"
    return "client"


def passed(stats: LevelStats, target_attainment: float = DEFAULT_TARGET_ATTAINMENT) -> bool:
    """A level passes when enough of its requests met the SLO and the load client's lag
    could not have changed that (see :func:`judge`)."""
    return judge(stats, target_attainment) == "met"


# --- status ------------------------------------------------------------------------------


def _ms(value: float) -> float:
    return round(value * 1e3, 3)


def percentiles(summary: Summary | None) -> Percentiles | None:
    if summary is None:
        return None
    return Percentiles(
        p50=_ms(summary.p50),
        p90=_ms(summary.p90),
        p95=_ms(summary.p95),
        p99=_ms(summary.p99),
        p999=_ms(summary.p999),
        max=_ms(summary.max),
    )


def latency_set(latency: LatencySummary) -> LatencySet:
    return LatencySet(
        ttft=percentiles(latency.ttft),
        tpot=percentiles(latency.tpot),
        itl=percentiles(latency.itl),
        e2e=percentiles(latency.e2e),
    )


_SLO_VERDICTS: Final[dict[str, Literal["Met", "Missed", "ClientLimited"]]] = {
    "met": "Met",
    "missed": "Missed",
    "client": "ClientLimited",
}


def level_result(
    stats: LevelStats, target_attainment: float = DEFAULT_TARGET_ATTAINMENT
) -> LevelResult:
    """One level in the API's shape (milliseconds)."""
    lag = stats.schedule_lag
    return LevelResult(
        rate_per_second=stats.rate_per_second,
        concurrency=stats.concurrency,
        requests=stats.requests,
        succeeded=stats.succeeded,
        failed=stats.failed,
        errors_by_kind=dict(stats.errors_by_kind),
        requests_per_second=round(stats.requests_per_second, 4),
        output_tokens_per_second=round(stats.output_tokens_per_second, 3),
        goodput_per_second=round(stats.goodput_per_second, 4),
        slo_attainment=(None if stats.slo_attainment is None else round(stats.slo_attainment, 6)),
        from_send=latency_set(stats.from_send),
        from_scheduled=latency_set(stats.from_scheduled),
        schedule_lag_p99_milliseconds=None if lag is None else _ms(lag.p99),
        schedule_lag_p999_milliseconds=None if lag is None else _ms(lag.p999),
        unsent=stats.unsent,
        errored=stats.errored,
        connections_opened=stats.connections_opened,
        client_saturated=stats.client_saturated,
        slo_verdict=_SLO_VERDICTS[judge(stats, target_attainment)],
        buckets=[
            BucketResult(
                min_prompt_tokens=b.min_tokens,
                max_prompt_tokens=b.max_tokens,
                requests=b.requests,
                ttft_p99_milliseconds=None if b.ttft is None else _ms(b.ttft.p99),
                e2e_p99_milliseconds=None if b.e2e is None else _ms(b.e2e.p99),
            )
            for b in stats.buckets
        ],
    )


def to_status(
    result: BenchmarkResult, *, results_config_map: str | None = None
) -> InferenceBenchmarkStatus:
    """The measured part of the InferenceBenchmark status (no phase or conditions)."""
    headline = result.headline
    target = result.spec.target_attainment()

    def as_level(stats: LevelStats) -> LevelResult:
        return level_result(stats, target)

    return InferenceBenchmarkStatus(
        start_time=result.start_time,
        completion_time=result.end_time,
        levels=[as_level(lv.stats) for lv in result.levels],
        headline=None if headline is None else as_level(headline.stats),
        knee_rate_per_second=(
            None if result.knee_rate_per_second is None else round(result.knee_rate_per_second, 4)
        ),
        results_config_map=results_config_map,
        chaos=[
            ChaosResult(
                perturbation=c.perturbation,
                rate_per_second=c.rate_per_second,
                baseline=as_level(c.baseline.stats),
                perturbed=as_level(c.perturbed.stats),
                verdict=c.verdict,
            )
            for c in result.chaos
        ],
        chaos_note=result.chaos_note,
    )
