"""Predicted speed: decode tokens per second, time to first token, load time.

**Decode.** Generating one token of one sequence reads every active weight once and that
sequence's KV cache once; at small batch the GPU does little else, so the step time is
those bytes over the memory bandwidth (the roofline; Williams et al., 2009, applied to
LLM decode in e.g. "LLM Inference Unveiled", Yuan et al., 2024). Kernels reach ~85 % of the
datasheet bandwidth; a measured device-copy bandwidth (GPUNode probe) is already what
streaming achieves, so it is used at ~95 %. Under tensor parallelism each GPU reads its
share in parallel, but every layer adds two all-reduces whose latency is the link's:
microseconds on NVLink, tens over PCIe with peer-to-peer, and a fifth of a millisecond
through host memory when the boards cannot do peer-to-peer (GeForce; see
:data:`NO_P2P_ALL_REDUCE_SECONDS`). The result is an upper bound for one sequence.

**Prefill and TTFT.** With chunked prefill vLLM schedules every running sequence's decode
token first and fills the rest of ``--max-num-batched-tokens`` with prompt tokens, oldest
request first; a prompt of ``L`` tokens beside ``D`` decodes therefore takes
``ceil(L / (B - D))`` engine steps. One step costs, for its GEMMs and for its attention
each, the larger of compute and memory traffic: ``2 x active parameters x tokens`` against
the weights' read, and ``4 x layers x heads x head_dim`` per token and attended position
(Kaplan et al., 2020, eq. 2.2) against the KV cache's read, compute at
:data:`PREFILL_EFFICIENCY` of the datasheet dense tensor FLOP/s; plus two all-reduces per
layer of the step's activations (latency plus bytes over the link). The GEMMs and the
attention are separate kernels, so a step is the sum of their two rooflines.

The TTFT P99 is the p99 prompt's own steps plus the p99 wait behind other prompts: an
M/M/1 queue whose service ``s`` is the mean prompt's prefill and whose load ``rho`` comes
from a closed loop of the declared peak concurrency of the replica, each request waiting,
prefilling, then decoding its mean output at the batch's decode step (Little's law; the
loop slows its own arrivals, so ``rho < 1``); its p99 wait is ``s / (1 - rho) x ln(100
rho)`` (Kleinrock, 1975, M/M/1 waiting time). Without a declared peak concurrency there is
no queueing term (the arrival rate is unknown) and the batch is taken as full. The p99
prompt is the declared distribution's 99th percentile
(:func:`vllm_operator.models.lengths.quantile`).

**Load.** Weights are read from storage once (all GPUs of a replica share it) and copied
to each GPU over PCIe; the two overlap, so the slower of the two bounds the time.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Final

from vllm_operator.models.gpu_node import LinkKind
from vllm_operator.tuning.architecture import Architecture

__all__ = [
    "DecodeEstimate",
    "LoadEstimate",
    "Replica",
    "TtftEstimate",
    "all_reduce_seconds",
    "batched_tokens_for_ttft",
    "decode_rate",
    "graph_tokens",
    "load_time",
    "ttft_p99",
]

SPEC_EFFICIENCY: Final = 0.85
MEASURED_EFFICIENCY: Final = 0.95

# One all-reduce of a decode step's hidden state (a few KiB): latency, not bandwidth.
# NVLink with vLLM's custom all-reduce: ~5-10 us; NCCL over PCIe P2P inside a CUDA graph:
# ~20 us for 4-16 KiB (4 V100 behind a PLX switch, haohervchb/sglang-V100#2), more through
# the host bridge.
ALL_REDUCE_SECONDS: Final[dict[str, float]] = {
    "NVLink": 8e-6,
    "PIX": 25e-6,
    "PXB": 30e-6,
    "PHB": 40e-6,
    "NODE": 50e-6,
    "SYS": 70e-6,
}
# Boards without PCIe peer-to-peer (GeForce, driver-disabled): vLLM's custom all-reduce is
# off (it needs P2P), the plan sets NCCL_P2P_DISABLE=1, and NCCL stages every all-reduce
# through pinned host memory (its SHM transport: the GPUs write to and poll host buffers
# across PCIe); CUDA graphs stay on. The figure is an effective cost per all-reduce seen in
# end-to-end decode, not a microbenchmark: each all-reduce is also a barrier at which the
# two GPUs' skew is paid. Calibrated (tests/tuning/test_performance_calibration.py) between
# the field report (docs/field-notes.md, 1: a 7B at TP 2 slower than at TP 1 on 2x RTX 4090,
# PHB, which needs > ~150 us; its 3.75x ratio alone would mean ~1 ms) and 70B-class TP 2 on
# the same boards at 28-35 tok/s (runlocalai.co's dual-4090 stack, which caps it near
# ~80 us); 200 us keeps the 7B slower at TP 2 and the 70B within 2x of that report.
NO_P2P_ALL_REDUCE_SECONDS: Final = 200e-6
# Bus rates for the bandwidth term of large all-reduces (prefill chunks): NVLink as NCCL's
# all-reduce bus bandwidth on A100-class links (~200 GB/s), PCIe 4.0 x16 peer-to-peer
# ~20 GB/s, and half of that through host memory (every byte crosses PCIe twice).
NVLINK_BYTES_PER_SECOND: Final = 200e9
PCIE_P2P_BYTES_PER_SECOND: Final = 20e9
HOST_PATH_BYTES_PER_SECOND: Final = 10e9

# Share of the datasheet dense tensor FLOP/s that prefill GEMMs reach in vLLM: large
# chunks (>= 512 tokens) are compute-bound (Agrawal et al., "Sarathi-Serve", OSDI 2024) and
# run at roughly half to 60 % of peak; the lower end is taken.
PREFILL_EFFICIENCY: Final = 0.5
# What eager mode (--enforce-eager) costs a step that CUDA graphs would have replayed: the
# launch gaps of the layer's kernels, paid per layer on every GPU. An assumption, not a
# measurement: 30 us per layer puts a 32-layer 8B model on an H100 ~18 % slower at batch 1
# (~1 ms on a ~5.3 ms step), inside the 15-22 % steady-state cost reported for eager mode
# (docs/field-notes.md, 5); the measured run (InferenceTuning) tests it per shape. Steps
# longer than vLLM's largest captured size run without graphs in both modes, and their
# kernels are long enough to hide the launches, so they pay nothing extra.
EAGER_LAUNCH_SECONDS_PER_LAYER: Final = 30e-6
# vLLM's largest CUDA-graph capture size by default: min(2 x max-num-seqs, 512) tokens.
MAX_GRAPH_TOKENS: Final = 512
# Candidate --max-num-batched-tokens values tried for a TTFT objective (then one step).
BATCHED_TOKENS_STEPS: Final = (2048, 4096, 8192, 16384, 32768, 65536)

# Storage read rate assumed for weights: a local NVMe or the page cache. Network volumes
# and Hub downloads are slower; the reason line says so.
STORAGE_BYTES_PER_SECOND: Final = 2e9
# Host-to-device copy: ~80 % of the PCIe x16 link rate per generation.
PCIE_BYTES_PER_SECOND: Final[dict[int, float]] = {3: 12.6e9, 4: 25.2e9, 5: 50.4e9}


def all_reduce_seconds(
    link: LinkKind | None, *, peer_to_peer: bool, tensor_parallel: int, message_bytes: int = 0
) -> float:
    """One all-reduce of ``message_bytes`` over ``tensor_parallel`` GPUs joined by ``link``:
    the link's latency plus a ring's ``2 (t - 1) / t`` of the bytes over its bus rate."""
    if tensor_parallel <= 1 or link is None:
        return 0.0
    latency = ALL_REDUCE_SECONDS[link]
    if link == "NVLink":
        rate = NVLINK_BYTES_PER_SECOND
    elif peer_to_peer:
        rate = PCIE_P2P_BYTES_PER_SECOND
    else:
        latency, rate = max(latency, NO_P2P_ALL_REDUCE_SECONDS), HOST_PATH_BYTES_PER_SECOND
    share = 2 * (tensor_parallel - 1) / tensor_parallel
    return latency + message_bytes * share / rate


def _active_weight_bytes(arch: Architecture, weights_bytes: int) -> float:
    """The bytes one decode token reads: active weights, less the input embedding table."""
    active = weights_bytes * arch.active_parameter_count / max(1, arch.parameter_count)
    if not arch.tie_word_embeddings:
        # The input embedding is a lookup of one row, not a read of the table.
        active -= (
            weights_bytes * (arch.vocab_size * arch.hidden_size) / max(1, arch.parameter_count)
        )
    return active


@dataclasses.dataclass(frozen=True)
class DecodeEstimate:
    tokens_per_second: float
    step_seconds: float
    bytes_per_gpu: int
    communication_seconds: float


def decode_rate(
    arch: Architecture,
    *,
    weights_bytes: int,
    kv_bytes_per_token_gpu: int,
    context_tokens: int,
    bandwidth_bytes_per_second: float,
    measured: bool,
    tensor_parallel: int,
    link: LinkKind | None,
    peer_to_peer: bool,
) -> DecodeEstimate:
    """Tokens per second for one sequence of ``context_tokens`` (see the module docstring)."""
    tp = max(1, tensor_parallel)
    active = _active_weight_bytes(arch, weights_bytes)
    per_gpu = int(active / tp) + kv_bytes_per_token_gpu * context_tokens
    efficiency = MEASURED_EFFICIENCY if measured else SPEC_EFFICIENCY
    memory_seconds = per_gpu / (bandwidth_bytes_per_second * efficiency)
    # A decode step's all-reduce carries one hidden state (a few KiB): latency only.
    comm = (
        2
        * arch.num_layers
        * all_reduce_seconds(link, peer_to_peer=peer_to_peer, tensor_parallel=tp)
    )
    step = memory_seconds + comm
    return DecodeEstimate(1 / step, step, per_gpu, comm)


@dataclasses.dataclass(frozen=True)
class Replica:
    """One replica as the step model sees it (see **Prefill and TTFT** above)."""

    arch: Architecture
    weights_bytes: int
    kv_bytes_per_token_gpu: int
    bandwidth_bytes_per_second: float
    measured: bool
    flops_per_second: float  # one GPU's datasheet dense tensor FLOP/s
    tensor_parallel: int
    link: LinkKind | None
    peer_to_peer: bool
    activation_bytes: int = 2
    # --enforce-eager: steps of up to graph_tokens tokens pay the kernel launches that CUDA
    # graphs save (EAGER_LAUNCH_SECONDS_PER_LAYER).
    eager: bool = False
    graph_tokens: int = MAX_GRAPH_TOKENS
    # The share of the bandwidth decode achieves, when a measurement of this model on this
    # shape says (None: MEASURED_EFFICIENCY or SPEC_EFFICIENCY, as ``measured`` says).
    efficiency: float | None = None

    def achieved_bandwidth(self) -> float:
        """The bytes per second a decode step's reads run at."""
        share = self.efficiency
        if share is None:
            share = MEASURED_EFFICIENCY if self.measured else SPEC_EFFICIENCY
        return self.bandwidth_bytes_per_second * share

    def step_seconds(
        self, prefill_tokens: int, *, prefix: int = 0, decodes: int = 0, context: int = 0
    ) -> float:
        """One engine step: ``prefill_tokens`` prompt tokens after ``prefix`` already
        prefilled ones, beside ``decodes`` decode tokens of ``context`` tokens each."""
        arch, tp = self.arch, max(1, self.tensor_parallel)
        tokens = prefill_tokens + decodes
        flops = tp * self.flops_per_second * PREFILL_EFFICIENCY
        rate = self.achieved_bandwidth()
        # The GEMMs: 2 FLOPs per active weight per token (the output head only for the
        # sampled positions, one per sequence; the input embedding is a lookup), or the
        # weights' read, whichever is longer.
        linear = arch.active_parameter_count - arch.embedding_parameters
        head = arch.vocab_size * arch.hidden_size
        weights = _active_weight_bytes(arch, self.weights_bytes)
        if arch.is_moe and tokens > 1:
            weights = float(self.weights_bytes)  # many tokens reach every expert
        gemm = max((2 * linear * tokens + 2 * head * (decodes + 1)) / flops, weights / tp / rate)
        # Attention, separate kernels: QK and PV over every attended position, or the KV
        # cache's read (the decodes' contexts and the prompt's prefix), whichever is longer.
        per_position = 4 * arch.num_layers * arch.num_attention_heads * arch.head_dim
        attended = prefill_tokens * (prefix + prefill_tokens / 2) + decodes * context
        kv = self.kv_bytes_per_token_gpu * (decodes * context + prefill_tokens + prefix)
        attention = max(per_position * attended / flops, kv / rate)
        message = tokens * arch.hidden_size * self.activation_bytes
        comm = (
            2
            * arch.num_layers
            * all_reduce_seconds(
                self.link,
                peer_to_peer=self.peer_to_peer,
                tensor_parallel=tp,
                message_bytes=message,
            )
        )
        launches = 0.0
        if self.eager and tokens <= self.graph_tokens:
            launches = arch.num_layers * EAGER_LAUNCH_SECONDS_PER_LAYER
        return gemm + attention + comm + launches

    def prefill_seconds(self, prompt: int, *, chunk: int, decodes: int, context: int) -> float:
        """The engine steps that prefill a ``prompt``-token prompt in chunks of ``chunk``."""
        total, done = 0.0, 0
        while done < prompt:
            tokens = min(chunk, prompt - done)
            total += self.step_seconds(tokens, prefix=done, decodes=decodes, context=context)
            done += tokens
        return total


