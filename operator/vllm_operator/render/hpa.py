"""HPA mode: a standard autoscaling/v2 HorizontalPodAutoscaler on the InferenceService's
scale subresource, driven by a Pods metric that the cluster's metrics adapter serves
(for example prometheus-adapter exposing vLLM's gauges).

Its behaviour carries the same windows and rates as Operator mode. While a benchmark of
the service runs, ``behavior.scaleDown.selectPolicy`` is ``Disabled``: the HPA itself is
told not to scale down (the admission policy would refuse it anyway).
"""

from __future__ import annotations

from vllm_operator.constants import API_VERSION, KIND_INFERENCE_SERVICE
from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.render.meta import child_metadata

# The names prometheus-adapter's default rules give vLLM's gauges (':' becomes '_').
DEFAULT_METRIC_NAMES = {
    "RequestsWaiting": "vllm_num_requests_waiting",
    "RequestsRunning": "vllm_num_requests_running",
    "KVCacheUsage": "vllm_kv_cache_usage_perc",
}


def hpa_name(isvc: InferenceService) -> str:
    return isvc.metadata.name


def build_hpa(isvc: InferenceService, *, scale_down_held: bool) -> Manifest:
    auto = isvc.spec.autoscaling
    metric_name = auto.metric_name or DEFAULT_METRIC_NAMES[auto.metric]
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": child_metadata(isvc, hpa_name(isvc), "autoscaler"),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": API_VERSION,
                "kind": KIND_INFERENCE_SERVICE,
                "name": isvc.metadata.name,
            },
            "minReplicas": auto.min_replicas,
            "maxReplicas": auto.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": metric_name},
                        "target": {"type": "AverageValue", "averageValue": auto.target},
                    },
                }
            ],
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": auto.scale_up_window_seconds,
                    "selectPolicy": "Max",
                    "policies": [
                        {
                            "type": "Pods",
                            "value": auto.scale_up_pods,
                            "periodSeconds": auto.period_seconds,
                        }
                    ],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": auto.scale_down_window_seconds,
                    "selectPolicy": "Disabled" if scale_down_held else "Max",
                    "policies": [
                        {
                            "type": "Pods",
                            "value": auto.scale_down_pods,
                            "periodSeconds": auto.period_seconds,
                        }
                    ],
                },
            },
        },
    }
