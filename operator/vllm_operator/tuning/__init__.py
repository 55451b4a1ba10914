"""The tuner: model + GPUs + workload + profile -> vLLM settings, each with a reason.

A pure library (no Kubernetes, no I/O, no clock): the reconcile calls
:func:`plan_service` with the InferenceService's spec and the candidate nodes' GPU
profiles, and gets back a :class:`Plan` (turn it into status with
:meth:`Plan.effective_tuning`), a :class:`DoesNotFit` verdict (set ``Stalled`` with its
``reason`` and ``message``; never deploy), or :class:`SpecOnly` when the model's shape is
unknown. ``vllm-operator tune`` (:mod:`vllm_operator.tune_cli`, outside the pure package)
runs the same planner offline.

Modules: :mod:`.architecture` (model shapes from config.json or the spec),
:mod:`.catalog` (well-known models, offline), :mod:`.quantization` (weight formats and
kernels), :mod:`.gpus` (GPU catalog and node profiles), :mod:`.workload` (length
statistics), :mod:`.memory` (vLLM's memory budget and KV cache), :mod:`.performance`
(decode roofline, load time), :mod:`.plan` (the planner) and its steps: :mod:`.request`
(the resolved model and what is decided before a GPU is chosen), :mod:`.candidate` (a
tensor-parallel size on a GPU profile), :mod:`.choose` (choosing it), :mod:`.verdicts`
(what does not fit, and what would), :mod:`.pod` (the pod's resources) and
:mod:`.units` (helpers they share); :mod:`.slo` (the answer to ``spec.slo``: the
cheapest TP size and replica count predicted to meet the targets at the peak),
:mod:`.trials` (candidates for a measured run); :mod:`.results` (what it returns),
:mod:`.args` (arguments and overrides).
"""

from vllm_operator.tuning.architecture import Architecture, ArchitectureError
from vllm_operator.tuning.args import Setting
from vllm_operator.tuning.gpus import (
    GPUProfile,
    node_profile,
    profile_from_gpu_node,
    profile_from_labels,
    profile_from_product,
)
from vllm_operator.tuning.plan import plan, plan_service, spec_only
from vllm_operator.tuning.quantization import WeightFormat
from vllm_operator.tuning.request import resolve_model
from vllm_operator.tuning.results import (
    DoesNotFit,
    FitOption,
    ModelInput,
    Plan,
    PodPlan,
    SpecOnly,
    TuningResult,
)

__all__ = [
    "Architecture",
    "ArchitectureError",
    "DoesNotFit",
    "FitOption",
    "GPUProfile",
    "ModelInput",
    "Plan",
    "PodPlan",
    "Setting",
    "SpecOnly",
    "TuningResult",
    "WeightFormat",
    "node_profile",
    "plan",
    "plan_service",
    "profile_from_gpu_node",
    "profile_from_labels",
    "profile_from_product",
    "resolve_model",
    "spec_only",
]
