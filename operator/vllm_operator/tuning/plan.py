"""The planner: model + GPUs + workload + profile -> vLLM settings with reasons, or a verdict.

Planning one replica on one node's GPU set goes in this order, each step stating why:

1. **Context** (``--max-model-len``) from the workload's longest requests (prompt plus
   output, see :mod:`~vllm_operator.tuning.workload`), not the model's maximum: a 32k
   context for requests under 2k wastes KV blocks and cut throughput from 112 to 43 QPS in
   one deployment (docs/field-notes.md, 2). Without declared lengths, the model's maximum.
2. **Sequences** (``--max-num-seqs``) about 1.5x the peak concurrency one replica sees, not
   vLLM's 256: at 256 where 128 sufficed, P99 was 22 % worse. Bounded by how many typical
   requests the KV cache holds, so the scheduler does not admit work it must preempt.
3. **Tensor parallelism**: the smallest GPU count that holds the weights plus a KV cache
   for at least one typical request; then, only over NVLink, the smallest that also holds
   the workload's KV demand (headroom) or meets a TPOT objective. Never more GPUs over
   PCIe than the weights need: for a model that fits one GPU, TP across a host bridge ran
   at 3.2 tok/s where one GPU per replica gave 12 (docs/field-notes.md, 1), so extra GPUs become
   replicas instead. TP must divide the attention heads (and the KV heads, or be a
   multiple of them) and the MLP width. With SLO targets and a declared peak concurrency,
   :mod:`~vllm_operator.tuning.slo` then predicts every TP size x replica count at the
   peak and takes the cheapest that meets the targets (TP over PCIe included, charged its
   all-reduces), or keeps this choice and says what would meet them.
4. Memory utilization, dtype, the quantization kernel, KV dtype, batch budget, prefix
   caching, chunked prefill, CUDA graphs, the all-reduce path, pod resources.
5. **Predictions**: weights, KV bytes and tokens, concurrency at the chosen context, decode
   rate, load time.

When nothing fits, the result is a :class:`DoesNotFit` with a condition reason
(``WeightsDoNotFit``, ``ContextDoesNotFit``, ``InvalidParallelism``, ``NotEnoughGPUs``,
``NoMatchingGPUs``) and the options that would fit: never an exception, never a plan that
will OOM. When the model's shape is unknown, :class:`SpecOnly` carries only what the spec
says. :func:`plan_service` is the entry point for an InferenceService; :func:`plan` plans a
resolved model on one GPU profile (the CLI and the tests use it directly).

The steps live in their own modules: :mod:`~vllm_operator.tuning.request` (1, 2: the ask,
its context and sequence target), :mod:`~vllm_operator.tuning.candidate` (4 and the memory
of one tensor-parallel size), :mod:`~vllm_operator.tuning.choose` (3),
:mod:`~vllm_operator.tuning.verdicts` (what does not fit) and
:mod:`~vllm_operator.tuning.pod` (the pod's resources); this module puts them together,
bounds the sequences by the KV cache, writes the arguments and the predictions (5), and
ranks the plans of several GPU sets.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from vllm_operator.models import lengths
from vllm_operator.models.inference_service import (
    Dtype,
    InferenceServiceSpec,
    NodeSpec,
    PlannedPod,
    Predictions,
    TuningSpec,
)
from vllm_operator.models.workload import SLO, Workload
from vllm_operator.releases.arguments import arguments_for, quantization_spelling
from vllm_operator.releases.version import TESTED_VERSION, DeployedVersion, Version
from vllm_operator.tuning import catalog, multinode, slo
from vllm_operator.tuning.args import Setting, apply_overrides, read_overrides
from vllm_operator.tuning.candidate import Candidate, GpuChoices, decode_estimate, gpu_choices
from vllm_operator.tuning.choose import Choice, choose_tp, fixed_size
from vllm_operator.tuning.gpus import GPUProfile, match_product
from vllm_operator.tuning.learned import plan_learning
from vllm_operator.tuning.lora import (
    DeclaredAdapter,
    LoRAAsk,
    LoRAPlan,
    gpu_bytes_per_gpu,
    plan_lora,
    runtime_updating_env,
)
from vllm_operator.tuning.measurements import Measurements
from vllm_operator.tuning.memory import GIB, KVCacheCapacity
from vllm_operator.tuning.multinode import MIN_NNODES_VERSION, choose_across_nodes
from vllm_operator.tuning.network import Network, nccl_environment
from vllm_operator.tuning.performance import (
    MEASURED_EFFICIENCY,
    SPEC_EFFICIENCY,
    DecodeEstimate,
    load_time,
)
from vllm_operator.tuning.pod import pod_plan
from vllm_operator.tuning.release import for_release, release_problem
from vllm_operator.tuning.request import CONTEXT_ROUNDING, Ask, Context, context_of, resolve_model
from vllm_operator.tuning.results import (
    DoesNotFit,
    FitOption,
    ModelInput,
    Plan,
    SpecOnly,
    TuningResult,
)
from vllm_operator.tuning.slo import Measured, PlanInputs
from vllm_operator.tuning.units import gib
from vllm_operator.tuning.verdicts import fit_options
from vllm_operator.tuning.workload import length_stats

__all__ = ["PlanInputs", "ask_of", "plan", "plan_service", "spec_only"]


def _environment(g: GpuChoices, c: Candidate) -> list[Setting]:
    if c.gpus_count < 2 or c.link == "NVLink" or g.profile.pcie_p2p:
        return []
    return [
        Setting(
            "NCCL_P2P_DISABLE",
            "1",
            "Tuner",
            f"{g.profile.name} boards have no PCIe peer-to-peer, yet some drivers report it and "
            "NCCL then hangs on the first all-reduce (NVIDIA/nccl-tests#117, "
            "vllm-project/vllm#5484); NCCL goes through host memory instead",
        )
    ]


def _plan(
    ask: Ask, gpu: GPUProfile, *, available: int | None = None, measured: Measured | None = None
) -> Plan | DoesNotFit:
    g = gpu_choices(ask, gpu)
    ctx = context_of(ask)
    choice = choose_tp(ask, g, ctx)
    if isinstance(choice, DoesNotFit):
        return choice
    answered = slo.answer(
        ask,
        gpu,
        ctx,
        choice,
        tp_fixed=fixed_size(ask) is not None,
        available=available or gpu.count,
        measured=measured,
    )
    if answered is None:
        result = _build(ask, gpu, g, ctx, choice)
        if isinstance(result, Plan):
            notes = _unanswered(ask, g, choice)
            result = dataclasses.replace(
                result,
                notes=(*result.notes, *notes),
                inputs=PlanInputs(ask, ctx, measured),
            )
        return result
    result = _build(answered.ask, gpu, answered.g, ctx, answered.choice)
    if isinstance(result, DoesNotFit):
        return result
    return dataclasses.replace(
        result,
        slo=answered.answer,
        notes=(*answered.answer.lines, *result.notes),
        inputs=PlanInputs(answered.ask, ctx, measured),
    )


def _unanswered(ask: Ask, g: GpuChoices, choice: Choice) -> tuple[str, ...]:
    """Targets the SLO answer could not predict at a peak: say why, citing them."""
    targets = slo.Targets.of(ask.slo)
    if not targets.any():
        return ()
    cited = " and ".join(slo.cite(m, t) for m, t in targets.items())
    if choice.nodes > 1 or choice.candidate.pp > 1:
        return (f"{cited}: not predicted for a pipeline-parallel group",)
    if g.profile.bandwidth_bytes_per_second is None or g.profile.flops_per_second is None:
        return (
            f"{cited}: not predicted: {g.profile.name} has no bandwidth or FLOP/s figure in "
            "the GPU catalog",
        )
    if not ask.peak:
        return (
            f"{cited}: checked at batch 1 only; declare spec.workload.peakConcurrency "
            "(--peak-concurrency) to predict them at the peak and size the replicas",
        )
    return ()


def _plan_across_nodes(ask: Ask, gpu: GPUProfile, nodes_seen: int | None) -> Plan | None:
    """A group over several nodes of this profile (tuning/multinode.py), or None: only for
    nodes whose GPUs share NVLink (a PCIe workstation is offered quantization and larger
    GPUs instead) and a vLLM release that launches across nodes itself."""
    if gpu.model is None or not gpu.model.nvlink or gpu.count < 2:
        return None
    if gpu.links and gpu.worst_link(range(gpu.count)) != "NVLink":
        return None
    if ask.vllm_version < Version(*MIN_NNODES_VERSION):
        return None
    g = gpu_choices(ask, gpu)
    ctx = context_of(ask)
    choice = choose_across_nodes(ask, g, ctx, nodes_seen=nodes_seen)
    if choice is None:
        return None
    result = _build(ask, gpu, g, ctx, choice)
    return result if isinstance(result, Plan) else None


@dataclasses.dataclass(frozen=True)
class FinalContext:
    """The max-model-len in force, its reason, and notes (requests it will reject)."""

    tokens: int
    reason: str
    notes: tuple[str, ...] = ()


def final_context(ask: Ask, ctx: Context, c: Candidate) -> FinalContext | None:
    """The context the workload asks for, capped to what the KV cache holds; None if a
    pinned one cannot fit."""
    arch = ask.model.architecture
    room = c.kv_token_room(arch)
    if ctx.wanted <= room:
        return FinalContext(ctx.wanted, ctx.reason)
    if ctx.origin == "override":
        return None
    capped = room // CONTEXT_ROUNDING * CONTEXT_ROUNDING if room >= 2 * CONTEXT_ROUNDING else room
    capped = max(c.block_size, capped // c.block_size * c.block_size)
    reason = (
        f"{ctx.reason.split(':')[0]} capped to {capped:,}: the KV cache holds {room:,} tokens "
        "and vLLM refuses a context one sequence cannot fill"
    )
    notes: tuple[str, ...] = ()
    if ctx.origin == "workload":
        notes = (
            f"requests longer than {capped:,} tokens will be rejected (the workload's longest "
            f"is {ctx.wanted:,}); more GPUs or a shorter workload would avoid it",
        )
    return FinalContext(capped, reason, notes)


def context_verdict(
    ask: Ask, gpu: GPUProfile, g: GpuChoices, ctx: Context, c: Candidate
) -> FinalContext | DoesNotFit:
    """The context in force, or why a pinned one cannot be served: beyond the model's
    maximum, or beyond what the KV cache holds."""
    model_max = ask.model.architecture.max_position_embeddings
    if ctx.origin == "override" and ctx.wanted > model_max:
        return DoesNotFit(
            "ContextDoesNotFit",
            f"max-model-len {ctx.wanted:,} from spec.tuning.overrides exceeds the model's "
            f"maximum of {model_max:,}; vLLM refuses it (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN "
            "is set, at the risk of wrong output)",
            (FitOption("ShorterContext", f"max-model-len {model_max:,} or less"),),
            gpu=gpu,
            model=ask.model,
            memory=c.memory,
        )
    final = final_context(ask, ctx, c)
    if final is not None:
        return final
    room = c.kv_token_room(ask.model.architecture)
    return DoesNotFit(
        "ContextDoesNotFit",
        f"max-model-len {ctx.wanted:,} from spec.tuning.overrides does not fit: the KV "
        f"cache of {c.gpus_count} {gpu.name} holds {room:,} tokens",
        tuple(fit_options(ask, g, ctx, c)),
        gpu=gpu,
        model=ask.model,
        memory=c.memory,
    )


@dataclasses.dataclass(frozen=True)
class Sequences:
    """``--max-num-seqs`` with its reason, and a note when a pinned value overcommits."""

    setting: Setting
    notes: tuple[str, ...] = ()


def sequences(
    ask: Ask, g: GpuChoices, ctx: Context, c: Candidate, kv: KVCacheCapacity, context: int
) -> Sequences:
    """The sequence target, bounded by the typical requests the KV cache holds."""
    per_request_blocks = math.ceil(min(ctx.typical, context) / c.block_size)
    fit_seqs = max(1, kv.num_blocks // per_request_blocks)
    seqs = g.seqs_target
    if ask.pins.max_num_seqs is not None:
        setting = Setting("max-num-seqs", str(seqs), "Override", g.seqs_reason)
        if seqs <= fit_seqs:
            return Sequences(setting)
        return Sequences(
            setting,
            (
                f"max-num-seqs {seqs} exceeds the {fit_seqs} typical requests the KV cache "
                "holds; vLLM will preempt and recompute under load",
            ),
        )
    if seqs <= fit_seqs:
        return Sequences(Setting("max-num-seqs", str(seqs), "Tuner", g.seqs_reason))
    reason = (
        f"{g.seqs_reason}, bounded to {fit_seqs} by the KV cache "
        f"({kv.num_blocks * c.block_size:,} tokens / {ctx.typical:,} per request: "
        f"{ctx.typical_reason})"
    )
    return Sequences(Setting("max-num-seqs", str(fit_seqs), "Tuner", reason))


def parallelism_arguments(choice: Choice) -> list[Setting]:
    """Tensor- and pipeline-parallel sizes, as chosen."""
    c = choice.candidate
    arguments = [Setting("tensor-parallel-size", str(c.tp), choice.source, choice.reason)]
    if c.pp > 1 and choice.pipeline_reason is not None:
        arguments.append(
            Setting("pipeline-parallel-size", str(c.pp), "Tuner", choice.pipeline_reason)
        )
    elif c.pp > 1:
        arguments.append(
            Setting("pipeline-parallel-size", str(c.pp), "Override", "set in overrides")
        )
    return arguments


def engine_arguments(
    g: GpuChoices, c: Candidate, context: FinalContext, seqs: Setting
) -> list[Setting]:
    """Context, sequences, batch budget, memory, dtypes, caching, prefill and graphs."""
    arguments = [
        Setting("max-model-len", str(context.tokens), "Tuner", context.reason),
        seqs,
        g.batched,
        Setting(
            "gpu-memory-utilization",
            f"{c.utilization:.2f}",
            c.utilization_source,
            c.utilization_reason,
        ),
        g.dtype,
    ]
    if g.quantization is not None:
        arguments.append(g.quantization)
    arguments += [
        g.kv_dtype,
        Setting(
            "enable-prefix-caching",
            "true",
            "Default",
            "shared prompt prefixes (system prompts, chat history) skip prefill; near-zero "
            "cost when nothing is shared",
        ),
        Setting(
            "enable-chunked-prefill",
            "true",
            "Default",
            "long prompts are prefilled in chunks between decode steps, so running "
            "sequences keep streaming",
        ),
        g.eager,
    ]
    return arguments


def distributed_arguments(choice: Choice, network: Network | None) -> list[Setting]:
    """How the GPUs' processes are launched and joined: vLLM's own multi-node launch, one
    process per GPU on one node, and no custom all-reduce over PCIe."""
    c = choice.candidate
    arguments: list[Setting] = []
    if choice.nodes > 1:
        assert network is not None
        arguments += [
            Setting(
                "distributed-executor-backend",
                "mp",
                "Tuner",
                "vLLM's own multi-node launch (--nnodes, --node-rank, --master-addr; workers "
                "--headless): one process per GPU on every node joined by torch.distributed, "
                "no Ray cluster to run beside it",
            ),
            Setting(
                "nnodes",
                str(choice.nodes),
                "Tuner",
                f"one pod per node in a LeaderWorkerSet group of {choice.nodes} "
                f"({c.tp} GPUs each, {network.describe()} between them); the leader is rank 0",
            ),
        ]
    elif c.gpus_count > 1:
        arguments.append(
            Setting(
                "distributed-executor-backend",
                "mp",
                "Default",
                "one process per GPU on one node; Ray is only needed across nodes",
            )
        )
    if c.tp > 1 and c.link != "NVLink":
        arguments.append(
            Setting(
                "disable-custom-all-reduce",
                "true",
                "Tuner",
                f"GPUs joined by PCIe ({c.link}): vLLM's custom all-reduce needs NVLink or "
                "peer-to-peer (custom_all_reduce.py disables it for > 2 PCIe GPUs); NCCL "
                "chooses the PCIe path itself",
            )
        )
    return arguments


def ask_notes(ask: Ask, g: GpuChoices, c: Candidate) -> list[str]:
    """Notes on what was asked: the LoRA slots' memory, overrides the planner could not read."""
    notes = []
    if ask.lora is not None:
        slots = gpu_bytes_per_gpu(
            ask.model.architecture, ask.lora, dtype_bytes=g.dtype_bytes, tensor_parallel=c.tp
        )
        notes.append(
            f"LoRA: {ask.lora.max_loras} adapter slots of rank {ask.lora.max_rank} take "
            f"{gib(slots)} on each GPU, counted with the weights (out of the KV cache)"
        )
    if ask.pins.unreadable:
        notes.append(
            "overrides the planner could not read (passed to vLLM as written; predictions "
            f"ignore them): {', '.join(ask.pins.unreadable)}"
        )
    return notes


