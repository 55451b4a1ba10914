"""What the server's resources did during a level: the latency's explanation.

While a level runs, a sampler reads Prometheus text from the URLs it is given, every
``interval_s``: a vLLM server's ``/metrics`` (requests running and waiting, KV-cache usage,
preemptions) and, where a cluster runs NVIDIA's DCGM exporter, its GPU utilisation,
memory-copy (bandwidth) utilisation and power. A level's figures:

- requests running and waiting per server: the mean over the level by Little's law, from
  vLLM's latency sums (``releases.metrics.load``, the autoscaler's own reading: the gauges
  are snapshots that a CPU build leaves at 0 through most of a steady load), and the
  highest gauge seen;
- KV-cache usage: mean and highest of the gauge; preemptions: the counter's increase;
- GPU figures: means over the samples (fractions of 1; power in watts, and as a fraction of
  the limit where the exporter gives it).

Each figure that measures how full something is becomes a saturation between 0 and 1
(the KV cache; the queue, as the share of the server's requests that wait; GPU, memory
bandwidth and power), and the level names the one nearest saturation. A preemption counts
as a full KV cache: vLLM preempts only when it has no block left.

The reading itself is bench/sampler.py's; this module only reads what it scraped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from vllm_operator.releases.metrics import (
    PREEMPTIONS,
    MetricsError,
    PodReading,
    load,
    metric_families,
    reading_of,
)

DEFAULT_INTERVAL_S = 1.0

# DCGM exporter's names (its default counters), per GPU.
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent
MEM_COPY_UTIL = "DCGM_FI_DEV_MEM_COPY_UTIL"  # percent
POWER = "DCGM_FI_DEV_POWER_USAGE"  # watts
POWER_LIMIT = "DCGM_FI_DEV_POWER_MGMT_LIMIT"  # watts, where the exporter is set to give it

# The resources a saturation is named for, in the order a tie is broken.
RESOURCES = ("kv-cache", "queue", "gpu", "memory-bandwidth", "power")


@dataclass(frozen=True)
class Sample:
    """One scrape of one URL: vLLM's reading and DCGM's GPU figures, each where present."""

    at: float  # monotonic seconds
    vllm: PodReading | None = None
    preemptions: float | None = None
    gpu_util: float | None = None  # mean over the GPUs, a fraction
    mem_copy_util: float | None = None
    power_w: float | None = None  # summed over the GPUs
    power_limit_w: float | None = None


def parse_sample(url: str, text: str, at: float) -> Sample:
    """One scrape's text; raises MetricsError when it holds neither vLLM's request gauges
    nor a DCGM figure."""
    families = metric_families(text)
    try:
        reading: PodReading | None = reading_of(url, families)
    except MetricsError:
        reading = None
    gpu: dict[str, list[float]] = {GPU_UTIL: [], MEM_COPY_UTIL: [], POWER: [], POWER_LIMIT: []}
    preempted: float | None = None
    for family in families:
        for s in family.samples:
            if s.name in gpu:
                gpu[s.name].append(float(s.value))
            elif s.name == PREEMPTIONS:
                preempted = (preempted or 0.0) + float(s.value)
    if reading is None and not any(gpu.values()):
        raise MetricsError(f"{url} has neither vLLM's request gauges nor DCGM's GPU figures")

    def mean_pct(name: str) -> float | None:
        return sum(gpu[name]) / len(gpu[name]) / 100 if gpu[name] else None

    return Sample(
        at=at,
        vllm=reading,
        preemptions=preempted,
        gpu_util=mean_pct(GPU_UTIL),
        mem_copy_util=mean_pct(MEM_COPY_UTIL),
        power_w=sum(gpu[POWER]) if gpu[POWER] else None,
        power_limit_w=sum(gpu[POWER_LIMIT]) if gpu[POWER_LIMIT] else None,
    )


@dataclass(frozen=True)
class ResourceStats:
    """A level's resource figures (see the module docstring); None where not measured."""

    urls: int
    samples: int
    scrape_errors: int
    # Per vLLM server (the mean over the servers scraped).
    running_mean: float | None = None
    waiting_mean: float | None = None
    running_max: float | None = None
    waiting_max: float | None = None
    kv_cache_usage_mean: float | None = None
    kv_cache_usage_max: float | None = None
    preemptions: float | None = None
    gpu_utilization_mean: float | None = None
    memory_bandwidth_mean: float | None = None
    power_watts_mean: float | None = None
    power_fraction_mean: float | None = None
    # Resource → saturation (0 to 1), and the one nearest saturation.
    saturation: dict[str, float] = field(default_factory=dict)
    nearest: str | None = None
    last_error: str | None = None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _vllm_figures(per_url: Sequence[Sequence[Sample]]) -> dict[str, float | None]:
    """Running/waiting means by Little's law per server, then averaged over the servers."""
    running: list[float] = []
    waiting: list[float] = []
    kv: list[float] = []
    run_max: list[float] = []
    wait_max: list[float] = []
    preempted: list[float] = []
    for samples in per_url:
        readings = [(s.at, s.vllm) for s in samples if s.vllm is not None]
        if not readings:
            continue
        (t0, first), (t1, last) = readings[0], readings[-1]
        if len(readings) >= 2 and t1 > t0:
            pod = load(last, first, t1 - t0)
            running.append(pod.running)
            waiting.append(pod.waiting)
        kv.extend(r.kv_cache_usage for _, r in readings)
        run_max.append(max(r.running for _, r in readings))
        wait_max.append(max(r.waiting for _, r in readings))
        counts = [s.preemptions for s in samples if s.preemptions is not None]
        if len(counts) >= 2:
            preempted.append(max(0.0, counts[-1] - counts[0]))
    return {
        "running_mean": _mean(running),
        "waiting_mean": _mean(waiting),
        "running_max": max(run_max) if run_max else None,
        "waiting_max": max(wait_max) if wait_max else None,
        "kv_cache_usage_mean": _mean(kv),
        "kv_cache_usage_max": max(kv) if kv else None,
        "preemptions": sum(preempted) if preempted else None,
    }


