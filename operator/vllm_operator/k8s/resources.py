"""Where each kind the operator touches lives in the Kubernetes API (a static table: no
discovery requests, so converging costs only the requests that do work)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from vllm_operator.constants import (
    API_VERSION,
    KIND_GPU_NODE,
    KIND_INFERENCE_BENCHMARK,
    KIND_INFERENCE_SERVICE,
    KIND_MODEL_CACHE,
    PLURAL_GPU_NODE,
    PLURAL_INFERENCE_BENCHMARK,
    PLURAL_INFERENCE_SERVICE,
    PLURAL_MODEL_CACHE,
)


@dataclass(frozen=True)
class Resource:
    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [prefix]
        if self.namespaced and namespace is not None:
            parts += ["namespaces", namespace]
        parts.append(self.plural)
        if name is not None:
            parts.append(name)
        return "/".join(parts)


_TABLE: Final = [
    Resource("v1", "Pod", "pods", True),
    Resource("v1", "Service", "services", True),
    Resource("v1", "Secret", "secrets", True),
    Resource("v1", "ConfigMap", "configmaps", True),
    Resource("v1", "PersistentVolumeClaim", "persistentvolumeclaims", True),
    Resource("v1", "Event", "events", True),
    Resource("v1", "ServiceAccount", "serviceaccounts", True),
    Resource("rbac.authorization.k8s.io/v1", "Role", "roles", True),
    Resource("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", True),
    Resource("v1", "Node", "nodes", False),
    Resource("v1", "Namespace", "namespaces", False),
    Resource("apps/v1", "Deployment", "deployments", True),
    Resource("batch/v1", "Job", "jobs", True),
    Resource("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", True),
    Resource("discovery.k8s.io/v1", "EndpointSlice", "endpointslices", True),
    Resource("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", True),
    Resource(API_VERSION, KIND_INFERENCE_SERVICE, PLURAL_INFERENCE_SERVICE, True),
    Resource(API_VERSION, KIND_INFERENCE_BENCHMARK, PLURAL_INFERENCE_BENCHMARK, True),
    # A multi-node service's workload (LeaderWorkerSet's CRD, when installed).
    Resource("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets", True),
    Resource(API_VERSION, KIND_GPU_NODE, PLURAL_GPU_NODE, False),
    Resource(API_VERSION, KIND_MODEL_CACHE, PLURAL_MODEL_CACHE, True),
]
_BY_KIND: Final = {(r.api_version, r.kind): r for r in _TABLE}


def resource_for(api_version: str, kind: str) -> Resource:
    try:
        return _BY_KIND[(api_version, kind)]
    except KeyError:
        raise KeyError(f"no API path known for {api_version} {kind}") from None
