"""The first apply of an InferenceService, decided offline: what ``vllm-operator render``
prints.

No second rendering path: the snapshot a pass would gather is built from what the caller
gives (one node of the GPU shape, its GPUNode, the ModelCache the service names) and from
what a first apply finds (no children, pods, Jobs, benchmarks or HPA yet), then the
reconcile's own pure steps run on it in the reconcile's order: :func:`plan`, the
LeaderWorkerSet for a multi-node plan, :func:`decide`, :func:`decide_rollout`.

What a first apply cannot know is assumed, and said in :attr:`Preview.assumed`:

- the cluster has as many nodes of the shape as the plan groups (one for a single-node
  plan), all schedulable and free, labelled as spec.podTemplate.nodeSelector asks, and
  serves LeaderWorkerSet;
- a ModelCache the service names has finished its download (its status is the one its
  reconcile writes then); without it, nothing could be rendered before it is Ready;
- Auto rollout: the first pods, nothing to replace (no live Deployment or pods read);
- Secrets and claims the spec names exist (the operator reports them in status; nothing
  here reads them, and none of them changes what is rendered);
- the InferenceTunings given are the namespace's (none given: none exist): the measured
  result they make the service take (reconcile/measured.py) is rendered, and said;
- the measurements given are the operator's store (none given: the plan is the
  roofline's alone).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Final

from vllm_operator.k8s.measurements import StoredMeasurements
from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.models.model_cache import ModelCache
from vllm_operator.reconcile.cache_use import USABLE, cache_name_of, use_cache
from vllm_operator.reconcile.groups import GroupView, is_multi_node
from vllm_operator.reconcile.inference_service import (
    Decision,
    NodeView,
    Snapshot,
    decide,
    decide_rollout,
    plan,
)
from vllm_operator.reconcile.placement import PlanOutcome
from vllm_operator.reconcile.rollout import RolloutChoice
from vllm_operator.render.lws import group_size
from vllm_operator.render.model_cache import claim_name, model_path
from vllm_operator.settings import OperatorSettings
from vllm_operator.tuning.measurements import Measurements

__all__ = ["PLACEHOLDER_UID", "Preview", "assume_downloaded", "first_apply"]

# The uid a manifest without one is rendered with: the builders make every child owned by
# the service's uid, which only the apiserver gives. Callers must not apply it: a child
# owned by a uid that no object has is deleted by the garbage collector.
PLACEHOLDER_UID: Final = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class Preview:
    """What the first pass over ``service`` would decide."""

    # The service as planned and rendered (with a ModelCache, served from its claim).
    service: InferenceService
    planned: PlanOutcome
    decision: Decision
    rollout: RolloutChoice | None
    # The serving image: the spec's, else the operator's default.
    image: str
    # What was assumed of the cluster, in words, one line each.
    assumed: list[str] = field(default_factory=list)
    # Why no node of the shape is one the pods may land on (spec.podTemplate.nodeSelector
    # contradicts a label of the shape), None when they may.
    unselected: str | None = None


def assume_downloaded(cache: Manifest) -> Manifest:
    """``cache`` with the status its reconcile writes once the download is verified: Ready,
    the claim and the model's folder in it (render/model_cache.py names both)."""
    model = ModelCache.model_validate(cache)
    done = copy.deepcopy(cache)
    done["status"] = {
        "phase": USABLE[0],
        "claimName": claim_name(model),
        "path": model_path(model),
    }
    return done


def _alike(
    node: Manifest, gpu_node: Manifest | None, count: int, selector: Mapping[str, str]
) -> NodeView:
    """``count`` nodes of ``node``'s shape: ``node`` itself, then copies named -2, -3, ...
    (with a copy of its GPUNode each, which goes by the node's name). Each carries the
    labels ``selector`` (spec.podTemplate.nodeSelector) asks for where ``node`` has none
    of that key: the nodes the pods are meant for carry them; a label of the shape that
    the selector contradicts stays, and no node is selected."""
    nodes: list[Manifest] = []
    gpu_nodes: list[Manifest] = []
    for index in range(count):
        suffix = "" if index == 0 else f"-{index + 1}"
        copied = copy.deepcopy(node)
        meta = copied["metadata"]
        meta["name"] = f"{node['metadata']['name']}{suffix}"
        meta["labels"] = {**selector, **(meta.get("labels") or {})}
        nodes.append(copied)
        if gpu_node is not None:
            twin = copy.deepcopy(gpu_node)
            twin["metadata"]["name"] = meta["name"]
            gpu_nodes.append(twin)
    return NodeView(nodes, gpu_nodes)


