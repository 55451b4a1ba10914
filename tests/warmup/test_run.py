"""The warmup runner against a local fake OpenAI server: each verdict, within the budget."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from devenv.fakes.openai_server import FakeOpenAI
from devenv.vllm_server import free_port
from tests.warmup.conftest import small_model
from vllm_operator.warmup.report import Api, Outcome
from vllm_operator.warmup.requests import build_plan
from vllm_operator.warmup.run import WarmupOptions, run_warmup

# Small plans keep these tests fast: a 256-token context, at most 4 concurrent requests.
SMALL = {"max_concurrency": 4, "max_num_seqs": 4, "max_tokens": 4, "health_interval_s": 0.05}


def options(url: str, **overrides: object) -> WarmupOptions:
    return WarmupOptions(endpoint=url, **{**SMALL, **overrides})


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[FakeOpenAI]:
    behaviour = getattr(request, "param", small_model())
    fake = FakeOpenAI(behaviour).start()
    yield fake
    fake.stop()


async def test_healthy_server_is_warmed_up_and_cold_ttft_exceeds_warm(fake: FakeOpenAI) -> None:
    # The first generation request pays 300 ms, as a real pod's first request does.
    fake.behaviour.ttft = lambda n: 0.3 if n == 0 else 0.01
    report = await run_warmup(options(fake.url, budget_s=20))
    assert report.outcome is Outcome.SUCCEEDED, report.message
    assert report.model == "fake-model"
    assert report.settled
    assert report.cold_ttft_s is not None and report.cold_ttft_s >= 0.3
    # Relative, not a wall-clock bound: warm requests skip the 300 ms the first one paid.
    assert report.warm_ttft_s is not None and report.warm_ttft_s < report.cold_ttft_s
    assert report.requests_failed == 0
    assert report.requests_sent == len(fake.received) == len(report.requests)
    assert "cold TTFT" in report.message


async def test_every_planned_request_reaches_the_server(fake: FakeOpenAI) -> None:
    opts = options(fake.url, budget_s=20, max_num_batched_tokens=64)
    report = await run_warmup(opts)
    assert report.outcome is Outcome.SUCCEEDED, report.message
    plan = build_plan(opts.plan_inputs(fake.behaviour.max_model_len))
    settle = sum(1 for r in report.requests if r.phase == "settle")
    assert len(fake.received) == 1 + plan.request_count + settle
    assert {(r.path, r.stream) for r in fake.received} == {
        ("/v1/completions", True),
        ("/v1/completions", False),
        ("/v1/chat/completions", True),
        ("/v1/chat/completions", False),
    }
    # The fake's /tokenize says one token per word: prompts are sized to the plan, never over.
    longest = max(r.words for r in fake.received)
    assert max(r.prompt_tokens for s in plan.steps for r in s.requests) - 2 <= longest
    assert longest + opts.max_tokens <= fake.behaviour.max_model_len
    assert {r.max_tokens for r in fake.received} == {opts.max_tokens}
    # Token counts come from the server's usage, streaming included.
    assert all(r.output_tokens == fake.behaviour.output_tokens for r in report.requests)


async def test_only_the_chat_api_when_asked(fake: FakeOpenAI) -> None:
    report = await run_warmup(options(fake.url, budget_s=20, apis=(Api.CHAT,)))
    assert report.outcome is Outcome.SUCCEEDED, report.message
    assert {r.path for r in fake.received} == {"/v1/chat/completions"}


@pytest.mark.timing  # the budget is checked against the wall clock
@pytest.mark.parametrize("status", [503, None], ids=["health answers 503", "nothing listens"])
async def test_server_that_never_becomes_healthy_fails_within_the_budget(
    status: int | None,
) -> None:
    fake = FakeOpenAI(small_model(health_status=503 if status is None else status)).start()
    url = fake.url if status is not None else f"http://127.0.0.1:{free_port()}"
    try:
        started = time.monotonic()
        report = await run_warmup(options(url, budget_s=1.5))
        elapsed = time.monotonic() - started
    finally:
        fake.stop()
    assert report.outcome is Outcome.NEVER_HEALTHY
    assert elapsed < 1.5 + 0.5
    assert report.duration_s <= 1.5 + 0.5
    assert report.requests_sent == 0
    assert "did not answer /health" in report.message
    assert ("HTTP 503" if status else "ConnectError") in report.message
    if status is not None:
        assert fake.health_checks >= 5  # it polled, rather than waiting once


@pytest.mark.timing  # the budget is checked against the wall clock
@pytest.mark.parametrize(
    "server", [small_model(generate_status=500)], indirect=True, ids=["generation answers 500"]
)
async def test_server_returning_errors_fails_with_the_error(server: FakeOpenAI) -> None:
    started = time.monotonic()
    report = await run_warmup(options(server.url, budget_s=20, max_failures=2))
    assert time.monotonic() - started < 5
    assert report.outcome is Outcome.SERVER_ERRORS
    assert report.requests_failed == 3
    assert "HTTP 500" in report.message and "engine broken" in report.message
    assert report.failures[0].status_code == 500


@pytest.mark.parametrize(
    "server", [small_model(models_status=500)], indirect=True, ids=["model list answers 500"]
)
async def test_server_whose_model_list_fails_is_reported_as_errors(server: FakeOpenAI) -> None:
    report = await run_warmup(options(server.url, budget_s=5))
    assert report.outcome is Outcome.SERVER_ERRORS
    assert "/v1/models" in report.message and "500" in report.message


@pytest.mark.timing  # the budget is checked against the wall clock
@pytest.mark.parametrize(
    "server",
    [small_model(ttft=lambda _n: 60.0)],
    indirect=True,
    ids=["first token after a minute"],
)
async def test_server_too_slow_to_answer_fails_at_the_budget(server: FakeOpenAI) -> None:
    started = time.monotonic()
    report = await run_warmup(options(server.url, budget_s=2))
    elapsed = time.monotonic() - started
    assert report.outcome is Outcome.TOO_SLOW
    assert 2 <= elapsed < 2 + 0.5
    assert "Budget of 2s ran out in the probe stage" in report.message
    assert "waited" in report.message
    assert report.requests_sent == 1  # the probe, still in flight
    assert report.cold_ttft_s is None


@pytest.mark.parametrize(
    "server", [small_model(ttft=lambda _n: 0.05)], indirect=True, ids=["steady 50 ms TTFT"]
)
async def test_warm_ttft_over_the_limit_is_too_slow(server: FakeOpenAI) -> None:
    report = await run_warmup(options(server.url, budget_s=20, max_ttft_s=0.02))
    assert report.outcome is Outcome.TOO_SLOW
    assert report.settled
    assert report.warm_ttft_s is not None and report.warm_ttft_s > 0.02
    assert "above the limit of 0.02s" in report.message


async def test_ttft_that_keeps_growing_does_not_settle(fake: FakeOpenAI) -> None:
    opts = options(fake.url, budget_s=20, max_settle_probes=8, settle_floor_s=0.0)
    # Fast through the plan, then every settle probe 50 % slower than the one before.
    fast = 1 + build_plan(opts.plan_inputs(fake.behaviour.max_model_len)).request_count
    fake.behaviour.ttft = lambda n: 0.0 if n < fast else 0.005 * 1.5 ** (n - fast)
    report = await run_warmup(opts)
    assert report.outcome is Outcome.NOT_SETTLED, report.message
    assert not report.settled
    assert "did not settle after 8 probes" in report.message


@pytest.mark.timing  # the budget is checked against the wall clock
async def test_ttft_still_moving_when_the_budget_ends_is_reported_not_settled(
    fake: FakeOpenAI,
) -> None:
    opts = options(fake.url, budget_s=3, settle_window=10)
    # Fast through the plan and the first settle probes, then 500 ms: the budget ends while
    # the runner still waits for two equal windows.
    fast = 1 + build_plan(opts.plan_inputs(fake.behaviour.max_model_len)).request_count + 3
    fake.behaviour.ttft = lambda n: 0.0 if n < fast else 0.5
    started = time.monotonic()
    report = await run_warmup(opts)
    assert time.monotonic() - started < 3.5
    assert report.outcome is Outcome.NOT_SETTLED, report.message
    assert "within the budget of 3s" in report.message
