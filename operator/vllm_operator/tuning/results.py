"""What the planner hands back: a :class:`Plan` that fits (turned into the status model,
complete, by :meth:`Plan.effective_tuning`), a :class:`DoesNotFit` verdict, or
:class:`SpecOnly` when the model's shape is unknown; and :class:`ModelInput`, the resolved
model every result names. The planner itself is :mod:`vllm_operator.tuning.plan`."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from vllm_operator.models.gpu_node import LinkKind
from vllm_operator.models.inference_service import (
    EffectiveTuning,
    PlannedPod,
    Predictions,
)
from vllm_operator.releases.arguments import release_flags
from vllm_operator.tuning.architecture import Architecture
from vllm_operator.tuning.args import Setting
from vllm_operator.tuning.gpus import GPUProfile
from vllm_operator.tuning.memory import GIB, GpuMemoryPlan, KVCacheCapacity
from vllm_operator.tuning.network import Network
from vllm_operator.tuning.quantization import UNQUANTIZED, WeightFormat

FitReason = Literal[
    "WeightsDoNotFit",
    "ContextDoesNotFit",
    "InvalidParallelism",
    "NotEnoughGPUs",
    "NoMatchingGPUs",
    "InvalidOverride",
    "UnsupportedVllmVersion",
]
OptionKind = Literal["Quantize", "MoreGPUs", "LargerGPU", "ShorterContext", "KVCacheDtype"]


def gib_quantity(num_bytes: int) -> str:
    """A Kubernetes quantity in whole GiB (or MiB below 1 GiB), rounded up."""
    if num_bytes >= GIB:
        return f"{math.ceil(num_bytes / GIB)}Gi"
    return f"{math.ceil(num_bytes / 1024**2)}Mi"


@dataclasses.dataclass(frozen=True)
class ModelInput:
    """A model whose shape is known: architecture, weight format, and where they came from."""

    name: str
    architecture: Architecture
    weight_format: WeightFormat = UNQUANTIZED
    origin: str = "given"


@dataclasses.dataclass(frozen=True)
class PodPlan:
    """Pod settings for one replica; :meth:`settings` gives them with reasons."""

    shm_bytes: int
    cpus: int
    memory_bytes: int  # /dev/shm excluded
    cpu_pinning: bool
    startup_seconds: int
    interconnect: Literal["NVLink", "PCIe"] | None
    reasons: tuple[Setting, ...]
    # The cache volume the Hub download fills; None when nothing is downloaded.
    cache_bytes: int | None = None

    def to_planned_pod(self) -> PlannedPod:
        return PlannedPod(
            shm_size=gib_quantity(self.shm_bytes),
            cpus=self.cpus,
            memory=gib_quantity(self.memory_bytes),
            cpu_pinning=self.cpu_pinning,
            startup_seconds=self.startup_seconds,
            interconnect=self.interconnect,
            cache_size=gib_quantity(self.cache_bytes) if self.cache_bytes else None,
        )


@dataclasses.dataclass(frozen=True)
class SloAnswer:
    """What the plan answers to ``spec.slo`` (tuning/slo.py): each target with the figure
    predicted at the peak concurrency, whether the plan meets them, the replicas the
    workload needs, and, for a target no candidate meets, the best prediction and what
    would meet it. ``lines``: one sentence per target, each citing it."""

    targets: tuple[tuple[str, int], ...]  # ("TTFT", 500): P99 targets in milliseconds
    predicted: tuple[tuple[str, float], ...]  # ("TTFT", 412.0): the plan's, in milliseconds
    met: bool
    peak_concurrency: int
    replicas: int  # replicas the plan is made for (the workload needs them when met)
    replicas_asked: int
    gpus_per_replica: int
    goodput_per_second: float | None  # requests/s meeting every target, whole service
    lines: tuple[str, ...]
    would_meet: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica


@dataclasses.dataclass(frozen=True)
class Plan:
    """A configuration that fits, for one replica on one GPU profile."""

    model: ModelInput
    gpu: GPUProfile
    gpu_indices: tuple[int, ...]
    link: LinkKind | None
    tensor_parallel_size: int
    pipeline_parallel_size: int
    arguments: tuple[Setting, ...]
    environment: tuple[Setting, ...]
    pod: PodPlan
    memory: GpuMemoryPlan
    kv_cache: KVCacheCapacity
    predictions: Predictions
    prediction_reasons: tuple[Setting, ...]
    notes: tuple[str, ...]
    replicas_per_node: int
    # The vLLM release the arguments are spelled for (tuning.release.for_release).
    vllm_version: str | None = None
    # Nodes of one instance (tuning/multinode.py: one pipeline stage, one pod each) and the
    # network between them; 1 and None for a single-node plan.
    nodes: int = 1
    network: Network | None = None
    # The answer to spec.slo (None: no target, or nothing to predict it by).
    slo: SloAnswer | None = None
    # What the plan was made from (tuning.plan.PlanInputs), for predictions of variants
    # of it (tuning/trials.py); None for plans made elsewhere.
    inputs: object | None = dataclasses.field(default=None, compare=False, repr=False)
    kind: Literal["Plan"] = "Plan"

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def gpus_per_pod(self) -> int:
        """GPUs of one pod: all of the replica's, or one node's share across nodes."""
        return self.gpus_per_replica // max(1, self.nodes)

    def argument(self, name: str) -> Setting | None:
        return next((a for a in self.arguments if a.name == name), None)

    def command_args(self) -> list[str]:
        """The vLLM command-line arguments the plan puts in force."""
        return release_flags(self.arguments, self.vllm_version)

    def effective_tuning(self) -> EffectiveTuning:
        """The plan as the InferenceService status shows it."""
        pod_notes = [f"pod {s.name}={s.value}: {s.reason}" for s in self.pod.reasons]
        prediction_notes = [
            f"predicted {s.name} {s.value}: {s.reason}" for s in self.prediction_reasons
        ]
        return EffectiveTuning(
            planned_by="Tuner",
            vllm_version=self.vllm_version,
            gpus_per_replica=self.gpus_per_replica,
            tensor_parallel_size=self.tensor_parallel_size,
            arguments=[a.to_effective() for a in self.arguments],
            environment=[s.to_effective() for s in self.environment],
            pod=self.pod.to_planned_pod(),
            predictions=self.predictions,
            notes=[*self.notes, *pod_notes, *prediction_notes],
        )


@dataclasses.dataclass(frozen=True)
class FitOption:
    """One change that would make the model fit, stated for a user."""

    kind: OptionKind
    summary: str


@dataclasses.dataclass(frozen=True)
class DoesNotFit:
    """Nothing can be deployed: nothing fits, or the spec asks for what the vLLM release
    does not take. ``reason`` is the Stalled condition's reason; ``message`` its message."""

    reason: FitReason
    summary: str
    options: tuple[FitOption, ...] = ()
    gpu: GPUProfile | None = None
    model: ModelInput | None = None
    memory: GpuMemoryPlan | None = None
    notes: tuple[str, ...] = ()
    kind: Literal["DoesNotFit"] = "DoesNotFit"

    @property
    def message(self) -> str:
        if not self.options:
            return self.summary
        options = "; ".join(o.summary for o in self.options)
        return f"{self.summary}. Would fit: {options}"


