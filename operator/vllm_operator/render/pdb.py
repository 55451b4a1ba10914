"""The PodDisruptionBudget that keeps voluntary disruptions (drains) to one pod at a time."""

from __future__ import annotations

from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.render.meta import child_metadata, pdb_name, selector_labels


def build_pdb(isvc: InferenceService) -> Manifest:
    """maxUnavailable 1: a drain evicts one replica at a time. With a single replica this
    still allows the eviction (a budget of zero would block node drains forever)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(isvc, pdb_name(isvc), "server"),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(isvc)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
