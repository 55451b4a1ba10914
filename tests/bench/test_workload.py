"""Workload: length distributions, datasets, traces, and prompts of exact token counts."""

from __future__ import annotations

import itertools
import json
import random
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_operator.bench.tokenizer import LocalTokenizer
from vllm_operator.bench.workload import (
    PromptBuilder,
    WordTokenizer,
    bucket_edges,
    parse_dataset,
    parse_trace,
    plan_requests,
)
from vllm_operator.models.lengths import sample as sample_lengths
from vllm_operator.models.workload import LengthBucket, LengthDistribution


def dist(**kw: object) -> LengthDistribution:
    return LengthDistribution.model_validate(kw)


def test_fixed_gives_the_value() -> None:
    assert sample_lengths(dist(type="Fixed", value=17), 5, random.Random(0)) == [17] * 5


def test_uniform_covers_its_inclusive_range() -> None:
    xs = sample_lengths(dist(type="Uniform", min=10, max=20), 5000, random.Random(0))
    assert min(xs) == 10 and max(xs) == 20
    assert statistics.fmean(xs) == pytest.approx(15, abs=0.2)


def test_normal_has_its_mean_and_stddev_and_is_clamped() -> None:
    xs = sample_lengths(dist(type="Normal", mean=500, stddev=100), 20_000, random.Random(1))
    assert statistics.fmean(xs) == pytest.approx(500, rel=0.01)
    assert statistics.pstdev(xs) == pytest.approx(100, rel=0.03)
    clamped = sample_lengths(
        dist(type="Normal", mean=50, stddev=100, min=10, max=80), 2000, random.Random(1)
    )
    assert min(clamped) == 10 and max(clamped) == 80


def test_lognormal_has_its_median_and_a_long_right_tail() -> None:
    xs = sample_lengths(dist(type="LogNormal", median=300, sigma=1.0), 20_000, random.Random(2))
    assert statistics.median(xs) == pytest.approx(300, rel=0.04)
    # sigma 1: the 99th percentile is e^(2.326) ~ 10x the median.
    assert sorted(xs)[int(0.99 * len(xs))] == pytest.approx(3072, rel=0.1)
    assert min(xs) >= 1


def test_buckets_follow_their_weights() -> None:
    # The mix of docs/field-notes.md (9).
    d = dist(
        type="Buckets",
        buckets=[
            {"min": 1, "max": 127, "weight": 40},
            {"min": 128, "max": 255, "weight": 30},
            {"min": 256, "max": 511, "weight": 20},
            {"min": 512, "max": 1023, "weight": 10},
        ],
    )
    xs = sample_lengths(d, 20_000, random.Random(3))
    shares = [
        sum(lo <= x <= hi for x in xs) / len(xs)
        for lo, hi in ((1, 127), (128, 255), (256, 511), (512, 1023))
    ]
    assert shares == pytest.approx([0.4, 0.3, 0.2, 0.1], abs=0.015)
    assert bucket_edges(d) == [(1, 127), (128, 255), (256, 511), (512, 1023)]


@settings(max_examples=50, deadline=None)
@given(
    buckets=st.lists(
        st.tuples(st.integers(1, 5000), st.integers(0, 500), st.floats(0.01, 100)),
        min_size=1,
        max_size=6,
    ),
    seed=st.integers(0, 2**31),
)
def test_every_bucket_draw_lies_in_a_bucket(
    buckets: list[tuple[int, int, float]], seed: int
) -> None:
    spec = [LengthBucket(min=lo, max=lo + w, weight=wt) for lo, w, wt in buckets]
    xs = sample_lengths(LengthDistribution(type="Buckets", buckets=spec), 200, random.Random(seed))
    assert all(any(b.min <= x <= b.max for b in spec) for x in xs)


def test_default_buckets_are_powers_of_two() -> None:
    edges = bucket_edges(None)
    assert edges[:3] == [(1, 127), (128, 255), (256, 511)]
    assert all(hi + 1 == nxt for (_, hi), (nxt, _) in itertools.pairwise(edges))


def test_more_planned_requests_start_with_the_same_ones() -> None:
    kw = {
        "prompt_tokens": dist(type="LogNormal", median=100, sigma=1.0),
        "output_tokens": dist(type="Uniform", min=1, max=500),
    }
    short = plan_requests(10, random.Random(5), **kw)  # type: ignore[arg-type]
    long = plan_requests(1000, random.Random(5), **kw)  # type: ignore[arg-type]
    assert long[:10] == short


