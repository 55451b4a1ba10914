"""A TTFT P99 objective (spec.slo / ``--ttft-p99-ms``) changes the plan or says why not."""

from __future__ import annotations

import math

import pytest

from vllm_operator.models.inference_service import (
    HuggingFaceSource,
    InferenceServiceSpec,
    ModelSource,
    ModelSpec,
    TuningSpec,
)
from vllm_operator.models.lengths import quantile as length_quantile
from vllm_operator.models.workload import SLO, LengthBucket, LengthDistribution
from vllm_operator.tune_cli import main
from vllm_operator.tuning.performance import Replica, ttft_p99
from vllm_operator.tuning.plan import plan, plan_service
from vllm_operator.tuning.results import Plan

from .helpers import arg, as_plan, gpus, model, workload

# A 3B model on one L40S under a heavy declared load: ~1,000 requests in flight, prompts
# up to 8,000 tokens. At the Latency profile's 2,048-token budget the 69 running decodes
# take a share of every step, so the p99 prompt needs four steps.
LOAD = workload(prompt=(200, 8000), output=(50, 500), peak=1000)


def _plan(target: int | None, **kw: object) -> Plan:
    return as_plan(
        plan(
            model("Llama-3.2-3B-Instruct"),
            gpus("L40S"),
            workload=kw.get("workload", LOAD),  # type: ignore[arg-type]
            slo=SLO(ttft_p99_milliseconds=target),
            tuning=TuningSpec(profile="Latency", overrides=kw.get("overrides", {})),  # type: ignore[arg-type]
        )
    )


def _ttft_notes(p: Plan) -> list[str]:
    """The batch budget's notes on TTFT (the SLO answer's own lines, tuning/slo.py, are
    tested in test_slo_answer.py and below)."""
    answer = p.slo.lines if p.slo else ()
    return [n for n in p.notes if "TTFT" in n and n not in answer]


def test_the_answer_counts_the_requests_waiting_for_a_sequence_slot() -> None:
    # 1,000 requests in flight on one L40S whose KV cache runs ~69 of them: the rest wait
    # for a slot, which the batch budget cannot help; more replicas would.
    p = _plan(3000)
    assert p.slo is not None and not p.slo.met
    (line,) = p.slo.lines
    assert line.startswith("TTFT P99 target 3,000 ms: no candidate on the 1 L40S GPUs")
    assert "(1000 requests each)" in line
    assert "would meet it: " in line and "replicas of 1 L40S" in line


def test_no_objective_keeps_the_profile_budget() -> None:
    p = _plan(None)
    assert arg(p, "max-num-batched-tokens") == "2048"
    assert not _ttft_notes(p)


def test_a_loose_objective_changes_nothing() -> None:
    p = _plan(3000)
    assert arg(p, "max-num-batched-tokens") == "2048"
    assert not _ttft_notes(p)


def test_a_tight_objective_raises_the_batch_budget() -> None:
    p = _plan(2000)
    assert int(arg(p, "max-num-batched-tokens") or 0) > 2048
    setting = p.argument("max-num-batched-tokens")
    assert setting is not None and setting.source == "Tuner"
    assert "TTFT P99 objective 2000 ms" in setting.reason
    assert "2,048 (Latency" in setting.reason  # what the default would have given
    assert not _ttft_notes(p)
    # max-num-seqs is the workload's concurrency, not lowered for TTFT (the larger budget's
    # activations may cost the KV cache a sequence or two).
    seqs = p.argument("max-num-seqs")
    assert seqs is not None and "TTFT" not in seqs.reason
    assert int(seqs.value) >= int(arg(_plan(None), "max-num-seqs") or 0) - 2


def test_an_impossible_objective_is_a_note_with_the_figures_and_what_would_help() -> None:
    p = _plan(500)
    assert arg(p, "max-num-batched-tokens") == "2048"  # a larger one would not reach it
    (note,) = _ttft_notes(p)
    assert "TTFT P99 objective 500 ms cannot be met" in note
    assert "ms predicted for the p99 prompt (7,922 tokens)" in note
    assert "even at max-num-batched-tokens 8,192" in note
    assert "shorter prompts" in note and "more GPUs per replica" in note