@dataclasses.dataclass(frozen=True)
class Predicted:
    """The predictions of one plan, the reasons behind them, and the load time the pod's
    startup budget is sized by."""

    predictions: Predictions
    reasons: tuple[Setting, ...]
    load_seconds: float


def predicted(
    ask: Ask,
    gpu: GPUProfile,
    g: GpuChoices,
    choice: Choice,
    kv: KVCacheCapacity,
    context: int,
    typical: int,
    network: Network | None,
) -> Predicted:
    """Weights, KV bytes and tokens, concurrency, decode rate (for one sequence of
    ``typical`` tokens) and load time, with reasons."""
    c = choice.candidate
    decode = (
        multinode.decode_across_nodes(ask, g, c, typical)
        if choice.nodes > 1
        else decode_estimate(ask, g, c, typical)
    )
    load = load_time(
        weights_bytes=c.weights,
        tensor_parallel=c.gpus_count,
        pcie_generation=gpu.model.pcie_generation if gpu.model else None,
        host_to_device_bytes_per_second=gpu.host_to_device_bytes_per_second,
    )
    predictions = Predictions(
        weights_bytes=c.weights,
        kv_cache_bytes=kv.bytes * c.gpus_count,
        kv_cache_tokens=kv.tokens,
        max_concurrent_sequences=int(kv.max_concurrency),
        context_length=context,
        decode_tokens_per_second=round(decode.tokens_per_second, 1) if decode else None,
        load_seconds=round(load.seconds, 1),
    )
    reasons = capacity_reasons(ask, gpu, g, c, kv, context)
    if decode is not None:
        reasons += decode_reasons(ask, gpu, g, c, decode, typical, network)
    reasons.append(
        Setting(
            "load-seconds",
            f"{load.seconds:.1f}",
            "Tuner",
            f"{gib(c.weights)} from storage at an assumed 2 GB/s (network volumes are slower) "
            f"and {gib(c.weights / c.gpus_count)} per GPU over PCIe"
            + (" (measured)" if gpu.host_to_device_measured else ""),
        )
    )
    return Predicted(predictions, tuple(reasons), load.seconds)


