"""Multi-node services: the LeaderWorkerSet a multi-node plan runs as, read and judged.

A plan whose ``--nnodes`` is above 1 (tuning/multinode.py) is served by a
LeaderWorkerSet (render/lws.py) instead of a Deployment. This module holds what the
reconcile needs of it beyond rendering:

- :func:`read_groups`: whether the cluster serves ``leaderworkerset.x-k8s.io/v1`` at all
  (a LIST of the service's LeaderWorkerSets answers 404 when the CRD is not installed) and
  the service's own LeaderWorkerSet. Read only for a multi-node plan, so a single-node
  service costs no request more; and read from the apiserver, not from the runtime's
  watch store, which would never fill on a cluster without the CRD.
- :func:`not_installed`: the Stalled problem when the CRD is missing; the reconcile then
  renders nothing (no Service or PDB without a workload: never a half-rendered service).
- :func:`as_rollout`: the LeaderWorkerSet in the shape the status computation reads of a
  Deployment (spec.replicas, status replicas, ready, updated, available, generations),
  counted in groups: LWS counts a group ready only when every pod of it is.
- :func:`running_groups`: the groups running now, which a benchmark's scale-down lock holds.
- :func:`topology_key`: the rack or zone label that keeps a group together, from the
  candidate nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from vllm_operator.k8s.api import ApiError, ClusterAPI
from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.models.inference_service import EffectiveTuning
from vllm_operator.reconcile.placement import candidate_nodes
from vllm_operator.reconcile.status import Problem
from vllm_operator.render.lws import API_VERSION, KIND, group_size
from vllm_operator.render.meta import deployment_name, selector_string
from vllm_operator.tuning.multinode import placement_topology_key

__all__ = [
    "LWS_VERSION",
    "GroupView",
    "as_rollout",
    "is_multi_node",
    "not_installed",
    "read_groups",
    "running_groups",
    "topology_key",
]

# The LeaderWorkerSet release the cluster tier runs (devenv/cluster/versions.env; a test
# keeps the two the same), named in the Stalled message as the one tested.
LWS_VERSION: Final = "v0.9.0"


@dataclass(frozen=True)
class GroupView:
    """What one pass read of LeaderWorkerSets: whether the API is served, the service's
    own LeaderWorkerSet, and whether one of its name is someone else's."""

    installed: bool
    live: Manifest | None = None
    foreign: bool = False


def is_multi_node(tuning: EffectiveTuning) -> bool:
    return group_size(tuning) > 1


def _controlled_by(obj: Manifest, isvc: InferenceService) -> bool:
    owners = obj["metadata"].get("ownerReferences") or []
    return any(o.get("controller") and o.get("uid") == isvc.metadata.uid for o in owners)


async def read_groups(api: ClusterAPI, isvc: InferenceService) -> GroupView:
    """The service's LeaderWorkerSet, and whether the cluster has the kind at all. One
    LIST by the service's label: its 404 says the kind is not served, which a GET's 404
    (no such object) could not tell apart."""
    try:
        found = await api.list(
            API_VERSION, KIND, isvc.metadata.namespace, label_selector=selector_string(isvc)
        )
    except ApiError as err:
        if err.not_found:
            return GroupView(installed=False)
        raise
    name = deployment_name(isvc)
    named = [o for o in found if o["metadata"]["name"] == name]
    ours = [o for o in named if _controlled_by(o, isvc)]
    return GroupView(
        installed=True, live=ours[0] if ours else None, foreign=bool(named) and not ours
    )


def not_installed(tuning: EffectiveTuning) -> Problem:
    nodes = group_size(tuning)
    return Problem(
        "LeaderWorkerSetNotInstalled",
        f"The plan spreads one vLLM over {nodes} nodes, which runs as a LeaderWorkerSet "
        f"({API_VERSION}), but the cluster does not serve that API. Install LeaderWorkerSet "
        f"({LWS_VERSION} is the version tested) and let the operator manage leaderworkersets "
        "(docs/multi-node.md says how); nothing is rendered until then.",
    )


def running_groups(lws: Manifest | None) -> int:
    """The groups the LeaderWorkerSet asks for now (0 when there is none)."""
    return int(((lws or {}).get("spec") or {}).get("replicas", 0) or 0)


def as_rollout(lws: Manifest | None) -> Manifest | None:
    """The LeaderWorkerSet as the status reads a Deployment: counts are groups. A group
    is available when it is ready (LWS keeps no minReadySeconds of its own)."""
    if lws is None:
        return None
    status = lws.get("status") or {}
    ready = int(status.get("readyReplicas", 0) or 0)
    return {
        "kind": KIND,
        "metadata": {"generation": lws["metadata"].get("generation", 0)},
        "spec": {"replicas": running_groups(lws)},
        "status": {
            "observedGeneration": int(status.get("observedGeneration", 0) or 0),
            "replicas": int(status.get("replicas", 0) or 0),
            "readyReplicas": ready,
            "updatedReplicas": int(status.get("updatedReplicas", 0) or 0),
            "availableReplicas": ready,
        },
    }


def topology_key(isvc: InferenceService, nodes: list[Manifest]) -> str | None:
    return placement_topology_key(
        [n["metadata"].get("labels", {}) for n in candidate_nodes(isvc, nodes)]
    )