def test_without_prompt_lengths_the_plan_says_it_cannot_plan_for_it() -> None:
    p = _plan(500, workload=workload(peak=10))
    (note,) = _ttft_notes(p)
    assert "not planned for" in note and "no prompt lengths" in note


def test_a_pinned_budget_that_misses_the_objective_says_so() -> None:
    p = _plan(500, overrides={"max-num-batched-tokens": "1024"})
    assert arg(p, "max-num-batched-tokens") == "1024"
    (note,) = _ttft_notes(p)
    assert "predicted missed" in note and "set in overrides" in note


def test_the_note_reaches_the_status() -> None:
    spec = InferenceServiceSpec.model_validate(
        {
            "model": ModelSpec(
                source=ModelSource(
                    hugging_face=HuggingFaceSource(repo="meta-llama/Llama-3.2-3B-Instruct")
                )
            ),
            "workload": LOAD,
            "slo": SLO(ttft_p99_milliseconds=500),
            "tuning": TuningSpec(profile="Latency"),
        }
    )
    tuning = as_plan(plan_service(spec, [gpus("L40S")])).effective_tuning()
    assert any("TTFT P99 objective 500 ms cannot be met" in n for n in tuning.notes)


def test_more_budget_lowers_the_predicted_ttft_and_a_bigger_gpu_too() -> None:
    arch = model("Llama-3.2-3B-Instruct").architecture

    def ttft(budget: int, flops: float) -> float:
        r = Replica(
            arch=arch,
            weights_bytes=6_400_000_000,
            kv_bytes_per_token_gpu=114_688,
            bandwidth_bytes_per_second=864e9,
            measured=False,
            flops_per_second=flops,
            tensor_parallel=1,
            link=None,
            peer_to_peer=True,
        )
        common = {"prompt_p99": 8000, "prompt_mean": 4100.0, "output_mean": 275.0}
        return ttft_p99(
            r, batched_tokens=budget, decodes=68, context=4375, concurrency=69, **common
        ).seconds

    assert ttft(8192, 362e12) < ttft(2048, 362e12) < ttft(1024, 362e12)
    assert ttft(8192, 989e12) < ttft(8192, 362e12)
    assert math.isinf(ttft(64, 362e12))  # no prompt token fits beside 68 decodes


@pytest.mark.parametrize(
    ("dist", "p99"),
    [
        (LengthDistribution(type="Fixed", value=500), 500),
        (LengthDistribution(type="Uniform", min=100, max=1100), 1090),
        (LengthDistribution(type="LogNormal", median=800, sigma=0.5, max=2000), 2000),
        (LengthDistribution(type="LogNormal", median=800, sigma=0.5), 2561),
        (LengthDistribution(type="Normal", mean=1000, stddev=100), 1233),
        (
            LengthDistribution(
                type="Buckets",
                buckets=[
                    LengthBucket(min=1, max=100, weight=98),
                    LengthBucket(min=1000, max=2000, weight=2),
                ],
            ),
            1500,
        ),
    ],
    ids=["fixed", "uniform", "lognormal clamped", "lognormal", "normal", "buckets"],
)
def test_prompt_p99(dist: LengthDistribution, p99: int) -> None:
    assert length_quantile(dist, 0.99) == pytest.approx(p99, abs=1)


def _tune(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    code = main(
        [
            "Llama-3.2-3B-Instruct",
            "--gpu",
            "L40S",
            "--profile",
            "Latency",
            "--prompt-p50",
            "1000",
            "--prompt-p99",
            "8000",
            "--output-p50",
            "200",
            "--output-max",
            "1000",
            "--peak-concurrency",
            "1000",
            *extra,
        ]
    )
    out, _ = capsys.readouterr()
    assert code == 0
    return out


def test_tune_ttft_flag_changes_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    without = _tune(capsys)
    tight = _tune(capsys, "--ttft-p99-ms", "1000")
    assert "--max-num-batched-tokens 2048" in without
    assert "--max-num-batched-tokens 8192" in tight
    assert "TTFT P99 objective 1000 ms:" in tight


def test_tune_ttft_flag_that_cannot_be_met_prints_why(capsys: pytest.CaptureFixture[str]) -> None:
    out = _tune(capsys, "--ttft-p99-ms", "300")
    assert "--max-num-batched-tokens 2048" in out
    assert "TTFT P99 objective 300 ms cannot be met on 1 L40S per replica" in out
