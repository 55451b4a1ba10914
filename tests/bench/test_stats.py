"""Level statistics on synthetic timelines, where every expected number is known exactly."""

from __future__ import annotations

import pytest

from vllm_operator.bench import records as kinds
from vllm_operator.bench.records import LevelRecording, Load, RequestRecord
from vllm_operator.bench.stats import Slo, Summary, percentile, summarize


def rec(
    index: int,
    scheduled: float,
    sent: float,
    chunks: list[float],
    *,
    tokens: int | None = None,
    end: float | None = None,
    prompt: int = 100,
    error: str | None = None,
) -> RequestRecord:
    return RequestRecord(
        index=index,
        scheduled=scheduled,
        prompt_tokens_planned=prompt,
        output_tokens_planned=tokens or len(chunks),
        sent=sent,
        first_token=chunks[0] if chunks else None,
        chunk_times=list(chunks),
        end=end if end is not None else (chunks[-1] if chunks else None),
        status=200,
        prompt_tokens=prompt,
        completion_tokens=tokens if tokens is not None else len(chunks),
        error=error,
    )


def level(
    records: list[RequestRecord], *, rate: float | None = 10.0, cap: int | None = None
) -> LevelRecording:
    return LevelRecording(
        load=Load(rate_per_second=rate),
        records=tuple(records),
        start=0.0,
        end=max(r.end or 0.0 for r in records),
        wall_start=0.0,
        client_cpu_seconds=0.5,
        max_in_flight=cap,
    )


def test_percentile_interpolates_between_closest_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 90) == pytest.approx(4.6)
    assert percentile(values, 99.9) == pytest.approx(4.996)
    assert percentile(values, 100) == 5.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_summary_of_one_to_hundred() -> None:
    s = Summary.of(float(i) for i in range(1, 101))
    assert s is not None
    assert (s.count, s.p50, s.p90, s.p99, s.max, s.mean) == (100, 50.5, 90.1, 99.01, 100, 50.5)
    assert Summary.of([]) is None


def test_latency_from_send_and_from_scheduled_differ_by_the_lag() -> None:
    # Three requests, each 2 s late, each with TTFT 0.1 s and E2E 0.4 s from the send.
    records = [
        rec(i, scheduled=float(i), sent=i + 2.0, chunks=[i + 2.1, i + 2.2, i + 2.3, i + 2.4])
        for i in range(3)
    ]
    stats = summarize(level(records, rate=1.0))
    send, sched = stats.from_send, stats.from_scheduled
    assert send.ttft is not None and sched.ttft is not None
    assert send.ttft.p50 == pytest.approx(0.1)
    assert sched.ttft.p50 == pytest.approx(2.1)
    assert send.e2e is not None and sched.e2e is not None
    assert send.e2e.max == pytest.approx(0.4) and sched.e2e.max == pytest.approx(2.4)
    assert stats.schedule_lag is not None and stats.schedule_lag.p99 == pytest.approx(2.0)
    assert stats.client_saturated
    assert "client was the bottleneck" in stats.verdict
    assert "latency from the scheduled time includes" in stats.verdict


def test_tpot_comes_from_usage_tokens_not_from_chunks() -> None:
    # Four chunks over 0.3 s carrying 10 tokens: TPOT is 0.3 / 9, not 0.3 / 3.
    r = rec(0, 0.0, 0.0, [0.1, 0.2, 0.3, 0.4], tokens=10)
    stats = summarize(level([r]))
    assert stats.from_send.tpot is not None
    assert stats.from_send.tpot.p50 == pytest.approx(0.3 / 9)
    assert stats.output_tokens_per_second == pytest.approx(10 / 0.4)


def test_itl_pools_every_gap_of_every_request() -> None:
    a = rec(0, 0.0, 0.0, [0.1, 0.2, 0.4])  # gaps 0.1, 0.2
    b = rec(1, 0.0, 0.0, [0.1, 0.5])  # gap 0.4
    stats = summarize(level([a, b]))
    itl = stats.from_send.itl
    assert itl is not None
    assert itl.count == 3
    assert (itl.p50, itl.max) == (pytest.approx(0.2), pytest.approx(0.4))
    assert stats.from_scheduled.itl == itl  # independent of the start instant


