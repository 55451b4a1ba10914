"""Prometheus metrics the operator exports (names prefixed vllm_operator_)."""

from __future__ import annotations

from typing import Final

from prometheus_client import Counter, Gauge, Histogram

RECONCILES: Final = Counter(
    "vllm_operator_reconcile_total",
    "Reconciles by kind and result (ok, stalled, retry, error).",
    ["kind", "result"],
)
RECONCILE_SECONDS: Final = Histogram(
    "vllm_operator_reconcile_duration_seconds",
    "Time one reconcile took, by kind.",
    ["kind"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
CONDITIONS: Final = Gauge(
    "vllm_operator_condition",
    "1 when the object's condition has the given status.",
    ["kind", "namespace", "name", "condition", "status"],
)
QUEUE_DEPTH: Final = Gauge("vllm_operator_queue_depth", "Objects waiting to be reconciled.")
API_REQUESTS: Final = Counter(
    "vllm_operator_api_requests_total",
    "Requests the operator's reconcilers sent to the Kubernetes API (Kopf's watches aside), "
    "by verb (the HTTP method, or LIST) and resource.",
    ["verb", "resource"],
)
AUTOSCALER_SIGNAL: Final = Gauge(
    "vllm_operator_autoscaler_signal",
    "The autoscaling signal at the last reading (per-pod average for per-pod signals).",
    ["namespace", "name", "metric"],
)
AUTOSCALER_DESIRED: Final = Gauge(
    "vllm_operator_autoscaler_desired_replicas",
    "Replicas the autoscaler decided at its last reading.",
    ["namespace", "name"],
)
AUTOSCALER_DECISIONS: Final = Counter(
    "vllm_operator_autoscaler_decisions_total",
    "Autoscaler readings by decision (Steady, ScaleUp, ScaleDown, ScaleDownHeld, NoSignal).",
    ["decision"],
)
