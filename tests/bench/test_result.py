"""A run's result in the InferenceBenchmark status: milliseconds, headline, knee."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from vllm_operator.bench.records import LevelRecording, Load, RequestRecord
from vllm_operator.bench.result import BenchmarkResult, LevelOutcome, level_result, to_status
from vllm_operator.bench.stats import Slo, summarize
from vllm_operator.models.inference_benchmark import InferenceBenchmarkSpec

SPEC = InferenceBenchmarkSpec.model_validate(
    {
        "targetRef": {"name": "svc"},
        "workload": {
            "promptTokens": {"type": "Fixed", "value": 100},
            "outputTokens": {"type": "Fixed", "value": 3},
        },
        "arrival": {"process": "Poisson", "ratePerSecond": 1},
        "requests": 4,
    }
)


def outcome(load: Load, ttft: float, *, slo: Slo = Slo()) -> LevelOutcome:  # noqa: B008
    records = tuple(
        RequestRecord(
            index=i,
            scheduled=float(i),
            prompt_tokens_planned=100,
            output_tokens_planned=3,
            sent=float(i) + 0.001,
            first_token=float(i) + ttft,
            chunk_times=[float(i) + ttft, float(i) + ttft + 0.01, float(i) + ttft + 0.02],
            end=float(i) + ttft + 0.02,
            status=200,
            prompt_tokens=101,
            completion_tokens=3,
        )
        for i in range(4)
    )
    recording = LevelRecording(load, records, 0.0, 3 + ttft + 0.02, 0.0)
    stats = summarize(recording, slo=slo, buckets=[(1, 127)])
    return LevelOutcome(recording, stats, passed=stats.slo_attainment == 1.0)


def result(*levels: LevelOutcome) -> BenchmarkResult:
    t = datetime(2026, 11, 29, tzinfo=UTC)
    return BenchmarkResult(SPEC, "http://x", "m", tuple(levels), t, t, "server")


def test_level_result_is_in_milliseconds() -> None:
    lr = level_result(outcome(Load(2.0), 0.25).stats)
    assert lr.rate_per_second == 2.0 and lr.requests == 4 and lr.succeeded == 4
    assert lr.from_scheduled is not None and lr.from_scheduled.ttft is not None
    assert lr.from_scheduled.ttft.p50 == pytest.approx(250.0)
    assert lr.from_send is not None and lr.from_send.ttft is not None
    assert lr.from_send.ttft.p50 == pytest.approx(249.0)
    assert lr.from_scheduled.tpot is not None and lr.from_scheduled.tpot.p50 == pytest.approx(10.0)
    assert lr.schedule_lag_p99_milliseconds == pytest.approx(1.0)
    assert lr.buckets[0].ttft_p99_milliseconds == pytest.approx(250.0)
    assert lr.client_saturated is False


def test_headline_is_the_highest_passing_level_and_the_knee_is_reported() -> None:
    slo = Slo(ttft_s=0.5)
    levels = [
        outcome(Load(1.0), 0.10, slo=slo),
        outcome(Load(2.0), 0.11, slo=slo),
        outcome(Load(3.0), 0.12, slo=slo),
        outcome(Load(4.0), 0.40, slo=slo),
        outcome(Load(5.0), 0.90, slo=slo),
    ]
    status = to_status(result(*levels), results_config_map="bench-results")
    assert status.headline is not None and status.headline.rate_per_second == 4.0
    assert status.knee_rate_per_second == 3.0
    assert status.results_config_map == "bench-results"
    assert len(status.levels) == 5 and status.phase is None


def test_the_knee_of_a_concurrency_sweep_is_the_rate_achieved_there() -> None:
    levels = [
        outcome(Load(concurrency=c, process="ClosedLoop"), t)
        for c, t in ((1, 0.1), (2, 0.11), (4, 0.12), (8, 0.6))
    ]
    r = result(*levels)
    assert r.knee == (4.0, "concurrency")
    assert r.knee_rate_per_second == pytest.approx(levels[2].stats.requests_per_second)


def test_a_single_level_is_the_headline_even_when_it_failed() -> None:
    failing = outcome(Load(1.0), 2.0, slo=Slo(ttft_s=0.5))
    assert not failing.passed
    status = to_status(result(failing))
    assert status.headline is not None and status.headline.slo_attainment == 0
    assert status.knee_rate_per_second is None


def test_console_reporter_counts_and_draws_only_when_asked() -> None:
    import io

    from rich.console import Console

    from vllm_operator.bench.report import ConsoleReporter, print_summary

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    reporter = ConsoleReporter(console)
    level = outcome(Load(2.0), 0.25)
    reporter.level_started(Load(2.0), 4)
    for rec in level.recording.records:
        reporter.request_done(rec)
    assert (reporter.done, reporter.errors) == (4, 0)
    reporter.refresh()
    reporter.level_finished(level.stats)
    reporter.close()
    print_summary(result(level), console)
    text = out.getvalue()
    assert "client kept up" in text and "2 req/s" in text and "TTFT p99" in text


@pytest.mark.parametrize("levels", [1, 3], ids=["one level", "three levels"])
def test_the_summary_reads_whole_at_80_columns(levels: int) -> None:
    """Below ~160 columns the table of every figure was cut to '3…': at 80 the figures a
    reader compares are whole, with their units in the headers."""
    import io

    from rich.console import Console

    from vllm_operator.bench.report import print_summary

    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None)
    runs = [outcome(Load(2.0 * (i + 1)), 0.25 + i) for i in range(levels)]
    print_summary(result(*runs), console)
    text = out.getvalue()
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "ms" in text  # the unit is said
    for i in range(levels):
        assert f"{250 + 1000 * i:.4g}" in text.replace(",", ""), text  # each TTFT p99, whole


def test_the_progress_bars_last_frame_counts_every_request() -> None:
    """Issue 21: the bar was last drawn in a quiet moment of the schedule and stopped
    short of the total (810/838); the level's end draws it once more, whole."""
    import io

    from rich.console import Console

    from vllm_operator.bench.report import ConsoleReporter

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, color_system=None)
    reporter = ConsoleReporter(console)
    level = outcome(Load(2.0), 0.25)
    reporter.level_started(Load(2.0), 4)
    records = level.recording.records
    reporter.request_done(records[0])
    reporter.refresh()  # the ticker's last redraw, mid-level
    for rec in records[1:]:
        reporter.request_done(rec)
    reporter.level_finished(level.stats)
    reporter.close()
    text = out.getvalue()
    assert text.rindex("4/4 errors 0") > text.rindex("1/4 errors 0")
    assert text.rindex("4/4 completed") > text.rindex("4/4 errors 0")  # the level's line


