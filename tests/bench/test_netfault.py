"""Network faults in user space (bench/netfault.py): the schedule each direction follows,
the relay's bytes, and what the client measures through it."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import statistics
from pathlib import Path

import pytest

from devenv.fakes.openai_server import Config, Delay
from tests.bench.conftest import ServerFactory
from vllm_operator.bench import arrivals, timing
from vllm_operator.bench.cli import EXIT_OK, EXIT_USAGE, main
from vllm_operator.bench.client import Deadlines, LoadClient, Target
from vllm_operator.bench.netfault import FaultProxy, Impairment, Schedule
from vllm_operator.bench.records import LevelRecording, Load
from vllm_operator.bench.workload import RequestPlan

# --- the schedule -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("delay_s", {"delay_s": -0.001}),
        ("jitter_s", {"jitter_s": float("inf")}),
        ("retransmit_s", {"retransmit_s": -1.0}),
        ("loss", {"loss": 1.0}),
        ("loss", {"loss": float("nan")}),
    ],
)
def test_an_impossible_impairment_is_refused_naming_the_field(
    field: str, kwargs: dict[str, float]
) -> None:
    with pytest.raises(ValueError, match=f"^{field} must be"):
        Impairment(**kwargs)


def test_a_delay_is_added_to_every_read_and_jitter_never_reorders_the_stream() -> None:
    schedule = Schedule(Impairment(delay_s=0.010, jitter_s=0.008), random.Random(1))
    arrivals_ = [i * 0.001 for i in range(2000)]  # reads 1 ms apart, jitter wider than that
    due = [schedule.due(t) for t in arrivals_]
    assert all(b >= a for a, b in itertools.pairwise(due))  # in order
    assert all(d >= t + 0.002 - 1e-12 for t, d in zip(arrivals_, due, strict=True))
    waits = [d - t for t, d in zip(arrivals_, due, strict=True)]
    # Held behind a later-jittered predecessor at times, so at most delay + jitter; centred
    # above the delay, not on it, because order is kept.
    assert max(waits) <= 0.018 + 1e-12
    assert 0.010 <= statistics.median(waits) < 0.016


def test_a_lost_read_waits_one_retransmission_and_holds_back_what_follows() -> None:
    imp = Impairment(delay_s=0.005, loss=0.1, retransmit_s=0.2, seed=3)
    schedule = Schedule(imp, random.Random(3))
    arrivals_ = [i * 0.05 for i in range(5000)]  # reads 50 ms apart
    waits = [schedule.due(t) - t for t in arrivals_]
    lost = sum(1 for w in waits if w == pytest.approx(0.205))
    held = sum(1 for w in waits if w > 0.0051)
    assert 0.08 < lost / len(waits) < 0.12  # one read in ten
    # A lost read holds back the three after it too (head-of-line blocking): a read is held
    # when it or one of the three before it was lost, 1 - 0.9**4 = 34 % of them.
    assert 0.30 < held / len(waits) < 0.39
    assert min(waits) == pytest.approx(0.005) and max(waits) == pytest.approx(0.205)
    # Nothing is lost for good: without loss every read waits the delay alone.
    plain = Schedule(Impairment(delay_s=0.005), random.Random(3))
    assert {round(plain.due(t) - t, 9) for t in arrivals_} == {0.005}


def test_an_unreachable_target_closes_the_clients_connection() -> None:
    async def go() -> bytes:
        async with FaultProxy("http://127.0.0.1:9", Impairment(delay_s=0.001)) as proxy:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                data = await asyncio.wait_for(reader.read(), timeout=5)
            except ConnectionResetError:  # closed with the request unread: a reset
                data = b""
            writer.close()
            return data

    # Closed (or reset), as an unreachable server's connection would be; not left hanging.
    assert asyncio.run(go()) == b""


def test_describe_names_every_fault() -> None:
    imp = Impairment(delay_s=0.02, jitter_s=0.005, loss=0.01)
    assert imp.describe() == "delay 20 ms, jitter ±5 ms, loss 0.01 (retransmit 200 ms) each way"
    assert not Impairment().active and Impairment().describe() == "none each way"


def test_only_plain_http_can_be_relayed() -> None:
    with pytest.raises(ValueError, match="http:// endpoint"):
        FaultProxy("https://example.invalid:8443", Impairment(delay_s=0.01))


# --- through the relay, against the fake server ------------------------------------------


def _level(url: str, count: int) -> LevelRecording:
    plans = [RequestPlan(i, 8, 4, prompt="w " * 8) for i in range(count)]

    async def go() -> LevelRecording:
        async with LoadClient(Target(url, "fake-model"), run_id="net") as client:
            return await client.run_level(
                Load(20.0), arrivals.constant(20.0, count=count), plans, Deadlines()
            )

    return timing.run(go())


def _through(url: str, imp: Impairment, count: int) -> tuple[LevelRecording, int]:
    async def go() -> tuple[LevelRecording, int]:
        async with FaultProxy(url, imp) as proxy:
            plans = [RequestPlan(i, 8, 4, prompt="w " * 8) for i in range(count)]
            async with LoadClient(Target(proxy.url, "fake-model"), run_id="net") as client:
                rec = await client.run_level(
                    Load(20.0), arrivals.constant(20.0, count=count), plans, Deadlines()
                )
            return rec, proxy.connections

    return timing.run(go())


def _ttfts(rec: LevelRecording) -> list[float]:
    assert all(r.error is None for r in rec.records), [r.error for r in rec.records]
    return [r.first_token - r.sent for r in rec.records if r.first_token and r.sent]


@pytest.mark.timing
def test_the_measured_ttft_grows_by_one_round_trip_of_the_injected_delay(
    fake_server: ServerFactory,
) -> None:
    server = fake_server(Config(ttft=Delay(value=0.02), itl=Delay(value=0.005)))
    direct = statistics.median(_ttfts(_level(server.url, 40)))
    rec, connections = _through(server.url, Impairment(delay_s=0.025), 40)
    delayed = statistics.median(_ttfts(rec))
    # 25 ms each way: 50 ms more, within the few milliseconds a busy machine adds.
    assert delayed - direct == pytest.approx(0.050, abs=0.005)
    assert connections >= 1
    # The streams arrived whole: every request has its four tokens.
    assert all(r.completion_tokens == 4 for r in rec.records)


def test_loss_delays_some_requests_by_a_retransmission_and_drops_none(
    fake_server: ServerFactory,
) -> None:
    server = fake_server(Config(ttft=Delay(value=0.01), itl=Delay(value=0.005)))
    rec, _ = _through(server.url, Impairment(loss=0.1, retransmit_s=0.15, seed=5), 40)
    ttfts = _ttfts(rec)
    assert len(ttfts) == 40 and all(r.completion_tokens == 4 for r in rec.records)
    slow = [t for t in ttfts if t >= 0.15]
    # A request is slow when its request, a chunk before its first token or a read ahead of
    # them on its connection was lost (each one read in ten): some, not most.
    assert 0 < len(slow) < 30


# --- the command line ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--net-loss", "1", "must be below 1"),
        ("--net-loss", "-0.1", "must be between 0 and 1"),
        ("--net-delay-ms", "-5", "must be a finite number of ms >= 0"),
        ("--net-jitter-ms", "x", "not a number"),
    ],
)
def test_a_bad_fault_flag_exits_2_naming_it(
    flag: str, value: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--endpoint", "http://127.0.0.1:9", flag, value])
    assert exit_.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"argument {flag}: {words}" in err


def test_faults_on_an_https_endpoint_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--endpoint", "https://127.0.0.1:9", "--net-delay-ms", "5", "--rate", "1"]
    assert main([*argv, "--output-dir", str(tmp_path), "--no-progress"]) == EXIT_USAGE
    assert "--net-* faults need an http:// --endpoint" in capsys.readouterr().err


def test_a_run_with_faults_reports_them_and_the_real_endpoint(
    fake_server: ServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = fake_server(Config(ttft=Delay(value=0.01)))
    code = main(
        [
            "--endpoint", server.url, "--rate", "20", "--requests", "10", "--output-tokens", "2",
            "--output-dir", str(tmp_path), "--no-html", "--no-progress",
            "--net-delay-ms", "10", "--net-jitter-ms", "2",
        ]
    )  # fmt: skip
    assert code == EXIT_OK
    assert "Network faults: delay 10 ms, jitter ±2 ms each way" in capsys.readouterr().out
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["endpoint"] == server.url
    assert results["client"]["network_faults"] == "delay 10 ms, jitter ±2 ms each way"
    ttft = results["levels"][0]["stats"]["from_send"]["ttft"]["p50"]
    assert ttft >= 0.030  # the server's 10 ms and two delays of at least 8 ms
