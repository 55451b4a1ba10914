"""The load client's connections, and a client asked for more than it (or the server) can do.

Issue 21: past its maximum the client opened a new connection for every due request that
found none idle (8,197 connections for 10,699 requests), the server's accept queue
overflowed and most requests failed on connect timeouts. Now the pool is bounded, a client
past its capacity says it fell behind and by how much, and the counts are reported. Every
level here is bounded in requests and in time; the server is on 127.0.0.1.

The server's fixed delays set hard lower bounds (three connections and 40 ms a request
cannot send 30 requests in less than 360 ms), so the assertions on lateness hold however
slow the machine is: a busy machine only makes the client later.
"""

from __future__ import annotations

from devenv.fakes.openai_server import Config, Delay, FakeServerProcess
from tests.bench.conftest import ServerFactory
from vllm_operator.bench import arrivals, timing
from vllm_operator.bench.client import DEFAULT_MAX_CONNECTIONS, Deadlines, LoadClient, Target
from vllm_operator.bench.records import CONNECT_ERROR, TTFT_DEADLINE, LevelRecording, Load
from vllm_operator.bench.stats import summarize
from vllm_operator.bench.workload import RequestPlan


def plans(n: int) -> list[RequestPlan]:
    return [RequestPlan(i, 4, 2, prompt="w " * 4) for i in range(n)]


def level(
    url: str,
    schedule: arrivals.Schedule,
    *,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    deadlines: Deadlines = Deadlines(),  # noqa: B008
    load: Load = Load(200.0, process="Constant"),  # noqa: B008
) -> LevelRecording:
    async def go() -> LevelRecording:
        target = Target(url, "fake-model", api="completions", connect_timeout_s=5)
        async with LoadClient(target, max_connections=max_connections, run_id="conn") as client:
            return await client.run_level(load, schedule, plans(50), deadlines, drain_timeout_s=20)

    return timing.run(go())


def slow_server(fake_server: ServerFactory) -> FakeServerProcess:
    return fake_server(Config(ttft=Delay(value=0.04), log=False))


def test_the_pool_never_holds_more_connections_than_its_cap(fake_server: ServerFactory) -> None:
    server = slow_server(fake_server)
    server.take_stats()
    recording = level(server.url, arrivals.constant(200, count=30), max_connections=3)
    seen = server.take_stats()
    assert seen["requests"] == 30
    # The server's count: connections that carried a request, and the most open at once.
    assert seen["generation_connections"] <= 3 and seen["generation_peak"] <= 3, seen
    stats = summarize(recording)
    assert stats.completed == 30 and stats.errored == 0 and stats.unsent == 0
    assert stats.connections_opened == seen["generation_connections"]
    assert stats.connections_peak is not None and stats.connections_peak <= 3
    assert stats.max_connections == 3
    assert stats.requests_at_connection_cap is not None and stats.requests_at_connection_cap > 0


def test_a_client_past_its_capacity_says_it_is_behind_schedule_and_by_how_much(
    fake_server: ServerFactory,
) -> None:
    # 200 req/s asked of three connections at 40 ms a request (at most 75 req/s): the
    # 30th request, due at 145 ms, cannot go out before 9 rounds of 40 ms.
    server = slow_server(fake_server)
    recording = level(server.url, arrivals.constant(200, count=30), max_connections=3)
    stats = summarize(recording)
    assert stats.completed == 30  # it fell behind; nothing failed
    assert stats.client_saturated
    assert stats.schedule_lag is not None and stats.schedule_lag.max >= 0.2
    assert "behind schedule" in stats.verdict, stats.verdict
    assert "waited for one of its 3 connections (the cap)" in stats.verdict, stats.verdict
    sent = [r.sent for r in recording.records if r.sent is not None]
    assert max(sent) - min(sent) >= 0.3  # sent at the rate it could, not all at once


def test_a_closed_loop_gets_its_concurrency_whatever_the_cap(fake_server: ServerFactory) -> None:
    server = slow_server(fake_server)
    server.take_stats()
    recording = level(
        server.url,
        arrivals.ClosedLoop(4, count=12),
        max_connections=1,
        load=Load(concurrency=4, process="ClosedLoop"),
    )
    seen = server.take_stats()
    assert seen["generation_peak"] == 4
    stats = summarize(recording)
    assert stats.completed == 12 and stats.max_connections == 4
    assert stats.requests_at_connection_cap == 0


def test_requests_that_waited_past_their_deadline_are_counted_as_never_sent(
    fake_server: ServerFactory,
) -> None:
    # One connection, 40 ms a request, 20 due at once: the TTFT deadline of 100 ms passes
    # for most of them while they wait for the connection.
    server = slow_server(fake_server)
    recording = level(
        server.url,
        arrivals.OpenLoop(tuple(0.0 for _ in range(20))),
        max_connections=1,
        deadlines=Deadlines(ttft_s=0.1),
    )
    stats = summarize(recording)
    never = [r for r in recording.records if r.sent is None]
    assert never and all(r.error == TTFT_DEADLINE for r in never)
    assert stats.unsent == len(never) and stats.errored == len(never)
    assert stats.error_fraction == len(never) / 20
    assert f"{len(never)} scheduled requests never sent" in stats.verdict


def test_a_refused_connection_fails_its_requests_and_opens_no_storm(
    unused_tcp_port: int,
) -> None:
    recording = level(
        f"http://127.0.0.1:{unused_tcp_port}",
        arrivals.constant(500, count=40),
        max_connections=8,
    )
    stats = summarize(recording)
    assert stats.errors_by_kind == {CONNECT_ERROR: 40}
    assert stats.errored == 40 and stats.error_fraction == 1.0
    assert stats.connections_opened == 0
    assert stats.connections_peak is not None and stats.connections_peak <= 8


def test_a_spinning_wait_still_serves_io_at_once_and_ends_at_its_timeout() -> None:
    import selectors
    import socket
    import time

    from vllm_operator.bench.timing import PreciseEpollSelector

    a, b = socket.socketpair()
    with a, b, PreciseEpollSelector(spin_s=0.5) as sel:
        sel.register(a, selectors.EVENT_READ)
        began = time.monotonic()
        assert sel.select(0.02) == []  # nothing to read: the whole wait, spun
        assert time.monotonic() - began >= 0.02
        b.send(b"x")
        ready = sel.select(30)  # ready now: no waiting for the spin or the timeout
        assert [key.fileobj for key, _ in ready] == [a]
