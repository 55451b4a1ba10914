"""Placement and plan of an InferenceService: which nodes its pods may land on (one set
of node rules for the tuner and the reconcile's GPU check), and the tuner over the GPU
profiles of those nodes.

Profiles come from each node's GPUNode status (what the node agent read through NVML)
when there is one, else from the node's labels (GPU Feature Discovery plus ours). The
tuner answers with a plan, a verdict that nothing fits (the reconcile then stalls and
never rolls out a Deployment that would run out of memory), or "spec only" when the
model's shape is unknown.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from pydantic import ValidationError

from vllm_operator.constants import (
    DEFAULT_SERVING_IMAGE,
    GPU_RESOURCE,
    NODE_LABEL_GPU_INTERCONNECT,
    NODE_LABEL_GPU_PRODUCT,
)
from vllm_operator.models import GPUNodeStatus, InferenceService, InferenceServiceSpec
from vllm_operator.models.base import Manifest
from vllm_operator.models.inference_service import EffectiveTuning
from vllm_operator.releases.version import TESTED_VERSION, DeployedVersion, deployed_version
from vllm_operator.tuning import (
    DoesNotFit,
    GPUProfile,
    Plan,
    SpecOnly,
    TuningResult,
    node_profile,
    plan_service,
    spec_only,
)
from vllm_operator.tuning.measurements import Measurements


@dataclass(frozen=True)
class PlanOutcome:
    tuning: EffectiveTuning
    # Set when nothing fits: Stalled with this reason, and no Deployment rollout.
    does_not_fit: DoesNotFit | None = None


def allocatable_gpus(node: Manifest) -> int:
    """The node's allocatable GPUs (0 when it advertises none, or nonsense)."""
    value = node.get("status", {}).get("allocatable", {}).get(GPU_RESOURCE, "0")
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def selectable(isvc: InferenceService, node: Manifest) -> bool:
    """Schedulable, and allowed by the pod template's node selector."""
    labels: dict[str, str] = node["metadata"].get("labels", {})
    return not node.get("spec", {}).get("unschedulable", False) and all(
        labels.get(k) == v for k, v in isvc.spec.pod_template.node_selector.items()
    )


def fits_placement(isvc: InferenceService, node: Manifest, tuning: EffectiveTuning) -> bool:
    """A node the rendered pods may land on: selectable, of an allowed GPU product, and of
    the interconnect class the plan requires."""
    labels: dict[str, str] = node["metadata"].get("labels", {})
    products = isvc.spec.gpu.products
    if products and labels.get(NODE_LABEL_GPU_PRODUCT) not in products:
        return False
    pod = tuning.pod
    wanted = pod.interconnect.lower() if pod is not None and pod.interconnect else None
    if wanted is not None and labels.get(NODE_LABEL_GPU_INTERCONNECT) != wanted:
        return False
    return selectable(isvc, node)


def candidate_nodes(isvc: InferenceService, nodes: list[Manifest]) -> list[Manifest]:
    """Selectable nodes with GPUs: what the tuner plans over."""
    return [n for n in nodes if selectable(isvc, n) and allocatable_gpus(n) > 0]


K = TypeVar("K")
V = TypeVar("V")


