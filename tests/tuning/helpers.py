"""Builders for the tuner's tests: catalog models, GPU shapes, workloads."""

from __future__ import annotations

from vllm_operator.models.workload import LengthDistribution, Workload
from vllm_operator.tuning import catalog
from vllm_operator.tuning.gpus import GPUProfile, profile_from_product
from vllm_operator.tuning.quantization import UNQUANTIZED, WeightFormat
from vllm_operator.tuning.results import DoesNotFit, ModelInput, Plan, SpecOnly, TuningResult

GIB = 1024**3


def model(name: str, fmt: WeightFormat = UNQUANTIZED) -> ModelInput:
    entry = catalog.lookup(name)
    assert entry is not None, name
    return ModelInput(entry.repo, entry.architecture(), fmt, origin=f"catalog ({entry.repo})")


def gpus(product: str, count: int = 1, interconnect: str | None = None) -> GPUProfile:
    return profile_from_product(product, count, interconnect=interconnect)


def uniform(low: int, high: int) -> LengthDistribution:
    return LengthDistribution(type="Uniform", min=low, max=high)


def workload(
    prompt: tuple[int, int] | None = None,
    output: tuple[int, int] | None = None,
    peak: int | None = None,
) -> Workload:
    return Workload(
        prompt_tokens=uniform(*prompt) if prompt else None,
        output_tokens=uniform(*output) if output else None,
        peak_concurrency=peak,
    )


def as_plan(result: TuningResult) -> Plan:
    assert isinstance(result, Plan), getattr(result, "message", result)
    return result


def as_verdict(result: TuningResult) -> DoesNotFit:
    assert isinstance(result, DoesNotFit), f"expected DoesNotFit, got {result.kind}"
    return result


def as_spec_only(result: TuningResult) -> SpecOnly:
    assert isinstance(result, SpecOnly), f"expected SpecOnly, got {result.kind}"
    return result


def arg(plan: Plan, name: str) -> str | None:
    setting = plan.argument(name)
    return None if setting is None else setting.value
