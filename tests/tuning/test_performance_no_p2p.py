"""Tensor parallelism across PCIe without peer-to-peer (docs/field-notes.md, 1).

GeForce boards have no PCIe peer-to-peer: vLLM's custom all-reduce is off, the plan sets
NCCL_P2P_DISABLE=1 and NCCL stages every all-reduce through host memory, with CUDA graphs
still on. The decode model charges ~200 us per all-reduce there
(``NO_P2P_ALL_REDUCE_SECONDS``); the table below is what it was calibrated against, each
data point with its source and what the model says about it. Before the change the
reported case was predicted the other way round: 71.9 tokens/s at TP 2 against 60.2 at
TP 1 (100 us per all-reduce); now 51.3 against 60.2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from vllm_operator.models.inference_service import TuningSpec
from vllm_operator.tuning.performance import (
    ALL_REDUCE_SECONDS,
    NO_P2P_ALL_REDUCE_SECONDS,
    all_reduce_seconds,
)
from vllm_operator.tuning.plan import plan
from vllm_operator.tuning.quantization import WeightFormat
from vllm_operator.tuning.results import Plan

from .helpers import arg, as_plan, gpus, model

QWEN = "Qwen/Qwen2-7B-Instruct"


def _decode(
    name: str, product: str, tp: int, interconnect: str | None = "phb", **kw: object
) -> Plan:
    fmt = kw.pop("fmt", None)
    m = model(name, fmt) if isinstance(fmt, WeightFormat) else model(name)
    tuning = TuningSpec(overrides={"tensor-parallel-size": str(tp)})
    return as_plan(plan(m, gpus(product, max(2, tp), interconnect), tuning=tuning))


def _rate(p: Plan) -> float:
    rate = p.predictions.decode_tokens_per_second
    assert rate is not None
    return rate


def _field_report() -> None:
    tp1, tp2 = _rate(_decode(QWEN, "RTX-4090", 1)), _rate(_decode(QWEN, "RTX-4090", 2))
    assert tp2 < tp1
    assert tp1 == pytest.approx(60.2, abs=0.1)
    assert tp2 == pytest.approx(51.3, abs=0.1)


def _seventy_b() -> None:
    awq = WeightFormat("AWQ", 4, 128, origin="test")
    rate = _rate(_decode("Llama-3.1-70B-Instruct", "RTX-4090", 2, fmt=awq))
    assert 28 / 2 <= rate <= 35


def _p2p_in_a_graph() -> None:
    for link in ("PIX", "PXB"):
        assert 20.3e-6 / 2 <= ALL_REDUCE_SECONDS[link] <= 2 * 20.3e-6


def _host_path_twice_p2p() -> None:
    p2p = all_reduce_seconds("PHB", peer_to_peer=True, tensor_parallel=2)
    host = all_reduce_seconds("PHB", peer_to_peer=False, tensor_parallel=2)
    assert host >= 2 * p2p
    assert host == NO_P2P_ALL_REDUCE_SECONDS


def _below_eager() -> None:
    assert NO_P2P_ALL_REDUCE_SECONDS < 614e-6


@dataclasses.dataclass(frozen=True)
class DataPoint:
    source: str
    what: str
    use: str
    check: Callable[[], None]


# Each public measurement the per-all-reduce cost was set against, and how it is used.
CALIBRATION = (
    DataPoint(
        "docs/field-notes.md, 1 (the tracker's reported case)",
        "Qwen2-7B class on 2x RTX 4090, PHB, no P2P: 3.2 tok/s at TP 2, 12 at TP 1",
        "direction: TP 2 predicted slower than TP 1 (needs > ~150 us per all-reduce; the "
        "3.75x ratio alone would mean ~1 ms, which the 70B point rules out)",
        _field_report,
    ),
    DataPoint(
        "runlocalai.co/stacks/dual-4090-workstation",
        "70B at 4 bits, vLLM TP 2 over PCIe on 2x RTX 4090: ~28-35 tok/s decode",
        "magnitude: within 2x of 28 tok/s (the model gives ~18; 1 ms would give ~6)",
        _seventy_b,
    ),
    DataPoint(
        "haohervchb/sglang-V100#2 (measured inside a CUDA graph)",
        "NCCL all-reduce over PCIe P2P (PXB, 4 GPUs): 19.4 us at 4 KB, 20.3 at 8, 22.3 at 16",
        "the P2P PCIe latencies (PIX/PXB) stay within 2x of ~20 us",
        _p2p_in_a_graph,
    ),
    DataPoint(
        "noonghunna/club-3090#356 (maintainer's analysis of 2x RTX 3090, PHB, no P2P)",
        "NCCL_P2P_DISABLE=1 stages every all-reduce through host memory, roughly 2x the "
        "latency of the patched-P2P path; 50/60 tok/s against 66-71/89-92 with P2P",
        "the host-memory path costs at least 2x the PCIe P2P path",
        _host_path_twice_p2p,
    ),
    DataPoint(
        "vllm-project/vllm#2442 (4x V100 over PCIe, V0 eager mode, nvprof)",
        "ncclKernel_AllReduce_RING_LL 614-1110 us per call (average 862) without CUDA graphs",
        "an upper bound: with CUDA graphs the host-memory figure stays below 614 us",
        _below_eager,
    ),
)


@pytest.mark.parametrize("point", CALIBRATION, ids=[d.source.split(" (")[0] for d in CALIBRATION])
def test_calibration_point(point: DataPoint) -> None:
    assert point.what and point.use
    point.check()


def test_the_tuner_picks_one_gpu_per_replica_for_the_reported_case() -> None:
    p = as_plan(plan(model(QWEN), gpus("RTX-4090", 2, "phb")))
    assert p.tensor_parallel_size == 1
    assert p.replicas_per_node == 2
    assert not any("slower than one GPU" in n for n in p.notes)


def test_pinning_tp2_there_warns_with_both_figures() -> None:
    p = _decode(QWEN, "RTX-4090", 2)
    assert arg(p, "tensor-parallel-size") == "2"
    (note,) = [n for n in p.notes if "slower than one GPU per replica" in n]
    assert "~51.3 vs ~60.2 tokens/s" in note
    assert "host memory (no peer-to-peer)" in note
    assert "docs/field-notes.md, 1" in note


def test_a_gpu_count_of_two_in_the_spec_warns_too() -> None:
    p = as_plan(plan(model(QWEN), gpus("RTX-4090", 2, "phb"), gpu_count=2))
    assert p.tensor_parallel_size == 2
    assert any("slower than one GPU per replica" in n for n in p.notes)


@pytest.mark.parametrize(
    ("product", "interconnect"),
    [("A100-80GB", None), ("H100-80GB", "nvlink"), ("RTX-A6000", "phb"), ("L40S", "pix")],
    ids=["A100 NVLink", "H100 NVLink", "A6000 PCIe with P2P", "L40S PCIe switch"],
)
def test_nvlink_and_p2p_pcie_do_not_warn(product: str, interconnect: str | None) -> None:
    p = _decode("Llama-2-7B", product, 2, interconnect)
    assert not any("slower than one GPU" in n for n in p.notes)


def test_a_model_that_needs_two_gpus_gets_no_slower_note() -> None:
    p = as_plan(plan(model("Llama-2-13B"), gpus("RTX-4090", 2, "phb")))
    assert p.tensor_parallel_size == 2
    assert not any("slower than one GPU" in n for n in p.notes)