@dataclasses.dataclass(frozen=True)
class SpecOnly:
    """The model's shape is unknown: only the spec's own settings apply, unplanned."""

    reason: Literal["ArchitectureUnknown"]
    message: str
    arguments: tuple[Setting, ...]
    # What the spec alone says of each replica: its GPUs (spec.gpu.count, 1 when "auto")
    # and its pod (spec.node).
    gpus: int = 1
    pod: PlannedPod = dataclasses.field(default_factory=PlannedPod)
    notes: tuple[str, ...] = ()
    vllm_version: str | None = None
    # Environment the spec alone calls for (LoRA's runtime updating).
    environment: tuple[Setting, ...] = ()
    kind: Literal["SpecOnly"] = "SpecOnly"

    def effective_tuning(self) -> EffectiveTuning:
        tp = next((a for a in self.arguments if a.name == "tensor-parallel-size"), None)
        tp_value = int(tp.value) if tp and tp.value.isdigit() else None
        return EffectiveTuning(
            planned_by="SpecOnly",
            vllm_version=self.vllm_version,
            gpus_per_replica=tp_value if tp_value is not None else self.gpus,
            tensor_parallel_size=tp_value,
            arguments=[a.to_effective() for a in self.arguments],
            environment=[e.to_effective() for e in self.environment],
            pod=self.pod,
            notes=[self.message, *self.notes],
        )


TuningResult = Plan | DoesNotFit | SpecOnly