@dataclasses.dataclass(frozen=True)
class TtftEstimate:
    seconds: float  # math.inf when no prompt token fits beside the decodes
    prefill_seconds: float  # the p99 prompt's own steps
    queue_seconds: float  # its p99 wait behind other prompts
    steps: int
    chunk_tokens: int  # prompt tokens per step beside the decodes
    batched_tokens: int
    load: float | None  # the share of the replica's time spent prefilling; None: not modelled

    @property
    def milliseconds(self) -> float:
        return self.seconds * 1000


def ttft_p99(
    r: Replica,
    *,
    prompt_p99: int,
    prompt_mean: float,
    output_mean: float,
    batched_tokens: int,
    decodes: int,
    context: int,
    concurrency: int | None,
) -> TtftEstimate:
    """TTFT P99 at ``--max-num-batched-tokens batched_tokens`` (the module docstring)."""
    chunk = batched_tokens - decodes
    if chunk <= 0:
        return TtftEstimate(math.inf, math.inf, 0.0, 0, 0, batched_tokens, None)
    own = r.prefill_seconds(prompt_p99, chunk=chunk, decodes=decodes, context=context)
    steps = math.ceil(prompt_p99 / chunk)
    queue, load = 0.0, None
    if concurrency is not None and concurrency > 1:
        mean = max(1, round(prompt_mean))
        # The prompt work itself: the decodes beside it are counted in the request's
        # duration, not twice.
        service = r.prefill_seconds(mean, chunk=chunk, decodes=0, context=context)
        decode_step = r.step_seconds(0, decodes=max(1, decodes), context=context)
        load = _prefill_load(concurrency, service, output_mean * decode_step)
        if load > 0.01:
            queue = service / (1 - load) * math.log(100 * load)
    return TtftEstimate(own + queue, own, queue, steps, chunk, batched_tokens, load)


