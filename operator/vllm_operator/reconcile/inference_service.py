"""The one reconcile of an InferenceService: level-based, the same on create, update,
resume, drift and resync. One pass has three phases, each a section below:

- **gather**: every read, into one immutable :class:`Snapshot`, the independent reads at
  the same time. Nodes and GPUNodes come from the runtime's watch-fed caches, and the
  ``api`` the runtime passes serves the rest from its watches too (runtime/cache.py);
  only the Secret and the PVC a spec names, and objects outside the watches, are read;
- **decide**: pure functions of the snapshot: the plan, the problems, the replicas a
  benchmark's lock allows, the children to apply, the HPA to remove, the warmups' writes,
  the last benchmark; then the Deployment's rollout strategy (:func:`decide_rollout`),
  after the one read it may need (the cluster's pods, when a rollout starts under Auto).
  ``vllm-operator render`` runs the same steps offline (reconcile/preview.py);
- **apply**: server-side apply of what we own (not of a child that is as our last apply
  left it, when nothing we render of it changed), then the whole status computed from
  what was read and applied, written only if it changed; events only on transitions.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import ValidationError

from vllm_operator.constants import (
    ANNOTATION_FORCE_ROLLOUT,
    API_VERSION,
    KIND_GPU_NODE,
    LABEL_TUNING,
)
from vllm_operator.k8s.api import ApiError, ClusterAPI, apply_status
from vllm_operator.k8s.measurements import StoredMeasurements
from vllm_operator.models import InferenceService, InferenceServiceStatus
from vllm_operator.models.base import Manifest, field_errors
from vllm_operator.models.conditions import condition, find
from vllm_operator.models.inference_service import (
    BenchmarkSummary,
    EffectiveTuning,
    WarmupStatus,
)
from vllm_operator.reconcile.adapters import sync_adapters
from vllm_operator.reconcile.cache_use import CacheUse, read_cache, use_cache
from vllm_operator.reconcile.groups import (
    GroupView,
    as_rollout,
    is_multi_node,
    not_installed,
    read_groups,
    running_groups,
    topology_key,
)
from vllm_operator.reconcile.last_benchmark import latest_benchmark, list_benchmarks
from vllm_operator.reconcile.lock import list_lock_jobs, lock_holder
from vllm_operator.reconcile.measured import (
    MeasuredChoice,
    credit_measured,
    list_tunings,
    measured_overrides,
    with_measured,
)
from vllm_operator.reconcile.placement import (
    PlanOutcome,
    allocatable_gpus,
    fits_placement,
    plan_inference_service,
)
from vllm_operator.reconcile.rollout import (
    REASON_HELD,
    REASON_OUTAGE,
    RolloutChoice,
    choose,
    forced,
    room_needed,
)
from vllm_operator.reconcile.status import Observed, Problem, compute_status, ready_endpoints
from vllm_operator.reconcile.warmup import (
    WarmupDecision,
    apply_writes,
    decide_warmups,
    list_warmup_jobs,
    read_reports,
)
from vllm_operator.render.deployment import (
    build_deployment,
    gpus_per_replica,
    hf_token_ref,
    with_strategy,
)
from vllm_operator.render.hpa import build_hpa, hpa_name
from vllm_operator.render.lws import KIND as LWS_KIND
from vllm_operator.render.lws import build_leaderworkerset, group_size
from vllm_operator.render.meta import deployment_name, pdb_name, selector_string, service_name
from vllm_operator.render.pdb import build_pdb
from vllm_operator.render.service import build_service
from vllm_operator.servers.pods import PodClient
from vllm_operator.settings import OperatorSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """How a reconcile ended: ``stalled`` ones are not retried until something changes."""

    ready: bool
    stalled: bool


# --- gather ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    """The cluster's Nodes and GPUNodes as one reconcile pass reads them (the runtime's
    watch-fed caches; listed afresh when a caller has none)."""

    nodes: list[Manifest]
    gpu_nodes: list[Manifest]


async def list_nodes(api: ClusterAPI) -> NodeView:
    return NodeView(await api.list("v1", "Node"), await api.list(API_VERSION, KIND_GPU_NODE))


# Reads the measurements store (the runtime's: one shared read a minute at most).
MeasurementsRead = Callable[[], Awaitable[StoredMeasurements]]

# The children named after the service.
ChildKey = tuple[str, str, str]  # (kind, namespace, name)
# Of each child: the digest of what this operator last applied, and of the child as that
# apply left it (content_digest). A pass skips the apply when both still hold.
AppliedMemo = MutableMapping[ChildKey, tuple[str, str]]
CHILD_KINDS: Final = ("Deployment", "Service", "PodDisruptionBudget")
# The children that run the pods, applied after the others.
DEPLOYMENT: Final = "Deployment"
WORKLOAD_KINDS: Final = (DEPLOYMENT, LWS_KIND)
_CHILD_API: Final = {"Deployment": "apps/v1", "Service": "v1", "PodDisruptionBudget": "policy/v1"}


def _child_names(isvc: InferenceService) -> dict[str, str]:
    return {
        "Deployment": deployment_name(isvc),
        "Service": service_name(isvc),
        "PodDisruptionBudget": pdb_name(isvc),
        LWS_KIND: deployment_name(isvc),
    }


@dataclass(frozen=True)
class Snapshot:
    """Everything one pass reads, read before anything is decided or written."""

    view: NodeView
    # The Secret spec.model.source.huggingFace.tokenSecretRef names and the claim
    # spec.model.source.pvc names; None when missing or not named.
    token_secret: Manifest | None
    claim: Manifest | None
    # The HorizontalPodAutoscaler of the service's name, ours or not.
    hpa: Manifest | None
    # Jobs carrying the scale-down lock labels for this service (anyone's), and its
    # warmup Jobs: two LISTs, since no one label selector can ask for both.
    lock_jobs: list[Manifest]
    warmup_jobs: list[Manifest]
    pods: list[Manifest]
    # The namespace's InferenceBenchmarks (the last finished one of this service goes
    # into its status).
    benchmarks: list[Manifest]
    # The children of the service's names that it controls, as they stand, by kind (the
    # HPA among them when it is its own; a foreign child is in ``foreign`` instead).
    live: Mapping[str, Manifest] = field(default_factory=dict)
    # The reports of the finished warmup Jobs whose outcome is not on their pod yet.
    warmup_reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Children of the service's names that exist and that it does not control: someone
    # else's, never applied over (a Service of that name would be re-pointed at the vLLM
    # pods and, owned by the service, deleted with it).
    foreign: frozenset[str] = frozenset()
    # A multi-node plan's LeaderWorkerSets (reconcile/groups.py); None when the plan is
    # single-node, and nothing of the kind was read.
    groups: GroupView | None = None
    # The EndpointSlices carrying the service's label (its Service's, and anyone's so
    # labelled: status.ready_endpoints counts only the Service's).
    endpoint_slices: list[Manifest] = field(default_factory=list)
    # The namespace's InferenceTunings (reconcile/measured.py picks the measured result
    # the service runs with); none read for a trial child.
    tunings: list[Manifest] = field(default_factory=list)
    # The measurements measured tuning runs kept (k8s/measurements.py), which the plan
    # learns from (tuning/learned.py); None when the caller gave no way to read them.
    measurements: StoredMeasurements | None = None

    @property
    def live_deployment(self) -> Manifest | None:
        return self.live.get("Deployment")


async def _get(
    api: ClusterAPI, api_version: str, kind: str, name: str | None, ns: str | None
) -> Manifest | None:
    return await api.get(api_version, kind, name, ns) if name is not None else None


async def gather(
    api: ClusterAPI,
    isvc: InferenceService,
    view: NodeView | None,
    measurements: MeasurementsRead | None = None,
) -> Snapshot:
    """Every read of a pass. The independent reads go out together (objects, then
    lists); the reports of finished warmups, which depend on them, follow. The runtime
    passes an ``api`` that serves most of these from its watches (runtime/cache.py), and
    ``measurements``, its shared read of the measurements store that goes out once a
    minute at most (runtime/measurements.py)."""
    ns = isvc.metadata.namespace
    source = isvc.spec.model.source
    ref = hf_token_ref(isvc)
    names = _child_names(isvc)
    (nodes, token_secret, claim, hpa), children = await asyncio.gather(
        asyncio.gather(
            _view(api, view),
            _get(api, "v1", "Secret", ref.name if ref is not None else None, ns),
            _get(
                api,
                "v1",
                "PersistentVolumeClaim",
                source.pvc.claim_name if source.pvc is not None else None,
                ns,
            ),
            _read_hpa(api, isvc),
        ),
        asyncio.gather(*(api.get(_CHILD_API[kind], kind, names[kind], ns) for kind in CHILD_KINDS)),
    )
    (lock_jobs, warmup_jobs, pods, benchmarks, slices, tunings), stored = await asyncio.gather(
        asyncio.gather(
            list_lock_jobs(api, isvc),
            list_warmup_jobs(api, isvc) if isvc.spec.warmup.enabled else _empty(),
            api.list("v1", "Pod", ns, label_selector=selector_string(isvc)),
            list_benchmarks(api, isvc),
            api.list(
                "discovery.k8s.io/v1", "EndpointSlice", ns, label_selector=selector_string(isvc)
            ),
            list_tunings(api, isvc),
        ),
        _measurements(measurements),
    )
    found = {kind: obj for kind, obj in zip(CHILD_KINDS, children, strict=True) if obj}
    # Children of the service's names that it does not control: someone else's.
    foreign = frozenset(kind for kind, obj in found.items() if not _controlled_by(obj, isvc))
    reports = await read_reports(api, isvc, pods, warmup_jobs) if isvc.spec.warmup.enabled else {}
    return Snapshot(
        view=nodes,
        token_secret=token_secret,
        claim=claim,
        hpa=hpa,
        lock_jobs=lock_jobs,
        warmup_jobs=warmup_jobs,
        pods=pods,
        benchmarks=benchmarks,
        live={
            **{kind: obj for kind, obj in found.items() if kind not in foreign},
            **({"HorizontalPodAutoscaler": hpa} if hpa and _controlled_by(hpa, isvc) else {}),
        },
        warmup_reports=reports,
        foreign=foreign,
        endpoint_slices=slices,
        tunings=tunings,
        measurements=stored,
    )


async def _measurements(read: MeasurementsRead | None) -> StoredMeasurements | None:
    return await read() if read is not None else None


async def _read_hpa(api: ClusterAPI, isvc: InferenceService) -> Manifest | None:
    """The HPA of the service's name. Ours carry the service's label, so a LIST by it
    finds ours (the runtime's watches answer it); only in HPA mode does one without the
    label matter, which is someone else's and never taken over, so only then is it
    read by name."""
    ns = isvc.metadata.namespace
    name = hpa_name(isvc)
    labelled = await api.list(
        "autoscaling/v2", "HorizontalPodAutoscaler", ns, label_selector=selector_string(isvc)
    )
    for hpa in labelled:
        if hpa["metadata"]["name"] == name:
            return hpa
    auto = isvc.spec.autoscaling
    if auto.enabled and auto.mode == "HPA":
        return await api.get("autoscaling/v2", "HorizontalPodAutoscaler", name, ns)
    return None


async def _view(api: ClusterAPI, view: NodeView | None) -> NodeView:
    return view if view is not None else await list_nodes(api)


async def _empty() -> list[Manifest]:
    return []


# --- decide ---------------------------------------------------------------------------------


def find_problems(
    isvc: InferenceService,
    tuning: EffectiveTuning,
    snap: Snapshot,
    *,
    check_gpus: bool = True,
) -> list[Problem]:
    """What keeps the spec from being served, each with a reason a user can act on."""
    problems: list[Problem] = []
    ns = isvc.metadata.namespace
    ref = hf_token_ref(isvc)
    if ref is not None:
        hf = isvc.spec.model.source.hugging_face
        where = (
            "spec.model.source.huggingFace.tokenSecretRef"
            if hf is not None and hf.token_secret_ref is not None
            else "spec.adapters[].source.huggingFace.tokenSecretRef"
        )
        secret = snap.token_secret
        if secret is None:
            problems.append(
                Problem(
                    "SecretNotFound",
                    f"Secret {ref.name} named in {where} does not exist in namespace {ns}.",
                )
            )
        elif ref.key not in (secret.get("data") or {}) | (secret.get("stringData") or {}):
            problems.append(
                Problem(
                    "SecretKeyNotFound", f"Secret {ref.name} has no key {ref.key} ({where}.key)."
                )
            )
    pvc = isvc.spec.model.source.pvc
    if pvc is not None and snap.claim is None:
        problems.append(
            Problem(
                "PersistentVolumeClaimNotFound",
                f"PersistentVolumeClaim {pvc.claim_name} named in spec.model.source.pvc "
                f"does not exist in namespace {ns}.",
            )
        )
    # A multi-node group needs ``size`` nodes of one pod's GPUs each (one pod per node).
    size = group_size(tuning)
    need = gpus_per_replica(tuning) // size
    if check_gpus and need > 0:
        candidates = [n for n in snap.view.nodes if fits_placement(isvc, n, tuning)]
        enough = sum(allocatable_gpus(n) >= need for n in candidates)
        where = (
            f" among nodes with products {', '.join(isvc.spec.gpu.products)}"
            if isvc.spec.gpu.products
            else ""
        )
        if size == 1 and not enough:
            most = max((allocatable_gpus(n) for n in candidates), default=0)
            problems.append(
                Problem(
                    "NoNodeHasEnoughGPUs",
                    f"A replica needs {need} GPUs on one node, but no schedulable node{where} "
                    f"has that many allocatable (the most is {most}).",
                )
            )
        elif size > 1 and enough < size:
            problems.append(
                Problem(
                    "NotEnoughNodesForGroup",
                    f"A replica is a group of {size} pods on {size} nodes with {need} GPUs "
                    f"each, but {enough} schedulable node{'s' if enough != 1 else ''}{where} "
                    f"{'have' if enough != 1 else 'has'} that many allocatable.",
                )
            )
    return problems


def _controlled_by(obj: Manifest, isvc: InferenceService) -> bool:
    owners = obj["metadata"].get("ownerReferences") or []
    return any(o.get("controller") and o.get("uid") == isvc.metadata.uid for o in owners)


def _hpa(
    isvc: InferenceService, existing: Manifest | None, *, blocked_by: str | None
) -> tuple[Manifest | None, bool, Problem | None]:
    """(the HPA to apply in HPA mode, whether the one we rendered before goes, a
    conflict). An HPA of that name that is not ours is never taken over or deleted."""
    name = hpa_name(isvc)
    ours = existing is None or _controlled_by(existing, isvc)
    auto = isvc.spec.autoscaling
    if auto.enabled and auto.mode == "HPA":
        if not ours:
            return (
                None,
                False,
                Problem(
                    "HPAConflict",
                    f"spec.autoscaling.mode: HPA needs the HorizontalPodAutoscaler {name}, and "
                    "one of that name exists that this InferenceService does not own; it is "
                    "left as it is. Delete or rename it, or use mode Operator.",
                ),
            )
        return build_hpa(isvc, scale_down_held=blocked_by is not None), False, None
    return None, existing is not None and ours, None


def _foreign(isvc: InferenceService, kind: str) -> Problem:
    name = _child_names(isvc)[kind]
    return Problem(
        f"{kind}Conflict",
        f"A {kind} named {name} exists in namespace {isvc.metadata.namespace} that this "
        "InferenceService does not own; it is left as it is and none of it is changed. "
        "Delete or rename it, or give the InferenceService another name.",
    )


@dataclass(frozen=True)
class Decision:
    """What a pass will write, and what the status needs of what it decided."""

    tuning: EffectiveTuning
    problems: list[Problem]
    desired_replicas: int
    scale_down_blocked_by: str | None
    # In apply order; the Deployment, when there is one, is last.
    children: list[Manifest]
    delete_hpa: bool
    warmup: WarmupDecision
    last_benchmark: BenchmarkSummary | None
    # When no Deployment is applied: the one read in the gather, if any, for the status;
    # a foreign one is not this service's and counts as none. For a multi-node plan, the
    # LeaderWorkerSet in a Deployment's shape (groups.as_rollout).
    live_deployment: Manifest | None = None
    # The kind of the workload: Deployment, or LeaderWorkerSet for a multi-node plan.
    workload: str = "Deployment"
    # The measured result the arguments come from, or the one asked for and why it is
    # not applied (reconcile/measured.py); None when none is asked for.
    measured: MeasuredChoice | None = None
    # The benchmark (or lock Job) that holds a change of the pods back; the lock of the
    # in-place tuning whose trial the change is does not (it rolls the trial out).
    rollout_held_by: str | None = None


def decide(
    isvc: InferenceService,
    snap: Snapshot,
    settings: OperatorSettings,
    now: datetime,
    cache: CacheUse | None = None,
    planned: PlanOutcome | None = None,
) -> Decision:
    """``isvc`` as served: with a ModelCache, the service with the cache's claim as its
    source (``cache``: what ``use_cache`` made of it). ``planned``: the plan, when the
    caller made it already (from the same snapshot)."""
    cache = cache or CacheUse(isvc)
    planned = planned or plan(isvc, snap, settings, cache)
    tuning = planned.tuning
    # A multi-node plan runs as a LeaderWorkerSet (reconcile/groups.py): without the
    # kind in the cluster nothing at all is rendered, not even the Service and PDB.
    multi = planned.does_not_fit is None and is_multi_node(tuning)
    lws_missing = multi and (snap.groups is None or not snap.groups.installed)
    live_groups = snap.groups.live if multi and snap.groups is not None else None
    problems = find_problems(isvc, tuning, snap, check_gpus=planned.does_not_fit is None)
    if cache.stalled is not None:
        problems.insert(0, cache.stalled)
    if planned.does_not_fit is not None:
        verdict = planned.does_not_fit
        problems.insert(0, Problem(verdict.reason, verdict.message))
    if lws_missing:
        problems.insert(0, not_installed(tuning))
    desired = isvc.spec.replicas
    blocked_by = lock_holder(snap.lock_jobs)
    if blocked_by is not None:
        # A benchmark runs: never fewer replicas (groups, multi-node) than are running now
        # (scale-up is fine).
        running = running_groups(live_groups if multi else snap.live_deployment)
        desired = max(desired, running)
    children = [build_service(isvc), build_pdb(isvc)]
    hpa, delete_hpa, conflict = _hpa(isvc, snap.hpa, blocked_by=blocked_by)
    problems += [_foreign(isvc, kind) for kind in CHILD_KINDS if kind in snap.foreign]
    if hpa is not None:
        children.append(hpa)
    if conflict is not None:
        problems.append(conflict)
    image = isvc.spec.image or settings.default_image
    if multi and snap.groups is not None and snap.groups.foreign:
        problems.append(_foreign(isvc, LWS_KIND))
    if planned.does_not_fit is None and cache.stalled is None and cache.waiting is None:
        # Never a Deployment that will run out of memory: when nothing fits, the one
        # running (if any) stays as it is until the spec or the nodes change. Nor one
        # before its ModelCache is usable: the pods would start on a half-written claim.
        if not multi:
            children.append(build_deployment(isvc, tuning, image=image, replicas=desired))
        elif snap.groups is not None and snap.groups.installed and not snap.groups.foreign:
            key = topology_key(isvc, snap.view.nodes)
            children.append(
                build_leaderworkerset(isvc, tuning, image=image, groups=desired, topology_key=key)
            )
    if lws_missing:
        children = []
    warmup = decide_warmups(
        isvc,
        tuning,
        snap.pods,
        snap.warmup_jobs,
        snap.warmup_reports,
        image=settings.warmup_image,
        resources=settings.warmup_resources.to_wire(),
        now=now,
    )
    children = [c for c in children if c["kind"] not in snap.foreign]
    measured = measured_overrides(isvc, snap.tunings)
    return Decision(
        tuning=tuning,
        problems=problems,
        desired_replicas=desired,
        scale_down_blocked_by=blocked_by,
        children=children,
        delete_hpa=delete_hpa,
        warmup=warmup,
        last_benchmark=latest_benchmark(isvc, snap.benchmarks),
        live_deployment=as_rollout(live_groups) if multi else snap.live_deployment,
        workload=LWS_KIND if multi else DEPLOYMENT,
        measured=measured,
        rollout_held_by=lock_holder(_not_in_place_lock(snap.lock_jobs, measured)),
    )


def _not_in_place_lock(jobs: list[Manifest], measured: MeasuredChoice | None) -> list[Manifest]:
    """The lock Jobs but the one of the tuning whose in-place trial the service runs: that
    lock keeps the service from scaling down through the run, but the trial's own rollout
    (and the one back at its end) is what the run asks for."""
    if measured is None or measured.reason != "InPlaceTrial":
        return jobs
    return [
        j
        for j in jobs
        if ((j.get("metadata") or {}).get("labels") or {}).get(LABEL_TUNING) != measured.name
    ]


def plan(
    isvc: InferenceService, snap: Snapshot, settings: OperatorSettings, cache: CacheUse
) -> PlanOutcome:
    """The tuning in force for ``isvc`` on the snapshot's nodes: with a measured result
    applied (reconcile/measured.py), planned with its flags laid over
    spec.tuning.overrides, and those arguments credited to it."""
    measured = measured_overrides(isvc, snap.tunings)
    stored = snap.measurements
    planned = plan_inference_service(
        with_measured(isvc, measured),
        snap.view.nodes,
        snap.view.gpu_nodes,
        default_image=settings.default_image,
        config=cache.config,
        model_name=cache.model_name,
        measurements=stored.measurements if stored is not None else None,
        unread=stored.unread if stored is not None else (),
    )
    if measured is None or not measured.applied:
        return planned
    credited = credit_measured(planned.tuning, measured, isvc.spec.tuning.overrides)
    return replace(planned, tuning=credited)


def _deployment_at(decision: Decision) -> int | None:
    return next((i for i, c in enumerate(decision.children) if c["kind"] == DEPLOYMENT), None)


def decide_rollout(
    isvc: InferenceService,
    decision: Decision,
    snap: Snapshot,
    *,
    cluster_pods: list[Manifest] | None,
    unreadable: str | None = None,
) -> tuple[Decision, RolloutChoice | None]:
    """The decision with the Deployment's strategy set, and the choice (None without a
    Deployment); while a benchmark runs, the decision without the Deployment unless the
    service is annotated to force the rollout: it is then left as it stands (its replicas
    too, which the lock keeps from going down). Pure: ``cluster_pods`` are the cluster's
    pods where :func:`room_needed` had them read (None otherwise), ``unreadable`` why
    they could not be."""
    at = _deployment_at(decision)
    if at is None:
        return decision, None
    rendered, live = decision.children[at], snap.live_deployment
    before = isvc.status.rollout if isvc.status else None
    choice = choose(
        isvc,
        decision.tuning,
        rendered,
        live,
        nodes=snap.view.nodes,
        cluster_pods=cluster_pods,
        service_pods=snap.pods,
        stored=(before.strategy, before.message) if before else None,
        unreadable=unreadable,
    )
    children = list(decision.children)
    benchmark = decision.rollout_held_by
    if choice.starts and benchmark is not None and not forced(isvc):
        del children[at]
        held = RolloutChoice(
            choice.strategy,
            f"Held: InferenceBenchmark {benchmark} is running; the change of the pods rolls "
            f"out when it ends (or annotate the InferenceService {ANNOTATION_FORCE_ROLLOUT}="
            f'"true" to roll it out now). {choice.message}'[:1024],
            held=True,
        )
        return replace(decision, children=children), held
    children[at] = with_strategy(rendered, choice.strategy)
    return replace(decision, children=children), choice


# --- apply ----------------------------------------------------------------------------------


def content_digest(obj: Manifest, rendered: Manifest | None = None) -> str:
    """A digest of what server-side apply sets of a child: its labels, annotations, owner
    references and spec (not its status, nor the fields every write changes). With
    ``rendered``, only the labels and annotations that it sets count: others' (the
    Deployment controller's revision annotation) are not ours to apply back."""
    meta = obj.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    if rendered is not None:
        ours = rendered.get("metadata") or {}
        labels = {k: labels.get(k) for k in ours.get("labels") or {}}
        annotations = {k: annotations.get(k) for k in ours.get("annotations") or {}}
    content = {
        "labels": labels,
        "annotations": annotations,
        "ownerReferences": meta.get("ownerReferences") or [],
        "spec": obj.get("spec"),
    }
    text = json.dumps(content, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


async def _apply_children(
    api: ClusterAPI,
    isvc: InferenceService,
    decision: Decision,
    live: Mapping[str, Manifest],
    applied: AppliedMemo | None,
) -> tuple[Manifest | None, list[Problem]]:
    """Apply the children; the Deployment as it stands after that, and what the
    apiserver refused.

    With ``applied`` (the runtime's memo) a child is not applied again while what we
    render of it is what we last applied and the child is as that apply left it: such an
    apply changes nothing. An edit by hand or by another controller changes the child,
    whose watch event brings a pass that applies it again."""
    ns = isvc.metadata.namespace or ""

    async def apply(child: Manifest) -> tuple[Manifest | None, Problem | None]:
        """(the child as applied, None when skipped or refused; what was refused)."""
        kind = child["kind"]
        key = (kind, ns, child["metadata"]["name"])
        rendered = content_digest(child)
        current = live.get(kind)
        if (
            applied is not None
            and current is not None
            and applied.get(key) == (rendered, content_digest(current, child))
        ):
            return None, None
        try:
            result = await api.apply(child)
        except ApiError as err:
            if applied is not None:
                applied.pop(key, None)
            if err.transient or err.namespace_terminating:
                raise  # retried; or the namespace goes, and the service with it
            # The apiserver refused what we rendered (a value the CRD let through but the
            # child's own validation does not): a spec problem, not something to retry.
            return None, Problem("ChildRejected", f"The apiserver rejected the {kind}: {err}")
        if applied is not None:
            applied[key] = (rendered, content_digest(result, child))
        return result, None

    # The Service, PDB and HPA at once (none depends on another), then the workload (the
    # Deployment, or a multi-node plan's LeaderWorkerSet), whose pods then start with their
    # Service and budget in place.
    first = [c for c in decision.children if c["kind"] not in WORKLOAD_KINDS]
    last = [c for c in decision.children if c["kind"] in WORKLOAD_KINDS]
    outcomes = list(await asyncio.gather(*(apply(c) for c in first)))
    outcomes += [await apply(c) for c in last]
    rejected = [problem for _, problem in outcomes if problem is not None]
    deployment: Manifest | None = decision.live_deployment
    for child, (result, problem) in zip(first + last, outcomes, strict=True):
        if child["kind"] == "Deployment":
            deployment = None if problem is not None else result or deployment
        elif child["kind"] == LWS_KIND:
            deployment = None if problem is not None else as_rollout(result) or deployment
    if decision.delete_hpa:
        await api.delete("autoscaling/v2", "HorizontalPodAutoscaler", hpa_name(isvc), ns)
        if applied is not None:
            applied.pop(("HorizontalPodAutoscaler", ns, hpa_name(isvc)), None)
    return deployment, rejected


async def _rollout(
    api: ClusterAPI, isvc: InferenceService, decision: Decision, snap: Snapshot
) -> tuple[Decision, RolloutChoice | None]:
    """The Deployment's strategy (spec.rollout; reconcile/rollout.py), and no rollout at all
    while a benchmark runs unless the service is annotated to force it: the one read it
    needs, then :func:`decide_rollout`."""
    at = _deployment_at(decision)
    if at is None:
        return decision, None
    rendered, live = decision.children[at], snap.live_deployment
    # The cluster's pods are read only in the pass that starts a rollout under Auto. An
    # operator limited to some namespaces (the chart's watchNamespaces) may not list them
    # all: it surges then, and a surge pod that cannot be placed turns it to Replace.
    pods: list[Manifest] | None = None
    unreadable: str | None = None
    if room_needed(isvc, rendered, live):
        try:
            pods = await api.list("v1", "Pod")
        except ApiError as err:
            if err.transient:
                raise
            unreadable = str(err)[:300]
    return decide_rollout(isvc, decision, snap, cluster_pods=pods, unreadable=unreadable)


async def _rollout_events(
    api: ClusterAPI, body: Manifest, choice: RolloutChoice, status: InferenceServiceStatus | None
) -> None:
    """Before the apply: a rollout that leaves no replica serving says so; a rollout held by
    a benchmark says so once."""
    if choice.outage:
        await api.event(body, reason=REASON_OUTAGE, message=choice.message, warning=True)
    before = status.rollout if status else None
    if choice.held and (before is None or before.message != choice.message):
        await api.event(body, reason=REASON_HELD, message=choice.message)


def _stored_status(body: Manifest) -> InferenceServiceStatus | None:
    raw = body.get("status")
    if not raw:
        return None
    try:
        return InferenceServiceStatus.model_validate(raw)
    except ValidationError:
        return None  # written by an older version: recompute from scratch


async def _write_stalled(
    api: ClusterAPI,
    body: Manifest,
    reason: str,
    message: str,
    now: datetime,
    *,
    observed: bool,
) -> None:
    """Ready=False, Stalled=True, Reconciling=False with ``reason`` and one warning event,
    unless the status says that already. ``observed``: the generation was read (an invalid
    spec), so observedGeneration moves; a failure of the operator's own observed nothing."""
    gen = body["metadata"].get("generation")
    conds = [
        condition("Ready", False, reason, message, now=now, generation=gen),
        condition("Stalled", True, reason, message, now=now, generation=gen),
        condition("Reconciling", False, reason, message, now=now, generation=gen),
    ]
    old = [c.get("message") for c in (body.get("status") or {}).get("conditions", [])]
    if old == [c.message for c in conds]:
        return
    status: Manifest = {"conditions": [c.to_wire() for c in conds]}
    if observed:
        status = {"observedGeneration": gen, **status}
    await apply_status(api, body, status)
    await api.event(body, reason=reason, message=message, warning=True)


async def _invalid(api: ClusterAPI, body: Manifest, err: ValidationError, now: datetime) -> None:
    """A stored object the models reject (admission was bypassed or the CRD is older):
    say so in status and stop; nothing is rendered from a spec we cannot read."""
    fields = field_errors(err, limit=5)
    message = f"The spec is invalid: {fields}"
    await _write_stalled(api, body, "InvalidSpec", message, now, observed=True)


# Condition reasons of status False that are news, not warnings (Kubernetes' convention:
# Normal for an expected transition, Warning for what needs attention): a service on its
# way to Ready (created, rolling out, warming up, waiting for its endpoints or its model
# cache), a tuning still running, and a winner no better than the arguments in force.
_NOT_WARNINGS: Final = (
    "Creating",
    "RollingOut",
    "WarmingUp",
    "AwaitingEndpoints",
    "WaitingForModel",
    "TuningNotFinished",
    "NotDistinguishable",
)


async def _events(
    api: ClusterAPI,
    body: Manifest,
    old: InferenceServiceStatus | None,
    new: InferenceServiceStatus,
) -> None:
    """Events on transitions only: Ready changing, a new reason to be Stalled, a new
    reason an adapter did not load, or a measured result applied, dropped or refused
    (Tuned; a tuning still running, or a winner not distinguishable, is no warning)."""
    before = old.conditions if old else []
    for type_ in ("Ready", "Stalled", "AdaptersLoaded", "Tuned"):
        was, now = find(before, type_), find(new.conditions, type_)
        if now is None or (
            was is not None and (was.status, was.reason) == (now.status, now.reason)
        ):
            continue
        if type_ == "Stalled" and now.status != "True":
            continue
        if type_ == "AdaptersLoaded" and (now.status == "True" or now.reason == "Loading"):
            continue
        if type_ == "Ready" and was is None and now.status != "True":
            continue
        await api.event(
            body,
            reason=now.reason,
            message=now.message,
            warning=type_ == "Stalled"
            or (now.status != "True" and now.reason not in _NOT_WARNINGS),
        )


async def reconcile_inference_service(
    api: ClusterAPI,
    body: Manifest,
    *,
    settings: OperatorSettings,
    now: datetime | None = None,
    view: NodeView | None = None,
    applied: AppliedMemo | None = None,
    http: PodClient | None = None,
    measurements: MeasurementsRead | None = None,
) -> Outcome:
    """Bring one InferenceService's children and status to what its spec asks for.

    ``view``: the runtime's Nodes and GPUNodes (listed afresh when not given);
    ``applied``: the runtime's memo of what it applied (every child is applied when not
    given); ``http``: the client that reaches the vLLM servers, to load their LoRA
    adapters (none: the adapters are counted as not loaded); ``measurements``: reads the
    measurements store the plan learns from (none: planned from the roofline alone)."""
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    try:
        isvc = InferenceService.model_validate(body)
    except ValidationError as err:
        await _invalid(api, body, err, now)
        return Outcome(ready=False, stalled=True)
    try:
        return await _reconcile(
            api,
            body,
            isvc,
            settings=settings,
            now=now,
            view=view,
            applied=applied,
            http=http,
            measurements=measurements,
        )
    except ApiError:
        raise  # the runtime retries the transient ones with back-off
    except Exception as err:
        # A fault of the operator's own (a bug, an input nothing validated): the status
        # says so, then the runtime retries with back-off as for any failure.
        await _failed(api, body, err, now)
        raise


async def _failed(api: ClusterAPI, body: Manifest, err: Exception, now: datetime) -> None:
    message = (
        f"The operator failed on this InferenceService ({type(err).__name__}: "
        f"{str(err)[:300]}); it retries with back-off. This is the operator's fault: the "
        "operator's log has the traceback."
    )
    try:
        await _write_stalled(api, body, "ReconcileFailed", message, now, observed=False)
    except ApiError:
        log.warning("Writing the failure into the status failed too.", exc_info=True)


async def report_repeated_error(
    api: ClusterAPI, body: Manifest, err: ApiError, times: int, now: datetime | None = None
) -> None:
    """An internal error the apiserver gave ``times`` passes in a row, the same each time:
    not transient after all (an object it cannot store, a webhook that always fails). The
    status says so; the next change or resync tries again."""
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    message = (
        f"The apiserver answered the same internal error {times} times in a row for this "
        f"InferenceService ({str(err)[:300]}); the operator stops retrying until the "
        "InferenceService changes or the next resync. An admission webhook or a value the "
        "apiserver cannot store is the usual cause: the apiserver's log has the details."
    )
    await _write_stalled(api, body, "ApiServerError", message, now, observed=False)


async def _reconcile(
    api: ClusterAPI,
    body: Manifest,
    isvc: InferenceService,
    *,
    settings: OperatorSettings,
    now: datetime,
    view: NodeView | None,
    applied: AppliedMemo | None,
    http: PodClient | None = None,
    measurements: MeasurementsRead | None = None,
) -> Outcome:
    ns = isvc.metadata.namespace
    # With a ModelCache, everything below sees the service as served: from the cache's
    # claim (the status is still the service's own).
    cache = use_cache(isvc, await read_cache(api, isvc))
    served = cache.service
    snap = await gather(api, served, view, measurements)
    # The plan says whether the service runs as a LeaderWorkerSet; only then is that
    # kind read (the one read that depends on a decision).
    planned = plan(served, snap, settings, cache)
    if planned.does_not_fit is None and is_multi_node(planned.tuning):
        groups = await read_groups(api, served)
        live = {**snap.live, LWS_KIND: groups.live} if groups.live else snap.live
        snap = replace(snap, groups=groups, live=live)
    decision = decide(served, snap, settings, now, cache, planned)
    decision, rollout = await _rollout(api, served, decision, snap)
    if rollout is not None:
        await _rollout_events(api, body, rollout, isvc.status)
    deployment, rejected = await _apply_children(api, served, decision, snap.live, applied)
    await apply_writes(api, decision.warmup.writes)
    # The adapters of spec.adapters into every server that answers, none restarted.
    adapters = await sync_adapters(http, served, decision.tuning, snap.pods)

    problems = decision.problems + rejected
    warm = decision.warmup.seen
    warmup_status = isvc.status.warmup if isvc.status else None
    if warm.cold_ttft_ms is not None or warm.warm_ttft_ms is not None:
        warmup_status = WarmupStatus(
            last_cold_ttft_milliseconds=warm.cold_ttft_ms,
            last_warm_ttft_milliseconds=warm.warm_ttft_ms,
        )
    observed = Observed(
        tuning=decision.tuning,
        desired_replicas=decision.desired_replicas,
        deployment=deployment,
        pods=snap.pods,
        problems=problems,
        warmup=warmup_status,
        warmed=warm.warmed if isvc.spec.warmup.enabled else None,
        warmup_failures=warm.failures,
        scale_down_blocked_by=decision.scale_down_blocked_by,
        last_benchmark=decision.last_benchmark,
        adapters=adapters,
        rollout=rollout,
        waiting=cache.waiting,
        workload=decision.workload,
        endpoints=ready_endpoints(snap.endpoint_slices, service_name(isvc)),
        measured=decision.measured,
    )
    status = compute_status(isvc, observed, now=now)
    old = _stored_status(body)
    # status.autoscaling belongs to the autoscaler (its own field manager): not ours to
    # compare, and our apply, which leaves it out, keeps it.
    if old is not None:
        old = old.model_copy(update={"autoscaling": None})
    if old != status:
        await apply_status(api, body, status.to_wire())
        await _events(api, body, old, status)
        ready_now = find(status.conditions, "Ready")
        # The object in the message itself: the plain log format prints no extras.
        log.info(
            "Updated status of InferenceService %s/%s: Ready=%s.",
            ns, isvc.metadata.name, ready_now.status if ready_now else None,
            extra={
                "object": f"{ns}/{isvc.metadata.name}",
                "ready": ready_now.status if ready_now else None,
            },
        )  # fmt: skip
    ready = find(status.conditions, "Ready")
    return Outcome(ready=ready is not None and ready.status == "True", stalled=bool(problems))