def _first_pass(
    view: NodeView,
    tunings: Sequence[Manifest] = (),
    measurements: Measurements | None = None,
) -> Snapshot:
    """What the gather of a first pass reads: the nodes, the namespace's InferenceTunings,
    the measurements store, and nothing of the service's yet."""
    return Snapshot(
        view=view,
        token_secret=None,
        claim=None,
        hpa=None,
        lock_jobs=[],
        warmup_jobs=[],
        pods=[],
        benchmarks=[],
        tunings=list(tunings),
        measurements=None if measurements is None else StoredMeasurements(measurements),
    )


def first_apply(
    isvc: InferenceService,
    node: Manifest,
    *,
    gpu_node: Manifest | None = None,
    cache: Manifest | None = None,
    tunings: Sequence[Manifest] = (),
    measurements: Measurements | None = None,
    settings: OperatorSettings,
    now: datetime,
) -> Preview:
    """The first pass over ``isvc`` on a cluster of nodes like ``node`` (``gpu_node``: its
        GPUNode, whose status the tuner prefers to the node's labels). ``cache``: the
        ModelCache the service names, as :func:`assume_downloaded` makes it. ``tunings``: the
        namespace's InferenceTunings, as served (their measured result is applied as the
        reconcile would). ``measurements``: the operator's measurements store, as read (the plan
    learns from it, tuning/learned.py). A service without a uid is rendered with
    :data:`PLACEHOLDER_UID`."""
    assumed: list[str] = []
    if not isvc.metadata.uid:
        isvc = isvc.model_copy(
            update={"metadata": isvc.metadata.model_copy(update={"uid": PLACEHOLDER_UID})}
        )
    name = cache_name_of(isvc)
    if name is not None and cache is not None:
        status = cache.get("status") or {}
        assumed.append(
            f"modelcache: {name} assumed Ready (its download finished): served from claim "
            f"{status.get('claimName')}, folder {status.get('path')}"
        )
    use = use_cache(isvc, cache)
    selector = isvc.spec.pod_template.node_selector
    served = use.service
    snap = _first_pass(_alike(node, gpu_node, 1, selector), tunings, measurements)
    planned = plan(served, snap, settings, use)
    size = 1
    if planned.does_not_fit is None and is_multi_node(planned.tuning):
        # A group needs that many nodes, and the kind in the cluster (read only then, as
        # the reconcile does); planned again on them, as a cluster with them would be.
        size = group_size(planned.tuning)
        snap = replace(
            _first_pass(_alike(node, gpu_node, size, selector), tunings, measurements),
            groups=GroupView(installed=True),
        )
        planned = plan(served, snap, settings, use)
        assumed.append(
            f"nodes: {size} alike (one per pipeline stage of a group), LeaderWorkerSet "
            "installed, no rack or zone label on them (so no exclusive topology)"
        )
    else:
        assumed.append("nodes: one of the shape given, schedulable, all its GPUs free")
    labels = node["metadata"].get("labels") or {}
    clash = sorted(k for k, v in selector.items() if k in labels and labels[k] != v)
    unselected = (
        "spec.podTemplate.nodeSelector asks "
        + ", ".join(f"{k}={selector[k]} where the GPU shape's node has {labels[k]}" for k in clash)
        if clash
        else None
    )
    if selector:
        assumed.append(
            "nodes: labelled as spec.podTemplate.nodeSelector asks ("
            + ", ".join(f"{k}={v}" for k, v in sorted(selector.items()))
            + ")"
        )
    decision = decide(served, snap, settings, now, use, planned)
    if decision.measured is not None:
        assumed.append(f"measured: {decision.measured.message}")
    decision, rollout = decide_rollout(served, decision, snap, cluster_pods=None)
    if rollout is not None:
        assumed.append(
            f"rollout: {rollout.strategy} ({rollout.message}; first apply assumed: no live "
            "Deployment or pods read)"
        )
    image = served.spec.image or settings.default_image
    return Preview(served, planned, decision, rollout, image, assumed, unselected)