def test_dataset_entries_are_used_each_once_before_reuse() -> None:
    data = parse_dataset(
        [
            json.dumps({"prompt": "one two three", "output_tokens": 5}),
            "",
            json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}),
            json.dumps({"prompt": "four", "prompt_tokens": 9}),
        ]
    )
    plans = plan_requests(6, random.Random(0), dataset=data, default_output_tokens=11)
    first, second = plans[:3], plans[3:]
    key = [(p.prompt, p.messages) for p in first]
    assert sorted(map(str, key)) == sorted(map(str, [(p.prompt, p.messages) for p in second]))
    by_prompt = {p.prompt: p for p in plans}
    assert by_prompt["one two three"].output_tokens == 5
    assert by_prompt["one two three"].prompt_tokens == 3  # words, as a planning estimate
    assert by_prompt["four"].prompt_tokens == 9 and by_prompt["four"].output_tokens == 11
    assert by_prompt[None].output_tokens == 7


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        ("[1]", "not a JSON object"),
        ('{"output_tokens": 3}', "exactly one of prompt, messages"),
        ('{"prompt": "a", "messages": []}', "exactly one of prompt, messages"),
        ('{"prompt": "a", "output_tokens": 0}', "positive integers"),
        ('{"messages": "hi"}', "list of objects"),
    ],
    ids=[
        "a line that is not JSON is refused",
        "a line that is not an object is refused",
        "a line without a prompt is refused",
        "a line with both prompt and messages is refused",
        "a zero output length is refused",
        "messages that are not a list are refused",
    ],
)
def test_bad_dataset_lines_are_refused_with_the_line_number(line: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_dataset(['{"prompt": "fine"}', line])


def test_trace_is_sorted_shifted_and_keeps_lengths() -> None:
    trace = parse_trace(
        [
            '{"timestamp": 12.5, "input_length": 30, "output_length": 4}',
            '{"timestamp": 10.0, "prompt_tokens": 8}',
        ]
    )
    assert [(e.offset, e.prompt_tokens, e.output_tokens) for e in trace] == [
        (0.0, 8, None),
        (2.5, 30, 4),
    ]
    plans = plan_requests(
        2,
        random.Random(0),
        prompt_tokens=dist(type="Fixed", value=100),
        output_tokens=dist(type="Fixed", value=50),
        trace=trace,
    )
    assert [(p.prompt_tokens, p.output_tokens) for p in plans] == [(8, 50), (30, 4)]


# --- prompts of exact token counts ------------------------------------------------------


class PairTokenizer:
    """Counts do not add up: two-letter pieces that span spaces (a hostile tokenizer)."""

    def encode(self, text: str) -> list[int]:
        return list(range((len(text) + 1) // 2))


def test_prompts_are_exact_when_token_counts_add_up() -> None:
    builder = PromptBuilder(WordTokenizer())
    builder.calibrate(random.Random(0))
    assert builder.additive
    for n in (1, 2, 17, 500):
        text, count = builder.build(n, random.Random(n))
        assert count == n and len(text.split()) == n


def test_prompts_are_corrected_when_counts_do_not_add_up() -> None:
    tok = PairTokenizer()
    builder = PromptBuilder(tok)
    builder.calibrate(random.Random(0))
    assert not builder.additive
    exact = 0
    for n in range(5, 200, 7):
        text, count = builder.build(n, random.Random(n))
        assert count == len(tok.encode(text))
        assert abs(count - n) <= 2
        exact += count == n
    assert exact >= 0.8 * len(range(5, 200, 7))


def test_prompts_differ_between_requests() -> None:
    builder = PromptBuilder(WordTokenizer())
    builder.calibrate(random.Random(0))
    a, _ = builder.build(64, random.Random(1))
    b, _ = builder.build(64, random.Random(2))
    # No shared prefix beyond a few words, so a prefix cache does not serve them.
    common = next(i for i, (x, y) in enumerate(zip(a.split(), b.split(), strict=True)) if x != y)
    assert common < 4


def byte_level_bpe(path: Path) -> Path:
    """A small byte-level BPE tokenizer.json, trained here like the tiny test models'."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    text = ["the quick brown fox jumps over the lazy dog while it was raining in the city"] * 50
    tok.train_from_iterator(text, trainer)
    out = path / "tokenizer.json"
    tok.save(str(out))
    return path


def test_prompts_are_exact_with_a_real_byte_level_bpe(tmp_path: Path) -> None:
    tok = LocalTokenizer(str(byte_level_bpe(tmp_path)))
    builder = PromptBuilder(tok)
    builder.calibrate(random.Random(0))
    for n in (1, 3, 64, 257, 1000):
        text, count = builder.build(n, random.Random(n))
        assert count == n
        assert len(tok.encode(text)) == n
