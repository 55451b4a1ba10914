"""vLLM's /metrics text → one pod's reading."""

from __future__ import annotations

import pytest

from vllm_operator.autoscale.signals import delta, merge, quantile
from vllm_operator.releases.metrics import MetricsError, parse_metrics

# The shape vLLM 0.32's API server serves (two engines, as with data parallel 2).
TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="m"} 9.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 3.2
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="1.0",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 2.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 2.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 4.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 5.5
vllm:e2e_request_latency_seconds_sum{engine="1",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 10.0
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.25
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 10.0
# HELP vllm:prompt_tokens Number of prefill tokens processed.
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 160.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 32.0
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e9
# HELP vllm:generation_tokens Number of generation tokens processed.
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 640.0
vllm:generation_tokens_total{engine="1",model_name="m"} 128.0
# HELP vllm:request_success Count of successfully processed requests.
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 9.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 1.0
vllm:request_success_total{engine="1",finished_reason="length",model_name="m"} 2.0
"""


def test_engines_are_summed_and_kv_usage_averaged() -> None:
    r = parse_metrics("p", TEXT)
    assert (r.running, r.waiting) == (5.0, 1.0)
    assert (r.e2e_seconds, r.queue_seconds) == (7.5, 0.25)
    assert r.kv_cache_usage == pytest.approx(0.375)
    assert r.ttft == ((0.1, 5.0), (1.0, 10.0), (float("inf"), 12.0))
    # Counters: prompt and generated tokens together, requests of every finish reason; the
    # _created samples are not counts.
    assert (r.tokens, r.finished) == (960.0, 12.0)


def test_a_server_without_the_counters_reads_none_not_zero() -> None:
    r = parse_metrics("p", "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
    assert (r.tokens, r.finished) == (None, None)


def test_text_without_vllms_gauges_is_refused() -> None:
    with pytest.raises(MetricsError, match="num_requests_running"):
        parse_metrics("p", "# TYPE up gauge\nup 1\n")


def test_quantiles_interpolate_within_a_bucket() -> None:
    hist = ((0.1, 5.0), (1.0, 10.0), (float("inf"), 12.0))
    assert quantile(0.25, hist) == pytest.approx(0.06)  # rank 3 of 5 in (0, 0.1]
    assert quantile(0.5, hist) == pytest.approx(0.1 + 0.9 * 1 / 5)  # rank 6
    assert quantile(0.99, hist) == 1.0  # in +Inf: the highest finite bound
    assert quantile(0.5, ((0.1, 0.0), (float("inf"), 0.0))) is None


def test_deltas_and_merges() -> None:
    before = ((0.1, 5.0), (float("inf"), 6.0))
    now = ((0.1, 7.0), (float("inf"), 10.0))
    assert delta(now, None) is None
    assert delta(now, before) == ((0.1, 2.0), (float("inf"), 4.0))
    assert delta(before, now) == before  # counts went down: a restart
    assert merge([now, before]) == ((0.1, 12.0), (float("inf"), 16.0))