class _Memo(Generic[K, V]):
    """A bounded memo, least recently used out first. functools.lru_cache does not fit:
    the key is a manifest's (name, resourceVersion), not the manifest the value is built
    from, and an object without a resourceVersion (the unit tests' hand-made ones) must
    be built every time."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._values: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K | None, build: Callable[[], V]) -> V:
        """The value for ``key``, built once; built every time when ``key`` is None."""
        if key is None:
            return build()
        if key in self._values:
            self._values.move_to_end(key)
            return self._values[key]
        value = self._values[key] = build()
        if len(self._values) > self._size:
            self._values.popitem(last=False)
        return value


def _version(manifest: Manifest) -> str:
    return str(manifest["metadata"].get("resourceVersion") or "")


# GPUNode statuses as parsed, by (name, resourceVersion): a status is parsed once per
# change instead of in every pass of every service (at 200 GPUNodes of two GPUs each the
# parsing was 34 ms of each pass).
_PARSED: Final[_Memo[tuple[str, str], GPUNodeStatus | None]] = _Memo(4096)


def _gpu_node_status(gpu_node: Manifest) -> GPUNodeStatus | None:
    """The GPUNode's status, or None when it cannot be read (the node's labels are used
    then)."""

    def parse() -> GPUNodeStatus | None:
        try:
            return GPUNodeStatus.model_validate(gpu_node.get("status") or {})
        except ValidationError:
            return None

    version = _version(gpu_node)
    return _PARSED.get((str(gpu_node["metadata"].get("name")), version) if version else None, parse)


# Node profiles as built, by the node's and its GPUNode's (name, resourceVersion): a node's
# profile is built once per change of either, instead of for every node in every pass of
# every service (at 200 fake nodes, 4 % of the operator's samples while 500 services
# rolled in, py-spy).
_PROFILES: Final[_Memo[tuple[str, str, str], GPUProfile | None]] = _Memo(4096)


def _node_profile(node: Manifest, gpu_node: Manifest | None) -> GPUProfile | None:
    meta = node["metadata"]
    name, version = str(meta["name"]), _version(node)
    gpu_version = "" if gpu_node is None else _version(gpu_node)
    cacheable = bool(version) and (gpu_node is None or bool(gpu_version))

    def build() -> GPUProfile | None:
        status = _gpu_node_status(gpu_node) if gpu_node is not None else None
        return node_profile(meta.get("labels") or {}, status, node=name)

    return _PROFILES.get((name, version, gpu_version) if cacheable else None, build)


def gpu_profiles(nodes: list[Manifest], gpu_nodes: list[Manifest]) -> list[GPUProfile]:
    """One profile per node: from its GPUNode status when the agent published one."""
    wanted = {n["metadata"]["name"] for n in nodes}
    by_name = {name: gn for gn in gpu_nodes if (name := gn["metadata"]["name"]) in wanted}
    profiles = (_node_profile(n, by_name.get(n["metadata"]["name"])) for n in nodes)
    return [p for p in profiles if p is not None]


def _planning_spec(isvc: InferenceService) -> InferenceServiceSpec:
    """The spec the tuner plans with: the replica count pinned to one that does not move
    with scaling (autoscaling's minimum, else 1), because the per-pod arguments must not
    change when an HPA or ``kubectl scale`` changes spec.replicas: a changed argument
    rolls out every pod, which a scale operation must never do."""
    auto = isvc.spec.autoscaling
    replicas = max(1, auto.min_replicas) if auto.enabled else 1
    return isvc.spec.model_copy(update={"replicas": replicas})


def deployed_version_of(isvc: InferenceService, *, default_image: str) -> DeployedVersion:
    """The vLLM version ``isvc`` runs: spec.vllmVersion, its image's tag (the operator's
    default image when it names none), else the version the tests run."""
    return deployed_version(
        explicit=isvc.spec.vllm_version,
        image=isvc.spec.image,
        default_image=default_image,
        default=TESTED_VERSION,
    )


def plan_result(
    isvc: InferenceService,
    nodes: list[Manifest],
    gpu_nodes: list[Manifest],
    *,
    default_image: str = DEFAULT_SERVING_IMAGE,
    config: Mapping[str, Any] | None = None,
    model_name: str | None = None,
    measurements: Measurements | None = None,
    unread: Sequence[str] = (),
) -> TuningResult:
    """The tuner's answer for ``isvc`` on these nodes, as the tuner gives it: the plan
    the service runs (:func:`plan_inference_service`), and what a measured tuning run's
    candidates are built around (InferenceTuning: without ``measurements``, so that its
    predictions stay the roofline's and the error of each measurement is the tuner's).
    ``measurements``: the kept records the plan learns from (tuning/learned.py)."""
    return plan_service(
        _planning_spec(isvc),
        gpu_profiles(candidate_nodes(isvc, nodes), gpu_nodes),
        config=config,
        name=model_name or isvc.metadata.name,
        version=deployed_version_of(isvc, default_image=default_image),
        measurements=measurements,
        unread=unread,
    )


def plan_inference_service(
    isvc: InferenceService,
    nodes: list[Manifest],
    gpu_nodes: list[Manifest],
    *,
    default_image: str = DEFAULT_SERVING_IMAGE,
    config: Mapping[str, Any] | None = None,
    model_name: str | None = None,
    measurements: Measurements | None = None,
    unread: Sequence[str] = (),
) -> PlanOutcome:
    """The tuning in force for ``isvc`` on this cluster's nodes. ``config``: the model's
    config.json where the operator has it (a ModelCache's download read it);
    ``model_name``: the repository it came from, for the catalog (else the service's
    name); ``measurements``: the kept records the plan learns from, ``unread`` what of
    them could not be read (tuning/learned.py)."""
    result = plan_result(
        isvc,
        nodes,
        gpu_nodes,
        default_image=default_image,
        config=config,
        model_name=model_name,
        measurements=measurements,
        unread=unread,
    )
    if isinstance(result, Plan):
        return PlanOutcome(result.effective_tuning())
    if isinstance(result, SpecOnly):
        return PlanOutcome(result.effective_tuning())
    # Nothing fits: show what the spec alone says, and the verdict as the reason.
    fallback = spec_only(isvc.spec, result.message).effective_tuning()
    return PlanOutcome(fallback, does_not_fit=result)
