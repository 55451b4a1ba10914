"""How each line of vLLM releases splits a GPU's memory budget (docs/memory-model.md):
what vLLM's own source decides release by release (the sampler warm-up's copies, the MoE
workspace, whether the CUDA-graph estimate comes out of the KV budget) and the constants
fitted to the calibration points of ``tests/tuning/data/vllm_startup_logs.yaml``.

Knowledge of releases, so it lives beside their arguments and /metrics names
(``releases/``, below the pure layers); ``tuning/memory.py`` applies it to a model and a
GPU.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from vllm_operator.releases.version import TESTED_VERSION, Version

GIB: Final = 1024**3
MIB: Final = 1024**2


# --- the release lines ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ReleaseMemoryModel:
    """How one line of vLLM releases splits its budget (docs/memory-model.md).

    The split itself is the same from 0.10 on (``vllm/v1/worker/gpu_worker.py``,
    ``determine_available_memory``): KV cache = ``ceil(utilization x CUDA total)`` (``v1/
    worker/utils.py``, ``request_memory``) - weights - the torch peak increase of the profile
    run (activations) - the non-torch increase since the worker started - the CUDA-graph
    estimate where the release deducts it. What differs by line is below; each figure says
    where it comes from (a release's source, or the calibration points of
    ``tests/tuning/data/vllm_startup_logs.yaml`` it is fitted to).
    """

    first: Version  # the first release of the line
    # The sampler warm-up (gpu_model_runner.py, _dummy_sampler_run): top-k/top-p over the
    # fp32 logits of min(max_num_seqs, max_num_batched_tokens) requests. Its peak, in copies
    # of those logits (the logits, probabilities, the noise of the exponential race, and
    # the sort's values and int64 indices before the Triton kernel):
    sampler_logit_copies: float
    # The fused-MoE intermediate caches live in the workspace manager from 0.13
    # (fused_moe/*: current_workspace_manager), so they stay allocated and add to the peak;
    # before, they were freed per call and only the larger of forward and sampler counts.
    moe_workspace_persistent: bool
    moe_chunk_tokens: int  # VLLM_FUSED_MOE_CHUNK_SIZE (envs.py): 32768, 16 x 1024 from 0.13
    non_torch_single_gpu: int  # cuBLAS/cuDNN workspaces, one GPU (fitted, see below)
    # The CUDA-graph estimate (profile_cudagraph_memory, 0.18+) comes out of the KV budget:
    # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1 from 0.20.0 (envs.py; its log
    # line says "default since v0.21.0"). Before, graphs are captured after the KV cache is
    # allocated, from the memory outside the budget.
    graphs_in_budget: bool
    # Whether the estimate is there for dense models too. Model Runner V2, vLLM's default
    # for dense models from 0.25.1 (vllm-project/vllm#44443), implements
    # profile_cudagraph_memory as a stub that returns 0 (vllm-project/vllm#49224; the fix,
    # #49233, was closed unmerged): the KV cache takes the whole budget and the graphs are
    # captured afterwards, outside it, as before 0.20. MoE models stay on the legacy
    # runner, which deducts its estimate.
    dense_graph_estimate: bool
    source: str

    def deducts_graphs(self, *, moe: bool) -> bool:
        """Whether this line takes the CUDA-graph estimate out of the KV budget; where it
        does not, vLLM captures the graphs afterwards, outside the budget."""
        return self.graphs_in_budget and (moe or self.dense_graph_estimate)

    def graphs_outside_why(self) -> str:
        """Why a plan of this line captures its graphs outside the budget (for the reasons)."""
        if not self.graphs_in_budget:
            return "releases before 0.20 do not profile them"
        return (
            "Model Runner V2, the runner of dense models from 0.25.1, estimates them as 0: "
            "vllm-project/vllm#49224"
        )


# Fitted to the calibration points (ids of tests/tuning/data/vllm_startup_logs.yaml):
# sampler copies 9.5 before 0.17 from llmd-sweep-v0.15.0/v0.16.0-qwen3-14b (5.64 GiB) and
# pr21429-qwen3-235b (5.62 GiB, 0.10 development); 3.7 from 0.17 from the 15 single-stage
# llmd-v0.19.0-* points and llmd-sweep-v0.17.0/v0.18.0 (2.23 GiB): least squares, within
# 0.12 GiB of every point. 0.17 is where v1/sample/ops/topk_topp_triton.py replaced the
# PyTorch sort for batches of 8 or more.
SAMPLER_COPIES_SORT: Final = 9.5
SAMPLER_COPIES_TRITON: Final = 3.7
# The hidden states of the profile batch, kept while the sampler runs (and the residual
# beside them): 1.5 copies of max_num_batched_tokens x hidden, fitted with the above.
HIDDEN_COPIES: Final = 1.5
# Non-torch memory on one GPU: 0.13 GiB in llmd-sweep-v0.15.0..v0.17.0, 0.25 GiB from
# llmd-sweep-v0.18.0 and the llmd-v0.19.0 TP 1 points (0.24-0.27).
NON_TORCH_SINGLE_OLD: Final = int(0.13 * GIB)
NON_TORCH_SINGLE: Final = int(0.25 * GIB)
# Under tensor parallelism over NVLink, NCCL's NVLink-SHARP and the all-reduce buffers add
# about 1.8 GiB per GPU: 2.06-2.11 GiB at TP 2 and 2.13-2.21 at TP 4 in llmd-v0.19.0-*,
# 2.04 at TP 4 in pr21429 (0.10): 2.0 GiB + 0.04 GiB per GPU of the group.
NON_TORCH_NVLINK_BASE: Final = int(2.0 * GIB)
NON_TORCH_NVLINK_PER_GPU: Final = int(0.04 * GIB)
# Over PCIe (no NVLS, and GeForce boards have no peer-to-peer for the custom all-reduce)
# NCCL's channel buffers are small: 0.25 GiB per rank at TP 2 on RTX 4090s
# (issue13061-r1-distill-qwen-14b-2x4090-tp2, a V0 log; no V1 log shows it). Assumed the
# single-GPU figure plus this.
NON_TORCH_PCIE_TP: Final = 64 * MIB
# Pipeline parallelism without TP: 0.07 GiB on the rank llmd-v0.19.0-llama-3.1-8b-*-pp2
# shows; the tuner keeps the single-GPU figure (the last stage binds the KV size).
# CUDA-graph estimate (profile_cudagraph_memory: the first capture plus (n - 1) x the
# second's): 0.30 GiB + 0.018 GiB per layer of the stage at vLLM's capture sizes up to 512,
# least squares over the 16 llmd-v0.19.0-* estimates (0.54-1.92 GiB; the estimate itself
# scatters by 2x at fixed shape: Llama-3.1-8B 0.84 / 1.69 / 0.57 at TP 1 / 2 / 4). The
# per-layer part scales with the number of capture sizes (max 2 x max_num_seqs, at most
# 512: config/compilation.py).
GRAPH_FIRST_CAPTURE: Final = int(0.30 * GIB)
GRAPH_PER_LAYER: Final = int(0.018 * GIB)
GRAPH_MAX_CAPTURE: Final = 512

RELEASE_LINES: Final[tuple[ReleaseMemoryModel, ...]] = (
    ReleaseMemoryModel(
        Version(0, 10, 0),
        SAMPLER_COPIES_SORT,
        moe_workspace_persistent=False,
        moe_chunk_tokens=32768,
        non_torch_single_gpu=NON_TORCH_SINGLE_OLD,
        graphs_in_budget=False,
        dense_graph_estimate=True,
        source="0.10.0 sdist; pr21429 (0.10 development)",
    ),
    ReleaseMemoryModel(
        Version(0, 13, 0),
        SAMPLER_COPIES_SORT,
        moe_workspace_persistent=True,
        moe_chunk_tokens=16 * 1024,
        non_torch_single_gpu=NON_TORCH_SINGLE_OLD,
        graphs_in_budget=False,
        dense_graph_estimate=True,
        source="0.13.0 sdist (fused-MoE workspace manager); llmd-sweep-v0.15.0/v0.16.0; "
        "finetuning-llama-...-rtx6000ada-v0.15.1 (not fitted to)",
    ),
    ReleaseMemoryModel(
        Version(0, 17, 0),
        SAMPLER_COPIES_TRITON,
        moe_workspace_persistent=True,
        moe_chunk_tokens=16 * 1024,
        non_torch_single_gpu=NON_TORCH_SINGLE_OLD,
        graphs_in_budget=False,
        dense_graph_estimate=True,
        source="0.17.0 sdist (Triton top-k/top-p); llmd-sweep-v0.17.0",
    ),
    ReleaseMemoryModel(
        Version(0, 18, 0),
        SAMPLER_COPIES_TRITON,
        moe_workspace_persistent=True,
        moe_chunk_tokens=16 * 1024,
        non_torch_single_gpu=NON_TORCH_SINGLE,
        graphs_in_budget=False,
        dense_graph_estimate=True,
        source="llmd-sweep-v0.18.0; llmd-v0.19.0-* (17 logs)",
    ),
    ReleaseMemoryModel(
        Version(0, 20, 0),
        SAMPLER_COPIES_TRITON,
        moe_workspace_persistent=True,
        moe_chunk_tokens=16 * 1024,
        non_torch_single_gpu=NON_TORCH_SINGLE,
        graphs_in_budget=True,
        dense_graph_estimate=True,
        source="0.20.0 sdist (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1); no complete "
        "log after 0.19: the rest as 0.19",
    ),
    ReleaseMemoryModel(
        Version(0, 25, 1),
        SAMPLER_COPIES_TRITON,
        moe_workspace_persistent=True,
        moe_chunk_tokens=16 * 1024,
        non_torch_single_gpu=NON_TORCH_SINGLE,
        graphs_in_budget=True,
        dense_graph_estimate=False,
        source="vllm-project/vllm#44443 (Model Runner V2 the default for dense models) and "
        "#49224 (its graph estimate is 0); coldstart-recon-qwen3-4b-* (RTX 4090, 0.27.1: "
        "budget = weights + non-torch + activation + KV, 1.28 GiB of graphs outside); "
        "issue50159 (0.26.0: 0.10 GiB reserved under MRv2 against 0.20 under MRv1)",
    ),
)


def memory_model(version: Version = TESTED_VERSION) -> ReleaseMemoryModel:
    """The line ``version`` belongs to (the oldest line for anything before 0.10)."""
    chosen = RELEASE_LINES[0]
    for line in RELEASE_LINES:
        if version >= line.first:
            chosen = line
    return chosen