def test_the_wide_summary_is_whole_at_its_width() -> None:
    import io

    from rich.console import Console

    from vllm_operator.bench.report import WIDE_COLUMNS, print_summary

    out = io.StringIO()
    console = Console(file=out, width=WIDE_COLUMNS, color_system=None)
    runs = [outcome(Load(2000.0 * (i + 1)), 0.25 + i) for i in range(3)]
    print_summary(result(*runs), console)
    text = out.getvalue()
    assert "…" not in text, text
    assert "p99.9" in text and "errored" in text and "conns" in text


def test_a_run_fails_on_the_level_with_the_largest_share_of_errors() -> None:
    from vllm_operator.bench.result import error_failure
    from vllm_operator.bench.stats import summarize

    ok = outcome(Load(1.0), 0.25)
    bad_records = [
        RequestRecord(i, float(i), 16, 4, sent=None if i < 2 else float(i), end=float(i) + 1)
        for i in range(4)
    ]
    for r in bad_records:
        r.error = "ConnectError" if r.sent is None else None
    recording = LevelRecording(Load(2.0), tuple(bad_records), 0.0, 5.0, 0.0)
    bad = LevelOutcome(recording, summarize(recording), False)
    assert error_failure(result(ok)) is None
    message = error_failure(result(ok, bad))
    assert message == (
        "at 2 req/s, 2 of 4 requests (50.0%) got no answer or were never sent "
        "(ConnectError 2, 2 never sent), more than maxErrorFraction 0.05 allows"
    )