def summarize_resources(
    per_url: Sequence[Sequence[Sample]], *, errors: int = 0, last_error: str | None = None
) -> ResourceStats | None:
    """A level's figures from each URL's samples, in time order: none but the failures'
    count and last error when every read failed; None when none was tried."""
    samples = [s for each in per_url for s in each]
    if not samples:
        if not errors:
            return None
        return ResourceStats(
            urls=len(per_url), samples=0, scrape_errors=errors, last_error=last_error
        )
    v = _vllm_figures(per_url)
    gpu = _mean([s.gpu_util for s in samples if s.gpu_util is not None])
    bandwidth = _mean([s.mem_copy_util for s in samples if s.mem_copy_util is not None])
    power = _mean([s.power_w for s in samples if s.power_w is not None])
    fractions = [
        s.power_w / s.power_limit_w for s in samples if s.power_w is not None and s.power_limit_w
    ]
    power_fraction = _mean(fractions)
    saturation: dict[str, float] = {}
    if v["kv_cache_usage_max"] is not None:
        full = 1.0 if (v["preemptions"] or 0) > 0 else 0.0
        saturation["kv-cache"] = max(v["kv_cache_usage_max"] or 0.0, full)
    running, waiting = v["running_mean"], v["waiting_mean"]
    if running is not None and waiting is not None:
        saturation["queue"] = waiting / (running + waiting) if running + waiting > 0 else 0.0
    for name, value in (
        ("gpu", gpu),
        ("memory-bandwidth", bandwidth),
        ("power", power_fraction),
    ):
        if value is not None:
            saturation[name] = value
    saturation = {k: round(min(1.0, max(0.0, x)), 4) for k, x in saturation.items()}
    nearest = (
        max(saturation, key=lambda k: (saturation[k], -RESOURCES.index(k))) if saturation else None
    )
    return ResourceStats(
        urls=len(per_url),
        samples=len(samples),
        scrape_errors=errors,
        gpu_utilization_mean=gpu,
        memory_bandwidth_mean=bandwidth,
        power_watts_mean=power,
        power_fraction_mean=power_fraction,
        saturation=saturation,
        nearest=nearest,
        last_error=last_error,
        **v,
    )
