"""Accuracy of the load client against a server whose timings are known exactly.

The fake server (its own process, devenv/fakes/openai_server.py) injects delays, fixed or
drawn from heavy-tailed distributions, and logs on the host's monotonic clock, the clock
the client uses too, when each request arrived and when it wrote each chunk. Each instant
the client records is checked against the server's record of the same event:

- the send stamp: every request reached the server after the client stamped it as sent,
  and typically within a fraction of a millisecond;
- the truth of each request is then the server's writes measured from that send: TTFT is
  the server's first write minus the send, ITL the gaps between the server's writes, E2E
  the server's last write minus the send. (Measuring from the server's own arrival stamp
  instead would leave out the time the operating system took to wake the server, which is
  latency the user sees.) The client's TTFT, ITL and E2E percentiles, P50 to P99.9, must
  be within 1 ms of the truth's (issue 7), plus what the machine itself added at that
  percentile: how late the server's own timers fired in the same attempt (``differences``).

A client that cannot keep up must say so, and its latency from the scheduled time must
show the queueing that latency from the send time hides.
"""

from __future__ import annotations

import itertools
import os
import random
import statistics
from collections.abc import Callable
from typing import Any

import pytest

from devenv.fakes.openai_server import Config, Delay, FakeServerProcess
from tests.bench.conftest import ServerFactory
from vllm_operator.bench import arrivals, timing
from vllm_operator.bench.client import Deadlines, LoadClient, Target
from vllm_operator.bench.records import LevelRecording, Load
from vllm_operator.bench.stats import PERCENTILES, LevelStats, Slo, Summary, summarize
from vllm_operator.bench.workload import RequestPlan

# Millisecond tolerances against the wall clock: its own tier (make test-timing).
pytestmark = pytest.mark.timing

TOLERANCE_S = 0.001


def plans(n: int, *, output_tokens: int = 8) -> list[RequestPlan]:
    return [RequestPlan(i, 16, output_tokens, prompt="w " * 16) for i in range(n)]


def run_level(
    server: FakeServerProcess,
    schedule: arrivals.Schedule,
    *,
    load: Load,
    output_tokens: int = 8,
    max_in_flight: int | None = None,
    deadlines: Deadlines = Deadlines(),  # noqa: B008
    n_plans: int = 1000,
    api: str = "completions",
) -> LevelRecording:
    async def go() -> LevelRecording:
        target = Target(server.url, "fake-model", api=api)  # type: ignore[arg-type]
        async with LoadClient(target, max_in_flight=max_in_flight, run_id="acc") as client:
            return await client.run_level(
                load, schedule, plans(n_plans, output_tokens=output_tokens), deadlines
            )

    return timing.run(go())


def truth(log: list[dict[str, Any]], recording: LevelRecording) -> dict[str, list[float]]:
    """TTFT, ITL and E2E (seconds) of the level's completed requests, from the server's
    writes and the client's send stamps (see the module docstring); with each request's
    transit (send to arrival) and the server's own TTFT (arrival to first write)."""
    sent = {f"acc-0-{r.index}": r.sent for r in recording.records}
    done = [e for e in log if e["status"] == 200 and not e["aborted"] and e["chunk_times"]]
    out: dict[str, list[float]] = {"ttft": [], "itl": [], "e2e": [], "transit": [], "served": []}
    for e in done:
        start = sent[e["request_id"]]
        assert start is not None
        out["ttft"].append(e["chunk_times"][0] - start)
        out["itl"] += [b - a for a, b in itertools.pairwise(e["chunk_times"])]
        out["e2e"].append(e["end"] - start)
        out["transit"].append(e["received"] - start)
        out["served"].append(e["chunk_times"][0] - e["received"])  # the server's own TTFT
    return out


def quantiles(summary: Summary | None) -> list[float]:
    assert summary is not None
    return [summary.p50, summary.p90, summary.p95, summary.p99, summary.p999, summary.max]


def lateness(log: list[dict[str, Any]]) -> Summary:
    """How late the server's process woke for its writes (seconds, each write's instant
    minus its timer's): the machine's own scheduling noise in this attempt, measured by a
    process that does nothing else. Tens of microseconds on an idle machine; milliseconds
    at the tail on two cores shared with other work."""
    late = Summary.of(
        max(0.0, t - d) for e in log for t, d in zip(e["chunk_times"], e["due"], strict=True)
    )
    assert late is not None
    return late