def graph_tokens(max_num_seqs: int) -> int:
    """The largest step vLLM captures as a CUDA graph by default."""
    return min(2 * max(1, max_num_seqs), MAX_GRAPH_TOKENS)


def _prefill_load(concurrency: int, service: float, decoding: float) -> float:
    """The share of the replica's time its prompts take, ``rho``, in a closed loop of
    ``concurrency`` requests that each wait (M/M/1 mean ``s / (1 - rho)``), prefill for
    ``service`` and then decode for ``decoding`` seconds: the root of
    ``rho = concurrency x service / (service / (1 - rho) + decoding)`` (below 1: a closed
    loop slows its own arrivals)."""
    low, high = 0.0, 1.0
    for _ in range(60):
        rho = (low + high) / 2
        arrivals = concurrency / (service / (1 - rho) + decoding)
        low, high = (rho, high) if arrivals * service > rho else (low, rho)
    return low


def batched_tokens_for_ttft(
    r: Replica,
    target_seconds: float,
    *,
    start: int,
    prompt_p99: int,
    prompt_mean: float,
    output_mean: float,
    decodes: int,
    context: int,
    concurrency: int | None,
) -> list[TtftEstimate]:
    """TTFT estimates at ``start`` and each larger candidate budget, up to the one that
    prefills the p99 prompt in one step, stopping at the first that meets the target."""
    one_step = math.ceil((prompt_p99 + decodes) / 256) * 256
    values = sorted({start, *(v for v in BATCHED_TOKENS_STEPS if start < v < one_step)})
    if one_step > start:
        values.append(one_step)
    found: list[TtftEstimate] = []
    for value in values:
        estimate = ttft_p99(
            r,
            prompt_p99=prompt_p99,
            prompt_mean=prompt_mean,
            output_mean=output_mean,
            batched_tokens=value,
            decodes=decodes,
            context=context,
            concurrency=concurrency,
        )
        found.append(estimate)
        if estimate.seconds <= target_seconds:
            break
    return found


@dataclasses.dataclass(frozen=True)
class LoadEstimate:
    seconds: float
    storage_seconds: float
    copy_seconds: float


def load_time(
    *,
    weights_bytes: int,
    tensor_parallel: int,
    pcie_generation: int | None,
    host_to_device_bytes_per_second: float | None,
) -> LoadEstimate:
    """Seconds to bring one replica's weights from storage onto its GPUs."""
    storage = weights_bytes / STORAGE_BYTES_PER_SECOND
    rate = host_to_device_bytes_per_second or PCIE_BYTES_PER_SECOND.get(
        pcie_generation or 4, PCIE_BYTES_PER_SECOND[4]
    )
    copy = weights_bytes / max(1, tensor_parallel) / rate
    return LoadEstimate(max(storage, copy), storage, copy)
