"""The load generator against the real CPU vLLM: its numbers agree with vLLM's own.

vLLM measures every request itself and exports histograms on ``/metrics``. Scraped before
and after a short benchmark, their difference holds exactly the benchmark's requests. For
each percentile the client reports, the delta histogram's bucket that contains that
percentile must contain the client's value too, give or take one bucket width (vLLM times
from the request's arrival in the engine, the client from the request leaving it, so the
client's values are slightly larger). Token counters must match the usage the client
recorded, exactly.
"""

from __future__ import annotations

import math
from collections import defaultdict

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devenv.vllm_server import OneServer
from vllm_operator.bench import timing
from vllm_operator.bench.run import RunOptions, run_benchmark
from vllm_operator.bench.stats import Summary
from vllm_operator.models.inference_benchmark import InferenceBenchmarkSpec

pytestmark = pytest.mark.vllm

HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
}
COUNTERS = ("vllm:prompt_tokens", "vllm:generation_tokens")
# TTFT P99 is compared and printed but not held to vLLM's histogram. vLLM times TTFT from
# the request's arrival in the engine to its first output reaching the API server; on two
# shared cores the API server then sometimes holds a stream back for tens of ms and sends
# it in one piece (a few requests in a hundred). Every client sees that: `vllm bench serve`
# against the same server measured TTFT P50 11 ms and P99 86 ms where vLLM's histogram put
# P99 at or below 20 ms (docs/benchmarks/README.md). The median and P90, and P99 of ITL,
# TPOT and E2E, must agree.
EXEMPT = frozenset({("ttft", 99)})


