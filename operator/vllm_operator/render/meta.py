"""Names, labels and owner references of the objects rendered for an InferenceService.

Names are deterministic (a function of the InferenceService's name alone), so a restarted
operator finds what it created instead of creating twins.
"""

from __future__ import annotations

from typing import Final

from vllm_operator.constants import (
    API_VERSION,
    KIND_INFERENCE_SERVICE,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_SERVICE,
    MANAGED_BY,
)
from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest

SERVER_PORT: Final = 8000
SERVER_PORT_NAME: Final = "http"


def deployment_name(isvc: InferenceService) -> str:
    return isvc.metadata.name


def service_name(isvc: InferenceService) -> str:
    return isvc.metadata.name


def pdb_name(isvc: InferenceService) -> str:
    return isvc.metadata.name


def selector_labels(isvc: InferenceService) -> dict[str, str]:
    """The pods' selector: minimal and stable, since a Deployment's selector is immutable."""
    return {LABEL_SERVICE: isvc.metadata.name}


def selector_string(isvc: InferenceService) -> str:
    """The selector in the string form the scale subresource reports."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(isvc).items()))


def common_labels(isvc: InferenceService, component: str) -> dict[str, str]:
    return {
        LABEL_NAME: "vllm",
        LABEL_INSTANCE: isvc.metadata.name,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGED_BY,
        **selector_labels(isvc),
    }


def job_labels(app: str, owner_label: str, owner: str, component: str) -> dict[str, str]:
    """The labels of what a benchmark or a cache creates: the app's recommended labels and
    ``owner_label`` naming the owner (the operator's watches find the objects by it)."""
    return {
        LABEL_NAME: app,
        LABEL_INSTANCE: owner,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGED_BY,
        owner_label: owner,
    }


def controller_reference(kind: str, name: str, uid: str | None) -> Manifest:
    """Makes an object of ours (``kind`` of our API group) the controller of a child, so
    garbage collection removes the child with it."""
    if not uid:
        raise ValueError(f"{kind} {name} has no uid yet")
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owner_reference(isvc: InferenceService) -> Manifest:
    """Makes the InferenceService the controller of a child, so garbage collection
    removes the child with it (no finalizer needed)."""
    return controller_reference(KIND_INFERENCE_SERVICE, isvc.metadata.name, isvc.metadata.uid)


def child_metadata(isvc: InferenceService, name: str, component: str) -> Manifest:
    return {
        "name": name,
        "namespace": isvc.metadata.namespace,
        "labels": common_labels(isvc, component),
        "ownerReferences": [owner_reference(isvc)],
    }


def restricted_security_context() -> Manifest:
    """A container security context that passes Pod Security "restricted": the operator's
    own Jobs (warmup, benchmark load) run with it."""
    return {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