def capacity_reasons(
    ask: Ask, gpu: GPUProfile, g: GpuChoices, c: Candidate, kv: KVCacheCapacity, context: int
) -> list[Setting]:
    """Why each GPU's memory and the KV cache come to what they do."""
    arch = ask.model.architecture
    return [
        Setting(
            "memory-per-gpu",
            f"{c.memory.budget / GIB:.2f} GiB",
            "Tuner",
            f"vLLM's budget on each {gib(gpu.memory_bytes)} GPU: {c.memory.describe()} "
            f"(weights: {arch.parameter_count / 1e9:.2f}B params, {g.fmt.describe()})",
        ),
        Setting(
            "kv-cache-tokens",
            f"{kv.tokens:,}",
            "Tuner",
            f"{kv.num_blocks:,} blocks of {c.block_size} tokens at {kv.bytes_per_token:,} "
            f"bytes per token per GPU; {kv.max_concurrency:.2f} requests of {context:,} tokens",
        ),
    ]


def decode_reasons(
    ask: Ask,
    gpu: GPUProfile,
    g: GpuChoices,
    c: Candidate,
    decode: DecodeEstimate,
    typical: int,
    network: Network | None,
) -> list[Setting]:
    """Why decode runs at the predicted rate: the roofline on one node, or through the
    pipeline stages of a multi-node group; nothing without a bandwidth figure."""
    bw = gpu.bandwidth_bytes_per_second
    if bw is None:
        return []
    if network is not None:
        hop = network.hop_seconds(ask.model.architecture.hidden_size * g.dtype_bytes)
        why = (
            f"roofline for one sequence of {typical:,} tokens through "
            f"{c.pp} pipeline stages in turn: {gib(decode.bytes_per_gpu / c.pp)} read per "
            f"stage per GPU at "
            + _achieved(bw, measured=gpu.bandwidth_measured)
            + f", {decode.communication_seconds * 1000:.2f} ms of all-reduce and "
            f"{c.pp - 1} network hop(s) of ~{hop * 1e6:.0f} us ({network.describe()}); "
            f"the pipeline bubble: one sequence keeps 1 of {c.pp} stages busy, so the "
            f"aggregate rate grows with up to {c.pp} sequences in flight"
        )
    else:
        why = (
            f"roofline for one sequence of {typical:,} tokens: "
            f"{gib(decode.bytes_per_gpu)} read per step per GPU at "
            + _achieved(bw, measured=gpu.bandwidth_measured)
            + (
                f" + {decode.communication_seconds * 1000:.2f} ms of all-reduce"
                if decode.communication_seconds
                else ""
            )
        )
    return [Setting("decode-tokens-per-second", f"{decode.tokens_per_second:.1f}", "Tuner", why)]


