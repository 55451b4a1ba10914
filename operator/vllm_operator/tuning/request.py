"""The request: the model resolved from the spec (:func:`resolve_model`), and everything
the planner decides before a GPU is chosen: the :class:`Ask` (model, profile, overrides,
workload lengths, SLO, node), the :class:`Context` it wants (:func:`context_of`), and the
sequences it aims for (:func:`seq_target`).

The context comes from the workload's longest requests (prompt plus output), not the
model's maximum; the sequences are about 1.5x the peak concurrency one replica sees, or the
profile's default. See :mod:`vllm_operator.tuning.plan` for the order of the whole plan.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Final, Literal

from vllm_operator.models.inference_service import Dtype, ModelSpec, NodeSpec, Profile
from vllm_operator.models.workload import SLO
from vllm_operator.releases.version import TESTED_VERSION, Version
from vllm_operator.tuning import architecture as arch_mod
from vllm_operator.tuning import catalog, quantization
from vllm_operator.tuning.architecture import Architecture, ArchitectureError
from vllm_operator.tuning.args import Pins
from vllm_operator.tuning.lora import LoRAPlan
from vllm_operator.tuning.quantization import UNQUANTIZED, WeightFormat
from vllm_operator.tuning.results import ModelInput
from vllm_operator.tuning.units import round_up
from vllm_operator.tuning.workload import LengthStats

__all__ = ["CONTEXT_ROUNDING", "Ask", "Context", "context_of", "resolve_model", "seq_target"]

PEAK_HEADROOM: Final = 1.5
CONTEXT_ROUNDING: Final = 256
# Profile defaults when the peak concurrency is not declared. Balanced and FastStart keep
# vLLM's own default for the API server (256).
DEFAULT_SEQS: Final[dict[str, int]] = {
    "Latency": 64,
    "Balanced": 256,
    "Throughput": 512,
    "FastStart": 256,
}
# Output tokens assumed when only prompt lengths are declared.
ASSUMED_OUTPUT_TOKENS: Final = 1024


def resolve_model(
    model: ModelSpec,
    *,
    config: Mapping[str, Any] | None = None,
    fallback_name: str | None = None,
    checkpoint_bytes: int | None = None,
) -> ModelInput | None:
    """The model's shape from the spec, its config.json, or the catalog; None if unknown.

    Quantization: the spec's, else config.json's, else a hint in the repository name, else
    the one the catalog entry's published config.json states (gpt-oss: MXFP4).
    ``checkpoint_bytes``: the checkpoint's size (``model.safetensors.index.json``'s
    ``metadata.total_size``) when the caller read it; it sizes the weights of a
    quantization method the tuner does not know.
    Raises nothing: a config.json that cannot be read counts as absent.
    """
    hf = model.source.hugging_face
    name = (hf.repo if hf else None) or model.name or fallback_name or "model"
    arch: Architecture | None = None
    origin = ""
    if model.architecture is not None:
        try:
            arch, origin = (
                arch_mod.from_spec(model.architecture, name=name),
                "spec.model.architecture",
            )
        except ArchitectureError:
            arch = None
    if arch is None and config is not None:
        try:
            arch, origin = arch_mod.from_config(config, name=name), "config.json"
        except ArchitectureError:
            arch = None
    entry = None
    for candidate in (hf.repo if hf else None, model.name, fallback_name):
        if candidate and (entry := catalog.lookup(candidate)) is not None:
            break
    if arch is None and entry is not None:
        arch, origin = entry.architecture(), f"catalog ({entry.repo})"
    if arch is None:
        return None
    fmt = (
        quantization.from_spec(model.quantization)
        or (
            quantization.from_config(config, checkpoint_bytes=checkpoint_bytes)
            if config is not None
            else None
        )
        or quantization.from_name(name)
        or (_catalog_format(entry) if entry is not None else None)
        or UNQUANTIZED
    )
    return ModelInput(name=name, architecture=arch, weight_format=fmt, origin=origin)


def _catalog_format(entry: catalog.CatalogModel) -> WeightFormat | None:
    fmt = quantization.from_config(entry.config)
    return dataclasses.replace(fmt, origin=f"catalog ({entry.repo})") if fmt else None


@dataclasses.dataclass(frozen=True)
class Ask:
    model: ModelInput
    fmt: WeightFormat
    profile: Profile
    pins: Pins
    overrides: Mapping[str, str]
    spec_dtype: Dtype
    gpu_count: int | Literal["auto"]
    prompt: LengthStats | None
    output: LengthStats | None
    peak_per_replica: int | None
    replicas: int
    slo: SLO
    node: NodeSpec
    downloads_weights: bool
    prompt_p99: int | None = None  # the workload's p99 prompt length (TTFT P99)
    output_p99: int | None = None  # the workload's p99 output length (E2E P99)
    # The declared peak concurrency of the whole service (peak_per_replica is its share).
    peak: int | None = None
    # The vLLM release planned for: its memory model (releases/memory.py) differs by release.
    vllm_version: Version = TESTED_VERSION
    # LoRA capacity when adapters are served (tuning/lora.py), with the overrides' values.
    lora: LoRAPlan | None = None


@dataclasses.dataclass(frozen=True)
class Context:
    wanted: int  # the context the workload (or pin, or model) asks for
    origin: Literal["override", "workload", "model"]
    reason: str
    typical: int  # tokens of a typical request (KV sizing)
    typical_reason: str


def context_of(ask: Ask) -> Context:
    origin: Literal["override", "workload", "model"]
    arch = ask.model.architecture
    model_max = arch.max_position_embeddings
    prompt, output = ask.prompt, ask.output
    typical_prompt = prompt.mean if prompt else None
    typical_output = output.mean if output else None
    if ask.pins.max_model_len is not None:
        wanted, origin = ask.pins.max_model_len, "override"
        reason = "set in spec.tuning.overrides"
    elif prompt is not None:
        out_longest = output.longest if output else ASSUMED_OUTPUT_TOKENS
        longest = prompt.longest + out_longest
        out_text = output.describe_longest() if output else f"{ASSUMED_OUTPUT_TOKENS:,} assumed"
        wanted = min(model_max, round_up(longest, CONTEXT_ROUNDING))
        origin = "workload"
        reason = (
            f"longest request in the workload: prompt {prompt.describe_longest()} + output "
            f"{out_text} = {longest:,}, rounded up to a multiple of {CONTEXT_ROUNDING}; not "
            f"the model's {model_max:,} (unused context wastes KV blocks)"
        )
        if longest > model_max:
            reason = (
                f"the model's maximum {model_max:,}: the workload's longest request "
                f"({longest:,}) exceeds it and such requests will be rejected"
            )
    else:
        wanted, origin = model_max, "model"
        reason = (
            f"the model's maximum {model_max:,}: no prompt lengths declared in spec.workload "
            "(declare them to cap the context and free KV blocks)"
        )
    if typical_prompt is None:
        typical_prompt = min(wanted / 2, 1024)
    if typical_output is None:
        typical_output = min(wanted / 4, 512 if prompt is None else ASSUMED_OUTPUT_TOKENS / 2)
    typical = max(1, min(wanted, math.ceil(typical_prompt + typical_output)))
    declared = prompt is not None and output is not None
    typical_reason = (
        f"mean prompt + output of the workload = {typical:,} tokens"
        if declared
        else f"{typical:,} tokens assumed per request (lengths not fully declared)"
    )
    return Context(wanted, origin, reason, typical, typical_reason)


def seq_target(ask: Ask) -> tuple[int, str]:
    if ask.peak_per_replica is not None:
        target = math.ceil(PEAK_HEADROOM * ask.peak_per_replica)
        per = (
            f"{ask.peak_per_replica} per replica of {ask.replicas}"
            if ask.replicas > 1
            else f"{ask.peak_per_replica}"
        )
        return target, (
            f"1.5x the peak concurrency ({per}): room for bursts without the tail latency "
            "of an oversized batch (P99 was 22 % worse at 256 than at 128)"
        )
    default = DEFAULT_SEQS[ask.profile]
    return default, (
        f"{ask.profile} profile default (no peak concurrency declared in spec.workload)"
    )
