"""The Service in front of an InferenceService's vLLM pods."""

from __future__ import annotations

from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.render.meta import (
    SERVER_PORT,
    SERVER_PORT_NAME,
    child_metadata,
    selector_labels,
    service_name,
)


def build_service(isvc: InferenceService) -> Manifest:
    """A ClusterIP Service on the OpenAI-compatible port. Only Ready pods (warmed up, when
    warmup is on) receive traffic."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(isvc, service_name(isvc), "server"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(isvc),
            "ports": [
                {
                    "name": SERVER_PORT_NAME,
                    "port": SERVER_PORT,
                    "targetPort": SERVER_PORT_NAME,
                    "protocol": "TCP",
                    "appProtocol": "http",
                }
            ],
        },
    }


def endpoint_url(isvc: InferenceService) -> str:
    """The in-cluster base URL of the OpenAI-compatible API."""
    return f"http://{service_name(isvc)}.{isvc.metadata.namespace}.svc:{SERVER_PORT}/v1"