def test_deadline_misses_count_as_failures_and_enter_percentiles_as_lower_bounds() -> None:
    ok = [rec(i, 0.0, 0.0, [0.05, 0.1]) for i in range(8)]
    # Abandoned at the TTFT deadline (0.5 s) without a token.
    missed = rec(8, 0.0, 0.0, [], end=0.5, error=kinds.TTFT_DEADLINE)
    missed.completion_tokens = None
    # An HTTP error has no latency at all.
    broken = rec(9, 0.0, 0.0, [], end=0.01, error=kinds.http_error(503))
    stats = summarize(level([*ok, missed, broken]), slo=Slo(ttft_s=0.5))
    assert stats.errors_by_kind == {"HTTP503": 1, "TTFTDeadlineMissed": 1}
    assert (stats.requests, stats.completed, stats.succeeded, stats.failed) == (10, 8, 8, 2)
    assert stats.slo_attainment == pytest.approx(0.8)
    ttft = stats.from_scheduled.ttft
    assert ttft is not None
    assert ttft.count == 9 and ttft.censored == 1
    assert ttft.max == pytest.approx(0.5)


def test_completed_requests_that_miss_an_objective_are_failures_of_that_kind() -> None:
    fast = rec(0, 0.0, 0.0, [0.1, 0.2])
    slow_first = rec(1, 0.0, 0.0, [0.6, 0.7])
    slow_tokens = rec(2, 0.0, 0.0, [0.1, 0.9])
    stats = summarize(level([fast, slow_first, slow_tokens]), slo=Slo(ttft_s=0.5, tpot_s=0.5))
    assert stats.succeeded == 1
    assert stats.errors_by_kind == {"TPOTDeadlineMissed": 1, "TTFTDeadlineMissed": 1}
    assert stats.goodput_per_second == pytest.approx(1 / 0.9)
    assert stats.requests_per_second == pytest.approx(3 / 0.9)


def test_without_an_slo_every_answered_request_succeeds() -> None:
    stats = summarize(level([rec(i, 0.0, 0.0, [5.0, 9.0]) for i in range(4)]))
    assert stats.slo_attainment == 1.0 and stats.failed == 0


def test_a_client_on_schedule_is_not_saturated() -> None:
    records = [rec(i, i * 0.1, i * 0.1 + 0.0002, [i * 0.1 + 0.05]) for i in range(50)]
    stats = summarize(level(records, rate=10.0))
    assert not stats.client_saturated
    assert stats.verdict.startswith("client kept up")
    assert stats.send_rate_per_second == pytest.approx(10.0)
    assert stats.client_cpu_utilization == pytest.approx(0.5 / (4.9 + 0.05))


def test_a_client_that_sends_too_slowly_is_saturated_even_with_small_lag_quantiles() -> None:
    # Scheduled at 100/s, sent at 50/s: the lag grows to ~0.5 s.
    records = [rec(i, i * 0.01, i * 0.02, [i * 0.02 + 0.001]) for i in range(50)]
    stats = summarize(level(records, rate=100.0))
    assert stats.client_saturated
    assert "sent 50 req/s of 100 scheduled" in stats.verdict


def test_an_in_flight_cap_is_named_in_the_verdict() -> None:
    records = [rec(i, 0.0, i * 1.0, [i * 1.0 + 0.5]) for i in range(5)]
    stats = summarize(level(records, rate=100.0, cap=1))
    assert "in-flight cap 1" in stats.verdict


def test_buckets_break_results_down_by_planned_prompt_length() -> None:
    records = [
        rec(0, 0.0, 0.0, [0.1], prompt=10),
        rec(1, 0.0, 0.0, [0.3], prompt=100),
        rec(2, 0.0, 0.0, [0.2], prompt=200),
    ]
    stats = summarize(level(records), buckets=[(1, 127), (128, 255), (256, 511)])
    assert [(b.min_tokens, b.max_tokens, b.requests) for b in stats.buckets] == [
        (1, 127, 2),
        (128, 255, 1),
    ]
    first = stats.buckets[0].ttft
    assert first is not None and first.max == pytest.approx(0.3)


def test_closed_loop_lag_is_measured_from_the_slot_becoming_free() -> None:
    # Slot freed at end of the previous request; sent 1 ms later.
    records = [rec(0, 0.0, 0.001, [0.2]), rec(1, 0.2, 0.201, [0.4])]
    recording = LevelRecording(
        load=Load(concurrency=1, process="ClosedLoop"),
        records=tuple(records),
        start=0.0,
        end=0.4,
        wall_start=0.0,
    )
    stats = summarize(recording)
    assert stats.concurrency == 1 and stats.send_rate_per_second is None
    assert stats.schedule_lag is not None and stats.schedule_lag.max == pytest.approx(0.001)
    assert not stats.client_saturated
