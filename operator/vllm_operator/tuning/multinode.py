"""Plans across nodes: a model no single node holds, served as one vLLM over several.

Only when no single-node plan fits (:func:`~vllm_operator.tuning.plan.plan_service` asks
here last): a group of nodes costs a network hop in every decode step, restarts as one
(one member lost is the whole instance lost), and needs LeaderWorkerSet in the cluster.

The layout, each part with its reason in the plan:

- **Tensor parallel within a node, never across**: a TP all-reduce runs twice per layer
  per token; over NVLink it costs ~10 us, over even an InfiniBand NIC it would cost a
  network round trip 2 x layers times per token. TP is the node's GPU count (the largest
  that divides the heads and the MLP width), so a group fills whole nodes.
- **Pipeline parallel across nodes**: one stage per node, so what crosses the network is
  one hidden state per token per stage boundary (32 KiB at hidden size 16,384 in bf16),
  not an all-reduce per layer. vLLM's multi-node documentation gives the same layout
  (tensor-parallel-size = GPUs per node, pipeline-parallel-size = nodes). The node count
  is the smallest that holds the weights plus the KV cache for one typical request, then
  one more when that would not hold the workload's KV demand (up to ``MAX_NODES``).
- **Not data/expert parallel for MoE, yet**: vLLM 0.32 runs MoE models across nodes with
  ``--data-parallel-size`` and ``--enable-expert-parallel`` (attention replicated per DP
  rank, experts spread), which pays off only with its all-to-all kernels (DeepEP, pplx) over
  InfiniBand/RoCE with GPUDirect RDMA; the memory model here does not yet split dense and
  expert weights that way, and PP is correct on every network. A plan for an MoE model
  over an RDMA network says so in a note.
- **vLLM's own multi-node launch, not Ray**: from 0.12 on, ``--nnodes N --node-rank R
  --master-addr LEADER`` with ``--distributed-executor-backend mp`` starts one process per
  GPU on each node and connects them through torch.distributed; workers run ``--headless``
  (no API server). The serving image needs no Ray cluster, and a member's failure ends
  the whole instance, which LeaderWorkerSet then recreates as a group. The per-pod flags
  (rank, leader address) are rendered by render/lws.py; the plan holds ``--nnodes``.

**Decode with a pipeline** (:func:`decode_across_nodes`): one sequence passes the stages
one after the other, so a token takes every stage's weight and KV read (each stage reads
1/pp of the weights on tp GPUs) plus one network hop per boundary: ``pp x stage + (pp - 1)
x hop``. That is the bubble: for one sequence, every stage but one idles at any time; the
rate of one sequence is no better than one node's would be, and the pipeline fills only
with at least ``pp`` sequences in flight (the aggregate rate then approaches ``pp`` times
that of one stage).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from vllm_operator.constants import NODE_LABEL_RACK, NODE_LABEL_ZONE
from vllm_operator.tuning.candidate import Candidate, GpuChoices, candidate, fits, valid_tp
from vllm_operator.tuning.choose import Choice
from vllm_operator.tuning.memory import kv_bytes_per_token
from vllm_operator.tuning.network import Network, network_from_labels
from vllm_operator.tuning.performance import (
    MEASURED_EFFICIENCY,
    SPEC_EFFICIENCY,
    DecodeEstimate,
    _active_weight_bytes,
    all_reduce_seconds,
)
from vllm_operator.tuning.request import Ask, Context
from vllm_operator.tuning.units import gib

__all__ = [
    "MAX_NODES",
    "MIN_NNODES_VERSION",
    "choose_across_nodes",
    "decode_across_nodes",
    "placement_topology_key",
]

MAX_NODES: Final = 8
# The first vLLM release whose mp executor spans nodes (--nnodes, --node-rank, --headless).
MIN_NNODES_VERSION: Final = (0, 12, 0)
TOPOLOGY_KEYS: Final = (NODE_LABEL_RACK, NODE_LABEL_ZONE)


def network_of(g: GpuChoices) -> Network:
    return g.profile.network or network_from_labels({})


def _tp_within_node(ask: Ask, g: GpuChoices) -> int | None:
    arch = ask.model.architecture
    valid = [t for t in range(1, g.profile.count + 1) if valid_tp(arch, g.fmt, t) is None]
    return max(valid) if valid else None


def choose_across_nodes(
    ask: Ask, g: GpuChoices, ctx: Context, *, nodes_seen: int | None
) -> Choice | None:
    """TP within a node and one pipeline stage per node; None if no node count up to
    ``MAX_NODES`` holds the model (or the spec fixes the parallel layout itself)."""
    pins = ask.pins
    if pins.tensor_parallel_size is not None or pins.pipeline_parallel_size is not None:
        return None
    if ask.gpu_count != "auto":
        return None
    arch = ask.model.architecture
    tp = _tp_within_node(ask, g)
    if tp is None:
        return None
    need = max(1, min(ctx.typical, ctx.wanted))
    demand = max(ctx.wanted, g.seqs_target * ctx.typical)
    fitting: list[Candidate] = []
    for pp in range(2, min(MAX_NODES, arch.num_layers) + 1):
        c = candidate(ask, g, tp, pp, across_nodes=True)
        if c is None:
            return None
        if fits(c, arch, need):
            fitting.append(c)
            nxt = candidate(ask, g, tp, pp + 1, across_nodes=True) if pp < MAX_NODES else None
            if nxt is not None and pp + 1 <= arch.num_layers:
                fitting.append(nxt)
            break
    if not fitting:
        return None
    base = fitting[0]
    chosen = base
    gpu = g.profile
    per_node = gpu.count
    reason_pp = (
        f"{base.pp} nodes, one pipeline stage each: one node of {per_node} x {gpu.name} "
        f"({gib(per_node * gpu.memory_bytes)}) cannot hold the weights ({gib(base.weights)}) "
        f"with vLLM's reserve, activations and the KV cache of a {need:,}-token request; "
        f"{base.pp} is the fewest that can ({gib(base.weights / base.gpus_count)} of weights "
        "per GPU)"
    )
    notes: list[str] = []
    if base.kv_token_room(arch) < demand and len(fitting) > 1:
        more = fitting[1]
        if more.kv_token_room(arch) >= demand:
            chosen = more
            reason_pp = (
                f"{more.pp} nodes, one pipeline stage each: {base.pp} would hold the weights "
                f"({gib(base.weights)}) but only {base.kv_token_room(arch):,} KV tokens of "
                f"the {demand:,} the workload needs ({g.seqs_target} sequences x "
                f"{ctx.typical:,} tokens); {more.pp} holds {more.kv_token_room(arch):,}"
            )
    if chosen.kv_token_room(arch) < demand:
        notes.append(
            f"the KV cache holds {chosen.kv_token_room(arch):,} tokens, less than "
            f"{g.seqs_target} sequences x {ctx.typical:,} tokens = {demand:,}; max-num-seqs "
            "is bounded by it (more nodes per group would add KV cache, and a network hop "
            "per token)"
        )
    if nodes_seen is not None and nodes_seen < chosen.pp:
        notes.append(
            f"a group needs {chosen.pp} nodes of {gpu.describe()}; {nodes_seen} of that "
            "shape are schedulable now, so the group's pods stay Pending until the rest exist"
        )
    network = network_of(g)
    notes += [f"inter-node network: {a}" for a in network.assumed]
    if arch.is_moe and network.rdma and network.gpudirect_rdma:
        notes.append(
            "an MoE model on an RDMA network with GPUDirect: vLLM's data + expert parallel "
            "(--data-parallel-size, --enable-expert-parallel, DeepEP kernels) may decode "
            "faster than pipeline stages; not planned here (set it in spec.tuning.overrides "
            "after measuring)"
        )
    reason_tp = (
        f"tensor parallel within each node only ({tp} GPUs"
        + (f" on {chosen.link}" if chosen.link else "")
        + "): a TP all-reduce runs twice per layer per token, and across nodes each would "
        f"be a round trip over {network.describe()}"
    )
    return Choice(
        chosen,
        "Tuner",
        reason_tp,
        tuple(notes),
        nodes=chosen.pp,
        pipeline_reason=reason_pp,
    )


def decode_across_nodes(
    ask: Ask, g: GpuChoices, c: Candidate, context_tokens: int
) -> DecodeEstimate | None:
    """One sequence's decode rate through ``c.pp`` stages on as many nodes (the module
    docstring): every stage in turn, plus a hop per stage boundary."""
    bandwidth = g.profile.bandwidth_bytes_per_second
    if bandwidth is None:
        return None
    arch = ask.model.architecture
    tp, pp = max(1, c.tp), max(1, c.pp)
    active = _active_weight_bytes(arch, c.weights)
    kv = kv_bytes_per_token(
        arch, kv_dtype_bytes=c.kv_dtype_bytes, tensor_parallel=tp, pipeline_parallel=pp
    )
    stage_bytes = int(active / (tp * pp)) + kv * context_tokens
    efficiency = MEASURED_EFFICIENCY if g.profile.bandwidth_measured else SPEC_EFFICIENCY
    stage_memory = stage_bytes / (bandwidth * efficiency)
    stage_comm = (
        2
        * (arch.num_layers / pp)
        * all_reduce_seconds(c.link, peer_to_peer=g.profile.pcie_p2p, tensor_parallel=tp)
    )
    hop = network_of(g).hop_seconds(arch.hidden_size * c.dtype_bytes)
    step = pp * (stage_memory + stage_comm) + (pp - 1) * hop
    return DecodeEstimate(1 / step, step, stage_bytes * pp, pp * stage_comm + (pp - 1) * hop)


def placement_topology_key(nodes: Sequence[Mapping[str, str]]) -> str | None:
    """The label that keeps a group together (LWS exclusive topology): the finest of the
    rack and zone labels that every candidate node carries; None when none does."""
    if not nodes:
        return None
    for key in TOPOLOGY_KEYS:
        if all(labels.get(key) for labels in nodes):
            return key
    return None