def shape_notes(ask: Ask, gpu: GPUProfile, c: Candidate) -> list[str]:
    """Notes on the shape planned: sliding-window layers, replicas per node, assumed links."""
    arch = ask.model.architecture
    notes = []
    if arch.sliding_window_layers:
        notes.append(
            f"{arch.sliding_window_layers} of {arch.num_layers} layers use a "
            f"{arch.sliding_window:,}-token sliding window; KV predictions approximate vLLM's "
            "hybrid allocator"
        )
    replicas_per_node = max(1, gpu.count // c.gpus_count)
    if replicas_per_node > 1:
        notes.append(
            f"{gpu.describe()} holds {replicas_per_node} replicas of {c.gpus_count} GPU(s)"
        )
    if gpu.links_assumed and c.gpus_count > 1:
        notes.append("the GPUs' pairwise links were not read (no GPUNode); assumed from labels")
    return notes


def environment(
    ask: Ask, g: GpuChoices, c: Candidate, network: Network | None
) -> tuple[Setting, ...]:
    """The server's environment: NCCL without peer-to-peer, across nodes, and LoRA updates."""
    return (
        tuple(_environment(g, c))
        + (tuple(nccl_environment(network)) if network is not None else ())
        + ((runtime_updating_env(),) if ask.lora is not None else ())
    )


def _build(
    ask: Ask, gpu: GPUProfile, g: GpuChoices, ctx: Context, choice: Choice
) -> Plan | DoesNotFit:
    c = choice.candidate
    g = choice.gpu_choices or g
    context = context_verdict(ask, gpu, g, ctx, c)
    if isinstance(context, DoesNotFit):
        return context
    kv = c.kv(ask.model.architecture, context.tokens)
    seqs = sequences(ask, g, ctx, c, kv, context.tokens)
    network = multinode.network_of(g) if choice.nodes > 1 else None
    arguments = [
        *parallelism_arguments(choice),
        *engine_arguments(g, c, context, seqs.setting),
        *distributed_arguments(choice, network),
        *(ask.lora.settings if ask.lora is not None else ()),
    ]
    typical = min(context.tokens, ctx.typical)
    expected = predicted(ask, gpu, g, choice, kv, context.tokens, typical, network)
    notes = [*gpu.notes, *choice.notes, *c.notes, *context.notes]
    if not g.fmt.known:
        notes.append(g.fmt.describe())
    notes += [*seqs.notes, *ask_notes(ask, g, c), *shape_notes(ask, gpu, c)]
    return Plan(
        model=ask.model,
        gpu=gpu,
        gpu_indices=c.gpus,
        link=c.link,
        tensor_parallel_size=c.tp,
        pipeline_parallel_size=c.pp,
        arguments=tuple(apply_overrides(arguments, ask.overrides)),
        environment=environment(ask, g, c, network),
        # One pod per node: the pod plan of one stage (its tp GPUs, its share of weights).
        pod=pod_plan(
            ask,
            dataclasses.replace(c, pp=1) if choice.nodes > 1 else c,
            expected.load_seconds,
            math.ceil(c.weights / c.gpus_count),
            download_bytes=c.weights if choice.nodes > 1 else None,
        ),
        memory=c.memory,
        kv_cache=kv,
        predictions=expected.predictions,
        prediction_reasons=expected.reasons,
        notes=tuple(notes),
        replicas_per_node=max(1, gpu.count // c.gpus_count),
        nodes=choice.nodes,
        network=network,
    )


def plan(
    model: ModelInput,
    gpu: GPUProfile,
    *,
    workload: Workload | None = None,
    slo: SLO | None = None,
    tuning: TuningSpec | None = None,
    node: NodeSpec | None = None,
    dtype: Dtype = "auto",
    gpu_count: int | Literal["auto"] = "auto",
    replicas: int = 1,
    downloads_weights: bool = False,
    vllm_version: Version = TESTED_VERSION,
    lora: LoRAAsk | None = None,
    across_nodes: bool = False,
    nodes_seen: int | None = None,
    gpus_available: int | None = None,
    measured: Measured | None = None,
) -> Plan | DoesNotFit:
    """Plan one replica of ``model`` on the GPU set ``gpu`` for vLLM ``vllm_version``
    (its memory model: tuning/memory.py); ``lora``: serve LoRA adapters (tuning/lora.py).
    ``across_nodes``: when the model does not fit one such node, plan one instance over
    several of them (tuning/multinode.py); ``nodes_seen``: how many nodes of the shape the
    cluster has (a note when a group needs more), None when unknown. ``gpus_available``:
    the GPUs of this shape an SLO answer may spread replicas over (tuning/slo.py; default:
    this GPU set's); ``measured``: a measured figure of this model on this shape, used
    instead of the predicted one."""
    ask = ask_of(
        model,
        workload=workload,
        slo=slo,
        tuning=tuning,
        node=node,
        dtype=dtype,
        gpu_count=gpu_count,
        replicas=replicas,
        downloads_weights=downloads_weights,
        vllm_version=vllm_version,
        lora=lora,
    )
    single = _plan(ask, gpu, available=gpus_available, measured=measured)
    if (
        across_nodes
        and isinstance(single, DoesNotFit)
        and single.reason in ("WeightsDoNotFit", "ContextDoesNotFit")
    ):
        return _plan_across_nodes(ask, gpu, nodes_seen) or single
    return single


def ask_of(
    model: ModelInput,
    *,
    workload: Workload | None = None,
    slo: SLO | None = None,
    tuning: TuningSpec | None = None,
    node: NodeSpec | None = None,
    dtype: Dtype = "auto",
    gpu_count: int | Literal["auto"] = "auto",
    replicas: int = 1,
    downloads_weights: bool = False,
    vllm_version: Version = TESTED_VERSION,
    lora: LoRAAsk | None = None,
) -> Ask:
    """What :func:`plan` is asked, read once: the overrides, the workload's lengths and
    the peak one replica sees."""
    tuning = tuning or TuningSpec()
    workload = workload or Workload()
    replicas = max(1, replicas)
    peak = workload.peak_concurrency
    ask = Ask(
        model=model,
        fmt=model.weight_format,
        profile=tuning.profile,
        pins=read_overrides(tuning.overrides),
        overrides=dict(tuning.overrides),
        spec_dtype=dtype,
        gpu_count=gpu_count,
        prompt=length_stats(workload.prompt_tokens) if workload.prompt_tokens else None,
        output=length_stats(workload.output_tokens) if workload.output_tokens else None,
        peak_per_replica=math.ceil(peak / replicas) if peak else None,
        replicas=replicas,
        slo=slo or SLO(),
        node=node or NodeSpec(),
        downloads_weights=downloads_weights,
        vllm_version=vllm_version,
        prompt_p99=lengths.quantile(workload.prompt_tokens, 0.99)
        if workload.prompt_tokens
        else None,
        output_p99=lengths.quantile(workload.output_tokens, 0.99)
        if workload.output_tokens
        else None,
        peak=peak,
        lora=_lora_plan(lora, tuning.overrides),
    )
    return ask


def _lora_plan(lora: LoRAAsk | None, overrides: Mapping[str, str]) -> LoRAPlan | None:
    """The LoRA capacity planned, with the overridden values in force for its memory
    (the overridden arguments themselves are marked as overrides with the others)."""
    return plan_lora(lora, overrides) if lora is not None else None


def _rank(result: Plan) -> tuple[int, float, int, str]:
    decode = result.predictions.decode_tokens_per_second or 0.0
    return (
        result.gpus_per_replica,
        -decode,
        -(result.predictions.kv_cache_tokens or 0),
        result.gpu.name,
    )


def _matches(products: Sequence[str], gpu: GPUProfile) -> bool:
    if not products:
        return True
    for wanted in products:
        if wanted == gpu.product:
            return True
        model = match_product(wanted)
        if model is not None and gpu.model is not None and model.name == gpu.model.name:
            return True
    return False


def lora_ask(spec: InferenceServiceSpec) -> LoRAAsk | None:
    """LoRA is on when adapters are declared, or when spec.tuning.overrides turns it on
    (to keep it on, with no restart, while the last adapter is removed)."""
    if not spec.adapters and spec.tuning.overrides.get("enable-lora", "").lower() != "true":
        return None
    return LoRAAsk(tuple(DeclaredAdapter(a.name, a.rank) for a in spec.adapters))


def spec_only(spec: InferenceServiceSpec, message: str) -> SpecOnly:
    """The spec's own settings, unplanned: GPU count, dtype, quantization, overrides."""
    proposed: list[Setting] = []
    if isinstance(spec.gpu.count, int):
        proposed.append(
            Setting("tensor-parallel-size", str(spec.gpu.count), "Spec", "spec.gpu.count")
        )
    if spec.model.dtype != "auto":
        proposed.append(Setting("dtype", spec.model.dtype, "Spec", "spec.model.dtype"))
    q = spec.model.quantization
    if q is not None and q.method != "None":
        method = quantization_spelling(q.method)
        proposed.append(Setting("quantization", method, "Spec", "spec.model.quantization"))
    lora = lora_ask(spec)
    if lora is not None:
        proposed += plan_lora(lora).settings
    node = spec.node
    pod = PlannedPod(
        shm_size=None if node.shm_size == "auto" else node.shm_size,
        cpus=node.cpus,
        memory=node.memory,
        cpu_pinning=node.cpu_pinning,
    )
    return SpecOnly(
        "ArchitectureUnknown",
        message,
        tuple(apply_overrides(proposed, spec.tuning.overrides)),
        gpus=spec.gpu.count if isinstance(spec.gpu.count, int) else 1,
        pod=pod,
        environment=(runtime_updating_env(),) if lora is not None else (),
    )


def plan_service(
    spec: InferenceServiceSpec,
    gpus: Sequence[GPUProfile],
    *,
    config: Mapping[str, Any] | None = None,
    name: str | None = None,
    version: DeployedVersion | None = None,
    measurements: Measurements | None = None,
    unread: Sequence[str] = (),
) -> TuningResult:
    """Plan an InferenceService over the candidate nodes' GPU profiles, for the vLLM
    release it deploys.

    ``measurements``: what measured tuning runs kept; the records of each GPU set's
    shape are used and noted as tuning/learned.py says (``unread``: lines saying what
    could not be read, noted on the plan).

    ``gpus``: one profile per candidate node (from GPUNode status, else node labels).
    ``config``: the model's config.json when the caller could read it. ``name``: the
    InferenceService's name (a catalog lookup falls back to it). ``version``: the vLLM
    version deployed (default: the one the tests run); its arguments decide which overrides
    are accepted and which proposed arguments are passed. Profiles not allowed by
    ``spec.gpu.products`` are skipped; among the plans that fit, the one with the fewest
    GPUs per replica wins, then the fastest decode, then the largest KV cache.
    """
    deployed = version or DeployedVersion(TESTED_VERSION, "Default")
    release, refused = release_problem(spec.tuning.overrides, deployed)
    if refused is not None:
        return refused
    assert release is not None
    note = arguments_for(deployed.version).note
    planned = _plan_service(
        spec,
        gpus,
        config=config,
        name=name,
        version=deployed.version,
        measurements=measurements,
        unread=unread,
    )
    return for_release(planned, release, deployed, note)


def _plan_service(
    spec: InferenceServiceSpec,
    gpus: Sequence[GPUProfile],
    *,
    config: Mapping[str, Any] | None,
    name: str | None,
    version: Version = TESTED_VERSION,
    measurements: Measurements | None = None,
    unread: Sequence[str] = (),
) -> TuningResult:
    model = resolve_model(spec.model, config=config, fallback_name=name)
    if model is None:
        repo = spec.model.source.hugging_face
        wanted = (repo.repo if repo else None) or spec.model.name or name or "the model"
        near = catalog.nearest(wanted)
        return spec_only(
            spec,
            f"the model's architecture is unknown: {wanted} is not in the tuner's catalog; "
            "set spec.model.architecture, or serve it from a ModelCache, whose download "
            "reads its config.json (`vllm-operator tune FOLDER` reads one offline)"
            + (f" (nearest catalog names: {', '.join(near)})" if near else ""),
        )
    candidates = [g for g in gpus if _matches(spec.gpu.products, g)]
    if not candidates:
        wanted = ", ".join(spec.gpu.products) or "any"
        return DoesNotFit(
            "NoMatchingGPUs",
            f"no node offers GPUs matching {wanted} (seen: "
            f"{', '.join(sorted({g.product for g in gpus})) or 'none'})",
            model=model,
        )
    results = [
        _plan_on(
            spec,
            model,
            g,
            version,
            gpus_available=sum(p.count for p in candidates if _shape(p) == _shape(g)),
            measurements=measurements,
            unread=unread,
        )
        for g in _unique(candidates)
    ]
    plans = [r for r in results if isinstance(r, Plan)]
    if plans:
        return min(plans, key=_rank)
    verdicts = [r for r in results if isinstance(r, DoesNotFit)]
    # No single node holds it: one instance over several nodes of one shape, if any does.
    groups = [
        r
        for g, v in zip(_unique(candidates), results, strict=True)
        if isinstance(v, DoesNotFit)
        and v.reason in ("WeightsDoNotFit", "ContextDoesNotFit")
        and isinstance(
            r := _plan_on(
                spec,
                model,
                g,
                version,
                across_nodes=True,
                nodes_seen=sum(1 for p in candidates if _shape(p) == _shape(g)),
                measurements=measurements,
                unread=unread,
            ),
            Plan,
        )
    ]
    if groups:
        return min(groups, key=_rank)
    # The verdict for the roomiest GPU set says most about what would fit.
    return max(verdicts, key=_verdict_rank)


def _plan_on(
    spec: InferenceServiceSpec,
    model: ModelInput,
    gpu: GPUProfile,
    version: Version,
    *,
    across_nodes: bool = False,
    nodes_seen: int | None = None,
    gpus_available: int | None = None,
    measurements: Measurements | None = None,
    unread: Sequence[str] = (),
) -> Plan | DoesNotFit:
    """:func:`plan` of the service's model on one GPU set, as its spec asks, learned from
    the measurements of its shape (tuning/learned.py); ``gpus_available``: the cluster's
    GPUs of this shape (nodes x GPUs)."""
    return plan_learning(
        lambda measured: _plan_one(
            spec,
            model,
            gpu,
            version,
            across_nodes=across_nodes,
            nodes_seen=nodes_seen,
            gpus_available=gpus_available,
            measured=measured,
        ),
        measurements,
        version=str(version),
        unread=unread,
    )


def _plan_one(
    spec: InferenceServiceSpec,
    model: ModelInput,
    gpu: GPUProfile,
    version: Version,
    *,
    across_nodes: bool,
    nodes_seen: int | None,
    gpus_available: int | None,
    measured: Measured | None,
) -> Plan | DoesNotFit:
    return plan(
        model,
        gpu,
        workload=spec.workload,
        slo=spec.slo,
        tuning=spec.tuning,
        node=spec.node,
        dtype=spec.model.dtype,
        gpu_count=spec.gpu.count,
        replicas=spec.replicas,
        downloads_weights=spec.model.source.hugging_face is not None,
        vllm_version=version,
        lora=lora_ask(spec),
        across_nodes=across_nodes,
        nodes_seen=nodes_seen,
        gpus_available=gpus_available,
        measured=measured,
    )


def _verdict_rank(v: DoesNotFit) -> tuple[int, int]:
    gpu = v.gpu
    return (gpu.memory_bytes * gpu.count, gpu.count) if gpu else (0, 0)


def _shape(p: GPUProfile) -> tuple[Any, ...]:
    """What makes two nodes' GPU sets the same for the planner."""
    return (
        p.product,
        p.count,
        p.memory_bytes,
        p.links,
        p.bandwidth_bytes_per_second,
        p.compute_capability,
        p.network,
    )


def _unique(profiles: Sequence[GPUProfile]) -> list[GPUProfile]:
    """One profile per distinct GPU set (many nodes share a shape); order kept."""
    seen: set[tuple[Any, ...]] = set()
    result: list[GPUProfile] = []
    for p in profiles:
        if (shape := _shape(p)) not in seen:
            seen.add(shape)
            result.append(p)
    return result


def _achieved(bandwidth: float, *, measured: bool) -> str:
    """The bandwidth decode is predicted at, and where it comes from."""
    share = MEASURED_EFFICIENCY if measured else SPEC_EFFICIENCY
    source = "the node agent's measured copy rate" if measured else "the datasheet's"
    return (
        f"{bandwidth * share / 1e9:.0f} GB/s ({share:.0%} of {source} "
        f"{bandwidth / 1e9:.0f} GB/s: what decode kernels achieve)"
    )
