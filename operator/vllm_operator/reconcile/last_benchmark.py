"""What an InferenceService's status says of its benchmarks: the last one that finished
(status.lastBenchmark), computed from the namespace's InferenceBenchmarks on every pass,
never stored, so deleting a benchmark drops it from the service's status too.

Shared by the service reconcile and the benchmark's own (which phases are terminal), which
do not import each other (pyproject's independence contract)."""

from __future__ import annotations

from typing import Final

from pydantic import ValidationError

from vllm_operator.constants import API_VERSION, KIND_INFERENCE_BENCHMARK
from vllm_operator.k8s.api import ClusterAPI
from vllm_operator.models import InferenceBenchmark, InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.models.inference_service import BenchmarkSummary

# A benchmark in one of these phases is a record: it never leaves it.
TERMINAL: Final = ("Succeeded", "Failed")


async def list_benchmarks(api: ClusterAPI, isvc: InferenceService) -> list[Manifest]:
    return await api.list(API_VERSION, KIND_INFERENCE_BENCHMARK, isvc.metadata.namespace)


def latest_benchmark(isvc: InferenceService, items: list[Manifest]) -> BenchmarkSummary | None:
    """The most recent finished benchmark of ``isvc`` among the namespace's benchmarks,
    computed from the benchmarks themselves (not stored: deleting a benchmark drops it
    from here too)."""
    found: list[InferenceBenchmark] = []
    for item in items:
        try:
            bench = InferenceBenchmark.model_validate(item)
        except ValidationError:
            continue
        if (
            bench.spec.target_ref.name == isvc.metadata.name
            and bench.status
            and (bench.status.phase in TERMINAL and bench.status.completion_time)
        ):
            found.append(bench)
    if not found:
        return None
    latest = max(found, key=lambda b: b.status.completion_time)  # type: ignore[union-attr,arg-type,return-value]
    st = latest.status
    assert st is not None
    head = st.headline
    ttft = head.from_scheduled.ttft if head and head.from_scheduled else None
    return BenchmarkSummary(
        name=latest.metadata.name,
        phase=st.phase or "Unknown",
        completion_time=st.completion_time,
        requests_per_second=head.requests_per_second if head else None,
        ttft_p99_milliseconds=ttft.p99 if ttft else None,
        slo_attainment=head.slo_attainment if head else None,
    )