def scrape(url: str) -> tuple[dict[str, dict[float, float]], dict[str, float]]:
    """Cumulative bucket counts per histogram (summed over label sets), and counters."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    counters: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_bucket") and family.name in HISTOGRAMS.values():
                buckets[family.name][float(sample.labels["le"])] += sample.value
            elif family.name in COUNTERS and sample.name.endswith("_total"):
                counters[family.name] += sample.value
    return buckets, counters


def bucket_of(delta: dict[float, float], p: float) -> tuple[float, float]:
    """The (lower, upper] bounds of the bucket holding the p-th percentile."""
    edges = sorted(delta)
    total = delta[math.inf]
    rank = max(1, math.ceil(p / 100 * total))
    lower = 0.0
    for edge in edges:
        if delta[edge] >= rank:
            return lower, edge
        lower = edge
    raise AssertionError("unreachable: the +Inf bucket holds every observation")


SPEC = InferenceBenchmarkSpec.model_validate(
    {
        "targetRef": {"name": "tiny"},
        "workload": {
            "promptTokens": {"type": "Uniform", "min": 16, "max": 256},
            "outputTokens": {"type": "Uniform", "min": 16, "max": 160},
        },
        # Light load: on two cores, a busy vLLM API server delays its own streaming, which
        # its histograms (taken inside the engine) cannot see.
        "arrival": {"process": "Poisson", "ratePerSecond": 2},
        "requests": 30,
        "endpoint": {"api": "Completions"},
        "seed": 3,
    }
)


def measure(url: str, options: RunOptions, seed: int) -> tuple[list[str], dict[str, str]]:
    """One benchmark between two scrapes: the disagreements, and every comparison."""
    before, counters_before = scrape(url)
    result = timing.run(run_benchmark(SPEC.model_copy(update={"seed": seed}), options))
    after, counters_after = scrape(url)

    (level,) = result.levels
    stats = level.stats
    records = level.recording.records
    assert stats.errors_by_kind == {}
    assert result.tokenizer == "server"

    # The same requests on both sides, and token counts from usage equal vLLM's counters.
    prompt_total = sum(r.prompt_tokens or 0 for r in records)
    output_total = sum(r.completion_tokens or 0 for r in records)
    assert counters_after["vllm:prompt_tokens"] - counters_before["vllm:prompt_tokens"] == (
        prompt_total
    )
    assert (
        counters_after["vllm:generation_tokens"] - counters_before["vllm:generation_tokens"]
        == output_total
    )
    # ignore_eos: every request generated exactly its planned output length.
    assert all(r.completion_tokens == r.output_tokens_planned for r in records)
    # Prompts built to exact token counts: the server's count differs from the plan by the
    # same special tokens (BOS) for every request.
    assert len({(r.prompt_tokens or 0) - r.prompt_tokens_planned for r in records}) == 1

    report: dict[str, str] = {}
    misses: list[str] = []
    for name, metric in HISTOGRAMS.items():
        delta = {le: after[metric][le] - before[metric].get(le, 0.0) for le in after[metric]}
        if name in ("ttft", "e2e", "tpot"):
            assert delta[math.inf] == stats.completed, name
        summary = getattr(stats.from_send, name)
        assert isinstance(summary, Summary)
        for p, ours in ((50, summary.p50), (90, summary.p90), (99, summary.p99)):
            lo, hi = bucket_of(delta, p)
            width = (hi - lo) if math.isfinite(hi) else lo
            line = f"client {ours * 1e3:.2f} ms, vLLM's bucket ({lo * 1e3:g}, {hi * 1e3:g}] ms"
            exempt = (name, p) in EXEMPT
            report[f"{name} P{p}"] = line + (" (not held: see EXEMPT)" if exempt else "")
            if not exempt and not lo - width <= ours <= hi + width:
                misses.append(f"{name} P{p}: {line}")
    return misses, report


# The client's clock against the server's histograms: CPU contention on the client's side
# (another test run beside it, 2026-12-01) moves its percentiles out of vLLM's buckets.
@pytest.mark.timing
def test_percentiles_agree_with_vllms_own_histograms(
    vllm_servers: OneServer,
    vllm_python: object,
    tiny_models: dict[str, object],
    vllm_log_dir: object,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = vllm_servers.get(
        tiny_models["tiny-llama"],  # type: ignore[arg-type]
        python=vllm_python,  # type: ignore[arg-type]
        log_dir=vllm_log_dir,  # type: ignore[arg-type]
    )
    # No preflight: every generation request vLLM sees during the scrape window is one of
    # the level's.
    options = RunOptions(
        endpoint=server.url, model=server.model_name, preflight=False, lag_limit_s=0.05
    )
    # A server's first requests are slow in ways its engine-side histograms do not see
    # (the API server's own first-use costs): warm it up outside the scrape window.
    timing.run(run_benchmark(SPEC.model_copy(update={"requests": 4, "seed": 100}), options))
    # vLLM's histograms start when a request reaches the engine and stop when its output
    # reaches the API server; the client also sees the API server's own delays. On two
    # shared cores that server sometimes holds a stream back and sends it in one piece
    # (tens of ms, one request in a few dozen), which moves a P99 of 30 requests. A client
    # that measured wrongly would disagree on every attempt; each attempt uses new prompts
    # (another seed), since prompts in vLLM's prefix cache stream in such bursts too.
    failures = []
    for attempt in range(2):
        misses, report = measure(server.url, options, seed=SPEC.seed + attempt)
        with capsys.disabled():
            print(f"\nbench vs vLLM /metrics, attempt {attempt + 1}:")
            for key, line in report.items():
                print(f"  {key}: {line}")
        if not misses:
            return
        failures.append(f"attempt {attempt + 1}: " + "; ".join(misses))
    raise AssertionError("\n".join(failures))


def test_a_level_reads_the_real_servers_resources(
    vllm_servers: OneServer,
    vllm_python: object,
    tiny_models: dict[str, object],
    vllm_log_dir: object,
) -> None:
    """``--metrics-url server`` against the real CPU vLLM: its own metrics parse, and the
    requests it held on average (Little's law from its sums) agree with the client's."""
    server = vllm_servers.get(
        tiny_models["tiny-llama"],  # type: ignore[arg-type]
        python=vllm_python,  # type: ignore[arg-type]
        log_dir=vllm_log_dir,  # type: ignore[arg-type]
    )
    options = RunOptions(
        endpoint=server.url,
        model=server.model_name,
        metrics_urls=(f"{server.url}/metrics",),
        metrics_interval_s=0.5,
    )
    spec = SPEC.model_copy(update={"requests": 20, "seed": 11})
    result = timing.run(run_benchmark(spec, options))
    (level,) = result.levels
    res = level.resources
    assert res is not None, "nothing read"
    assert res.scrape_errors == 0, res.last_error
    assert res.samples >= 4
    records = [r for r in level.recording.records if r.ok and r.sent and r.end]
    assert len(records) == 20
    # The client's side of Little's law: seconds its requests took, over the level's span.
    span = max(r.end or 0 for r in records) - min(r.sent or 0 for r in records)
    held = sum((r.end or 0) - (r.sent or 0) for r in records) / span
    print(f"\nrequests in the server: {res.running_mean} (vLLM's sums), {held:.3f} (client)")
    print(f"KV cache usage max {res.kv_cache_usage_max}, nearest saturation {res.nearest}")
    assert res.running_mean is not None and res.waiting_mean is not None
    # vLLM's sampler span starts before the first send and ends after the last answer, and
    # its clock starts when a request reaches the engine: a little lower than the client's.
    assert 0.5 * held <= res.running_mean + res.waiting_mean <= 1.05 * held
    assert res.kv_cache_usage_max is not None and 0 < res.kv_cache_usage_max <= 1
    assert res.preemptions == 0
    assert res.nearest in ("kv-cache", "queue")
