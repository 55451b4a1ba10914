"""Representative InferenceServices for the unit tests, built from plain manifests."""

from __future__ import annotations

import copy
from typing import Any

from vllm_operator.models import InferenceService

BASE: dict[str, Any] = {
    "apiVersion": "inference.vllm-operator.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {
        "name": "chat",
        "namespace": "team-a",
        "uid": "0a1b2c3d-0000-4000-8000-000000000001",
        "generation": 3,
    },
    "spec": {"model": {"source": {"huggingFace": {"repo": "Qwen/Qwen2.5-0.5B-Instruct"}}}},
}


def isvc(**spec: Any) -> InferenceService:
    """The base service with ``spec`` fields replaced (top-level keys of spec)."""
    body = copy.deepcopy(BASE)
    body["spec"].update(spec)
    return InferenceService.model_validate(body)


GOLDEN_CASES: dict[str, dict[str, Any]] = {
    "single-gpu-hf": {"gpu": {"count": 1}},
    "tp2-with-shm": {
        "gpu": {"count": 2, "products": ["NVIDIA-H100-80GB-HBM3"]},
        "node": {"shmSize": "8Gi"},
        "replicas": 2,
    },
    "cpu-pinning": {"gpu": {"count": 1}, "node": {"cpuPinning": True, "cpus": 8, "memory": "32Gi"}},
    "hf-token": {
        "model": {
            "name": "llama",
            "source": {
                "huggingFace": {
                    "repo": "meta-llama/Llama-3.1-8B-Instruct",
                    "revision": "v1",
                    "tokenSecretRef": {"name": "hf", "key": "token"},
                }
            },
            "dtype": "bfloat16",
        },
        "tuning": {"profile": "FastStart", "overrides": {"max-model-len": "4096"}},
    },
    "pvc": {
        "model": {"source": {"pvc": {"claimName": "weights", "path": "/llama-70b"}}},
        "warmup": {"enabled": False},
        "podTemplate": {
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml"}],
            "nodeSelector": {"pool": "gpu"},
            "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
            "labels": {"team": "a"},
        },
    },
}
