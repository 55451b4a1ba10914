"""The warmup's request plan: which prompt lengths, batch sizes, APIs and streaming modes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.determinism import same_across_processes
from vllm_operator.warmup.report import Api
from vllm_operator.warmup.requests import (
    PlanInputs,
    batch_sizes,
    build_plan,
    calibration_text,
    default_cudagraph_capture_sizes,
    prompt_buckets,
    prompt_text,
)


def test_default_capture_sizes_follow_vllm() -> None:
    sizes = default_cudagraph_capture_sizes(256)
    assert sizes[:4] == [1, 2, 4, 8]
    assert sizes[-1] == 512
    assert 248 in sizes and 256 in sizes and 264 not in sizes and 272 in sizes
    assert default_cudagraph_capture_sizes(4) == [1, 2, 4, 8]


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        pytest.param(
            PlanInputs(max_model_len=2048, max_tokens=8),
            [16, 64, 256, 1024, 1912],
            id="a 2k context gives geometric buckets up to the longest prompt that fits",
        ),
        pytest.param(
            PlanInputs(max_model_len=32768, max_num_batched_tokens=2048, max_tokens=8),
            [16, 64, 256, 1024, 2048, 3072, 4096, 16384, 30712],
            id="a chunked-prefill budget adds one prompt at and one beyond the budget",
        ),
        pytest.param(
            PlanInputs(max_model_len=64, max_tokens=8, min_prompt_tokens=16),
            [16, 40],
            id="a tiny context keeps only what fits",
        ),
    ],
)
def test_prompt_buckets(inputs: PlanInputs, expected: list[int]) -> None:
    assert prompt_buckets(inputs) == expected
    assert max(expected) + inputs.max_tokens < inputs.max_model_len


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        pytest.param(
            PlanInputs(max_model_len=2048), [1, 2, 4, 8, 16], id="default sizes capped at 16"
        ),
        pytest.param(
            PlanInputs(max_model_len=2048, max_num_seqs=6),
            [1, 2, 4],
            id="never more concurrent requests than max-num-seqs",
        ),
        pytest.param(
            PlanInputs(max_model_len=2048, max_concurrency=64),
            [1, 2, 4, 8, 16, 32, 64],
            id="a geometric subset of the capture sizes up to the concurrency cap",
        ),
        pytest.param(
            PlanInputs(max_model_len=2048, cudagraph_capture_sizes=(1, 3, 5, 12), max_num_seqs=8),
            [1, 3, 5],
            id="explicit capture sizes are used, up to the largest one allowed",
        ),
    ],
)
def test_batch_sizes(inputs: PlanInputs, expected: list[int]) -> None:
    assert batch_sizes(inputs) == expected


def test_plan_covers_every_bucket_api_and_streaming_mode() -> None:
    inputs = PlanInputs(max_model_len=2048, max_num_batched_tokens=512)
    plan = build_plan(inputs)
    singles = {
        (r.prompt_tokens, r.api, r.stream)
        for step in plan.steps
        if step.concurrency == 1
        for r in step.requests
    }
    for bucket in prompt_buckets(inputs):
        for api in (Api.COMPLETIONS, Api.CHAT):
            for stream in (True, False):
                assert (bucket, api, stream) in singles


def test_plan_covers_every_batch_size_with_both_streaming_modes() -> None:
    plan = build_plan(PlanInputs(max_model_len=2048))
    batches = {s.concurrency: s for s in plan.steps if s.name.startswith("batch-")}
    assert sorted(batches) == [2, 4, 8, 16]
    for step in batches.values():
        assert {r.stream for r in step.requests} == {True, False}
    assert {r.api for r in batches[4].requests} == {Api.COMPLETIONS, Api.CHAT}


def test_plan_fills_the_chunked_prefill_budget_with_concurrent_prompts() -> None:
    plan = build_plan(PlanInputs(max_model_len=4096, max_num_batched_tokens=1024))
    (step,) = [s for s in plan.steps if s.name.startswith("chunked-prefill")]
    assert step.concurrency == 4
    assert sum(r.prompt_tokens for r in step.requests) > 1024


def test_plan_without_a_budget_has_no_chunked_prefill_step() -> None:
    plan = build_plan(PlanInputs(max_model_len=4096))
    assert not [s for s in plan.steps if s.name.startswith("chunked-prefill")]


def test_probe_is_a_short_streaming_request() -> None:
    plan = build_plan(PlanInputs(max_model_len=2048, apis=(Api.CHAT,)))
    assert plan.probe.stream
    assert plan.probe.prompt_tokens == 16
    assert plan.probe.api is Api.CHAT
    assert {r.api for s in plan.steps for r in s.requests} == {Api.CHAT}


def warmup_plan() -> object:
    return build_plan(PlanInputs(max_model_len=8192, max_num_batched_tokens=2048, max_num_seqs=64))


def test_plan_is_deterministic() -> None:
    same_across_processes("tests.warmup.test_requests:warmup_plan")


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"max_model_len": 16}, id="a context below 32 tokens is refused"),
        pytest.param(
            {"max_model_len": 32, "min_prompt_tokens": 30, "max_tokens": 8},
            id="a shortest prompt plus output longer than the context is refused",
        ),
        pytest.param({"max_model_len": 2048, "apis": ()}, id="no API at all is refused"),
    ],
)
def test_impossible_inputs_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PlanInputs(**kwargs)


@pytest.mark.parametrize("tokens_per_word", [1.0, 1.3, 2.5])
def test_prompt_text_never_exceeds_its_token_target(tokens_per_word: float) -> None:
    for target in (16, 100, 1000):
        text = prompt_text(target, tokens_per_word=tokens_per_word, serial=7)
        words = text.split()
        assert words[0] == "r7"
        # The serial word counts too; the estimate must err short.
        assert len(words) * tokens_per_word <= target + tokens_per_word
        assert len(words) * tokens_per_word >= target * 0.8 - 2 * tokens_per_word


def test_prompts_of_different_requests_differ_from_their_first_word() -> None:
    a = prompt_text(64, tokens_per_word=1.0, serial=1)
    b = prompt_text(64, tokens_per_word=1.0, serial=2)
    assert a.split()[0] != b.split()[0]
    assert a.split()[1:] == b.split()[1:]


def test_calibration_text_is_long_enough_to_average() -> None:
    assert len(calibration_text().split()) >= 100
