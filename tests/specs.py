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


def lock_job(target: str = "chat", benchmark: str = "load") -> dict[str, Any]:
    """A running load Job of a benchmark: the scale-down lock on ``target``."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{benchmark}-load",
            "namespace": "team-a",
            "labels": {
                "inference.vllm-operator.dev/scale-down-lock": "true",
                "inference.vllm-operator.dev/lock-target": target,
                "inference.vllm-operator.dev/inference-benchmark": benchmark,
            },
        },
        "status": {"active": 1},
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
    # What a platform team sets: a RuntimeClass, pull secrets, its own affinity (the
    # operator's GPU rules join each required node term) and a spread over zones.
    "platform-pod-template": {
        "gpu": {"count": 1, "products": ["NVIDIA-L40S"]},
        "podTemplate": {
            "runtimeClassName": "nvidia",
            "imagePullSecrets": [{"name": "registry-creds"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "pool", "operator": "In",
                                                   "values": ["a"]}]},
                            {"matchExpressions": [{"key": "pool", "operator": "In",
                                                   "values": ["b"]}]},
                        ]
                    }
                },
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 100, "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {
                                "inference.vllm-operator.dev/inference-service": "chat"}}}}
                    ]
                },
            },
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone"}
            ],
            "volumes": [{"name": "certs", "secret": {"secretName": "ca-bundle"}}],
            "volumeMounts": [{"name": "certs", "mountPath": "/etc/ssl/custom", "readOnly": True}],
            "containerSecurityContext": {"allowPrivilegeEscalation": False,
                                         "capabilities": {"drop": ["ALL"]}},
            "resources": {"requests": {"ephemeral-storage": "20Gi"},
                          "limits": {"ephemeral-storage": "40Gi"}},
        },
    },
    # LoRA adapters from the three sources: the Hub (with the model's token), a claim
    # (mounted under /adapters) and the image; one declares a rank above the default.
    "lora-adapters": {
        "gpu": {"count": 1, "products": ["NVIDIA-L40S"]},
        "model": {
            "name": "llama",
            "source": {
                "huggingFace": {
                    "repo": "meta-llama/Llama-3.1-8B-Instruct",
                    "tokenSecretRef": {"name": "hf", "key": "token"},
                }
            },
        },
        "adapters": [
            {"name": "sql", "source": {"huggingFace": {"repo": "team/llama-sql-lora"}},
             "rank": 32},
            {"name": "support", "source": {"pvc": {"claimName": "adapters",
                                                   "path": "/support-v2"}}},
            {"name": "tone", "source": {"image": {"path": "/opt/adapters/tone"}}},
        ],
    },
    # The three rollout strategies (spec.rollout): Surge and Replace as asked; Auto on a
    # node pool with no room for one more replica resolves to Replace
    # (tests/render/test_golden.py renders it through the reconcile's choice).
    "rollout-surge": {"rollout": "Surge", "replicas": 2, "gpu": {"count": 1}},
    "rollout-replace": {"rollout": "Replace", "replicas": 2, "gpu": {"count": 1}},
    "rollout-auto-full-node": {"rollout": "Auto", "gpu": {"count": 1}},
}  # fmt: skip


def node(name: str, product: str, count: int, memory_mib: int, interconnect: str) -> dict[str, Any]:
    """A Node as GPU Feature Discovery (and our agent) label it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.count": str(count),
                "nvidia.com/gpu.memory": str(memory_mib),
                "inference.vllm-operator.dev/gpu-interconnect": interconnect,
            },
        },
        "status": {"allocatable": {"nvidia.com/gpu": str(count)}},
    }


NODES: list[dict[str, Any]] = [
    node("gpu-4090x2", "NVIDIA-GeForce-RTX-4090", 2, 24564, "pcie"),
    node("gpu-h100x8", "NVIDIA-H100-80GB-HBM3", 8, 81559, "nvlink"),
]


def plan_for(svc: InferenceService) -> Any:
    """The tuning the reconcile would put in force on NODES."""
    from vllm_operator.reconcile.placement import plan_inference_service

    return plan_inference_service(svc, NODES, []).tuning