def differences(stats: LevelStats, true: dict[str, list[float]], late: Summary) -> dict[str, str]:
    """Metrics (TTFT, ITL, E2E from send) with a percentile (P50 to P99.9) further from the
    truth's than 1 ms plus the server's own lateness at that percentile, each with its
    reported/true percentiles and maxima in ms.

    The 1 ms is the client's budget (issue 7). The lateness is what the machine did in the
    same seconds to a process that only wakes and writes: the client's wake-ups on chunk
    arrival suffer the same, and no client can measure better than the machine lets it
    wake. On an idle machine it adds tens of microseconds; it grows only at the percentiles
    where the machine was slow, so a client that misreads time (a send stamped before the
    request is written, chunks stamped when read in bulk) is still off at P50, where the
    lateness is nil. The maximum is shown, not held to a tolerance: it is one request."""
    bad = {}
    labels = [f"p{p:g}" for p in PERCENTILES] + ["max"]
    allowed = [TOLERANCE_S + q for q in quantiles(late)[:-1]]
    for name in ("ttft", "itl", "e2e"):
        reported = quantiles(getattr(stats.from_send, name))
        expected = quantiles(Summary.of(true[name]))
        pairs = zip(reported[:-1], expected[:-1], allowed, strict=True)
        if any(abs(a - b) > tol for a, b, tol in pairs):
            bad[name] = ", ".join(
                f"{lab} {a * 1e3:.3f}/{b * 1e3:.3f}"
                for lab, a, b in zip(labels, reported, expected, strict=True)
            )
    return bad


def accurate_level(
    server: FakeServerProcess, make: Callable[[], LevelRecording], attempts: int = 3
) -> tuple[LevelStats, dict[str, list[float]]]:
    """Run the level until its percentiles are within tolerance of the truth (see
    ``differences``), at most ``attempts`` times; fail with every attempt's differences and
    the server's lateness.

    A client that misreads time is off on every attempt; a noisy minute is not.
    """
    failures = []
    for attempt in range(1, attempts + 1):
        recording = make()
        stats = summarize(recording)
        log = server.take_log()
        true = truth(log, recording)
        # The send stamp precedes the server's arrival, and closely.
        assert min(true["transit"]) >= 0
        assert statistics.median(true["transit"]) < 0.0005
        late = lateness(log)
        bad = differences(stats, true, late)
        if not bad:
            return stats, true
        failures.append(
            f"attempt {attempt} (load average {os.getloadavg()[0]:.2f}, server's own lateness "
            "ms: "
            + ", ".join(
                f"p{p:g} {q * 1e3:.3f}"
                for p, q in zip(PERCENTILES, quantiles(late)[:-1], strict=True)
            )
            + "): "
            + "; ".join(f"{k} reported/true ms: {v}" for k, v in bad.items())
        )
    raise AssertionError("\n".join(failures))


@pytest.mark.parametrize(
    "config",
    [
        Config(ttft=Delay(value=0.030), itl=Delay(value=0.006), seed=1),
        Config(
            ttft=Delay(kind="lognormal", median=0.020, sigma=1.0, max=0.4),
            itl=Delay(kind="pareto", scale=0.004, alpha=1.5, max=0.08),
            seed=2,
        ),
    ],
    ids=["fixed delays", "heavy-tailed delays"],
)
def test_reported_percentiles_are_within_a_millisecond_of_the_servers_timings(
    fake_server: ServerFactory, config: Config
) -> None:
    server = fake_server(config)
    schedule = arrivals.poisson(60.0, random.Random(7), count=300)
    stats, true = accurate_level(server, lambda: run_level(server, schedule, load=Load(60.0)))
    assert stats.errors_by_kind == {}
    assert len(true["ttft"]) == stats.completed == 300
    # The injected delays are what the server did (a fake with sloppy timers would make
    # this test meaningless): a fixed TTFT of 30 ms is 30 ms from the request's arrival,
    # give or take a wake-up. (From the send it is also the transit: 0.2-0.3 ms here.)
    if config.ttft.kind == "fixed":
        assert statistics.median(true["served"]) == pytest.approx(0.030, abs=0.0005)
    else:
        assert max(true["ttft"]) > 5 * statistics.median(true["ttft"])  # heavy tail


def test_chat_streams_are_measured_like_completions(fake_server: ServerFactory) -> None:
    server = fake_server(Config(ttft=Delay(value=0.02), itl=Delay(value=0.005)))
    schedule = arrivals.poisson(60.0, random.Random(8), count=300)
    stats, _ = accurate_level(
        server, lambda: run_level(server, schedule, load=Load(60.0), api="chat")
    )
    assert stats.completed == 300


def test_tokens_come_from_usage_when_chunks_carry_several(fake_server: ServerFactory) -> None:
    # 16 tokens in 4 chunks of 4, 10 ms apart: TPOT is 30 ms / 15 tokens, not 30 ms / 3.
    server = fake_server(Config(itl=Delay(value=0.010), tokens_per_chunk=4))
    recording = run_level(
        server, arrivals.constant(10.0, count=10), load=Load(10.0), output_tokens=16, n_plans=10
    )
    stats = summarize(recording)
    assert all(r.completion_tokens == 16 and len(r.chunk_times) == 4 for r in recording.records)
    assert stats.from_send.tpot is not None
    assert stats.from_send.tpot.p50 == pytest.approx(0.030 / 15, abs=0.0002)


def test_a_client_capped_in_flight_is_reported_saturated_and_its_queueing_shows(
    fake_server: ServerFactory,
) -> None:
    # Each request takes 50 + 3 x 10 = 80 ms; two in flight carry 25 req/s; 50 are offered.
    server = fake_server(Config(ttft=Delay(value=0.05), itl=Delay(value=0.01)))
    recording = run_level(
        server,
        arrivals.constant(50.0, count=40),
        load=Load(50.0, process="Constant"),
        output_tokens=4,
        max_in_flight=2,
        n_plans=40,
    )
    stats = summarize(recording)
    assert stats.client_saturated
    assert "in-flight cap 2" in stats.verdict
    send, sched = stats.from_send.ttft, stats.from_scheduled.ttft
    assert send is not None and sched is not None and stats.schedule_lag is not None
    # From the send, TTFT is the server's 50 ms; from the schedule, the last requests
    # waited ~0.8 s in the client (40 at 25/s take 1.6 s, scheduled over 0.8 s).
    assert send.p50 == pytest.approx(0.05, abs=0.002)
    assert sched.max > 0.6
    assert stats.schedule_lag.max == pytest.approx(sched.max - send.max, abs=0.05)


def test_a_rate_beyond_the_clients_capacity_is_reported_saturated(
    fake_server: ServerFactory,
) -> None:
    # Far more than one Python process can send on two cores: 4000 requests scheduled in
    # 20 ms (the client sent 20,330 req/s on a quiet machine, so 20,000 was not enough).
    server = fake_server(Config())
    recording = run_level(
        server,
        arrivals.constant(200_000.0, count=4000),
        load=Load(200_000.0, process="Constant"),
        output_tokens=2,
        n_plans=100,
    )
    stats = summarize(recording)
    assert stats.client_saturated, stats.verdict
    assert stats.send_rate_per_second is not None and stats.send_rate_per_second < 190_000
    assert "req/s of 2e+05 scheduled" in stats.verdict
    send, sched = stats.from_send.e2e, stats.from_scheduled.e2e
    assert send is not None and sched is not None
    assert sched.p99 > send.p99 + 0.05


def test_a_closed_loop_keeps_its_concurrency(fake_server: ServerFactory) -> None:
    # 20 + 3 x 5 = 35 ms per request; 4 workers: about 114 req/s.
    server = fake_server(Config(ttft=Delay(value=0.02), itl=Delay(value=0.005)))
    recording = run_level(
        server,
        arrivals.ClosedLoop(4, count=80),
        load=Load(concurrency=4, process="ClosedLoop"),
        output_tokens=4,
        n_plans=80,
    )
    stats = summarize(recording)
    assert stats.completed == 80
    assert stats.requests_per_second == pytest.approx(4 / 0.035, rel=0.1)
    assert stats.schedule_lag is not None and stats.schedule_lag.p50 < 0.002
    in_flight = max(
        sum(1 for r in recording.records if r.sent <= t < r.end)  # type: ignore[operator]
        for t in (r.sent for r in recording.records if r.sent is not None)
    )
    assert in_flight == 4


def test_deadlines_are_hard_and_failures_are_counted_by_kind(fake_server: ServerFactory) -> None:
    # TTFT 50 ms against a 20 ms deadline: every request is abandoned at 20 ms; every
    # 5th request is an HTTP 500 (before any deadline).
    server = fake_server(Config(ttft=Delay(value=0.05), fail_every=5))
    recording = run_level(
        server,
        arrivals.constant(20.0, count=20),
        load=Load(20.0),
        deadlines=Deadlines(ttft_s=0.02),
        n_plans=20,
    )
    stats = summarize(recording, slo=Slo(ttft_s=0.02))
    assert stats.errors_by_kind == {"HTTP500": 4, "TTFTDeadlineMissed": 16}
    assert stats.succeeded == 0 and stats.slo_attainment == 0
    for r in recording.records:
        if r.error == "TTFTDeadlineMissed":
            assert r.end is not None
            # Abandoned at the deadline, long before the server's 50 ms first token.
            assert 0.02 <= r.end - r.scheduled < 0.04
    log = server.take_log()
    # The client closed the connections: the server saw the requests aborted.
    assert sum(e["aborted"] for e in log) == 16


def test_a_request_on_a_connection_the_server_closed_is_sent_again(
    fake_server: ServerFactory,
) -> None:
    # The server drops every kept-alive connection when its second request arrives, as an
    # idle timeout racing the client does: each such request goes out once more, on a new
    # connection, and succeeds; only a fresh connection's request is never retried.
    import httpx

    server = fake_server(Config(drop_reused=True))
    recording = run_level(
        server,
        arrivals.ClosedLoop(1, count=6),
        load=Load(concurrency=1, process="ClosedLoop"),
        output_tokens=2,
        n_plans=6,
    )
    stats = summarize(recording)
    assert stats.errors_by_kind == {} and stats.completed == 6
    assert httpx.get(f"{server.url}/_dropped").json()["dropped"] == 5
