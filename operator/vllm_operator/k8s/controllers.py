"""The controller table: one frozen record per controller the operator runs, as a
kubebuilder ``SetupWithManager`` with its ``+kubebuilder:rbac`` markers says it in one
place: the kind it reconciles, the kinds it watches by label, or by a field of theirs
that names the controller's object (and which of those its reads are served from the
watch store), the label by which an object names the controller's object, how its turn
behaves on failure, its metric label, and the RBAC verbs it needs per kind. Everything
else is derived from it:

- the Kopf registrations (``handlers/operator.py`` iterates :data:`CONTROLLERS` and
  :data:`CLUSTER_CACHES`), and the watches' apiserver label selectors;
- the watch store's kinds and labels (``runtime/cache.py``: :func:`store_kinds`);
- the API path rows of these kinds (``k8s/resources.py``);
- the chart's RBAC (``scripts/chart_rbac.py``, written and checked by
  ``scripts/generate.py``), from :func:`namespaced_permissions` and
  :data:`CLUSTER_PERMISSIONS`.

Why the table is split in two: the API paths (``k8s``) and the chart's RBAC need the
table, and the reconcile functions live in ``reconcile``, above ``k8s`` in the import
layers (pyproject.toml). So this module holds only data, low enough for ``k8s`` to read;
``runtime/controllers.py`` binds each row's ``name`` to what its turn calls (the
reconcile and its arguments) and to what the watch events of its own kind do, and
``runtime/dispatch.py`` runs one generic turn from both. A test holds the bindings to
exactly these rows.

Adding a watched kind is one :class:`Watch` in a controller's ``watches`` (and its
:class:`Permission`), then ``python scripts/generate.py`` (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from vllm_operator.constants import (
    API_VERSION,
    KIND_GPU_NODE,
    KIND_INFERENCE_BENCHMARK,
    KIND_INFERENCE_SERVICE,
    KIND_INFERENCE_TUNING,
    KIND_MODEL_CACHE,
    LABEL_BENCHMARK,
    LABEL_LOCK_TARGET,
    LABEL_MODEL_CACHE,
    LABEL_SERVICE,
    LABEL_TUNING,
    LABEL_WARMUP_FOR,
    MEASUREMENTS_CONFIG_MAP,
    PLURAL_GPU_NODE,
    PLURAL_INFERENCE_BENCHMARK,
    PLURAL_INFERENCE_SERVICE,
    PLURAL_INFERENCE_TUNING,
    PLURAL_MODEL_CACHE,
)

Verb = Literal["get", "list", "watch", "create", "update", "patch", "delete"]
# The order the chart's rules list verbs in (kubectl's).
VERBS: Final[tuple[Verb, ...]] = ("get", "list", "watch", "create", "update", "patch", "delete")


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the Kubernetes API."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def group(self) -> str:
        """The API group; ``""`` for the core group."""
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [prefix]
        if self.namespaced and namespace is not None:
            parts += ["namespaces", namespace]
        parts.append(self.plural)
        if name is not None:
            parts.append(name)
        return "/".join(parts)


INFERENCE_SERVICE: Final = Resource(
    API_VERSION, KIND_INFERENCE_SERVICE, PLURAL_INFERENCE_SERVICE, True
)
INFERENCE_BENCHMARK: Final = Resource(
    API_VERSION, KIND_INFERENCE_BENCHMARK, PLURAL_INFERENCE_BENCHMARK, True
)
MODEL_CACHE: Final = Resource(API_VERSION, KIND_MODEL_CACHE, PLURAL_MODEL_CACHE, True)
INFERENCE_TUNING: Final = Resource(
    API_VERSION, KIND_INFERENCE_TUNING, PLURAL_INFERENCE_TUNING, True
)
GPU_NODE: Final = Resource(API_VERSION, KIND_GPU_NODE, PLURAL_GPU_NODE, False)
NODE: Final = Resource("v1", "Node", "nodes", False)
DEPLOYMENT: Final = Resource("apps/v1", "Deployment", "deployments", True)
SERVICE: Final = Resource("v1", "Service", "services", True)
PDB: Final = Resource("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", True)
HPA: Final = Resource("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", True)
POD: Final = Resource("v1", "Pod", "pods", True)
ENDPOINT_SLICE: Final = Resource("discovery.k8s.io/v1", "EndpointSlice", "endpointslices", True)
# A multi-node service's workload (LeaderWorkerSet's CRD, when installed).
LEADER_WORKER_SET: Final = Resource(
    "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets", True
)
JOB: Final = Resource("batch/v1", "Job", "jobs", True)
SECRET: Final = Resource("v1", "Secret", "secrets", True)
CONFIG_MAP: Final = Resource("v1", "ConfigMap", "configmaps", True)
PVC: Final = Resource("v1", "PersistentVolumeClaim", "persistentvolumeclaims", True)
EVENT: Final = Resource("v1", "Event", "events", True)
SERVICE_ACCOUNT: Final = Resource("v1", "ServiceAccount", "serviceaccounts", True)
ROLE: Final = Resource("rbac.authorization.k8s.io/v1", "Role", "roles", True)
ROLE_BINDING: Final = Resource("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", True)
CRD: Final = Resource(
    "apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", False
)
NAMESPACE: Final = Resource("v1", "Namespace", "namespaces", False)


@dataclass(frozen=True)
class Watch:
    """A watch of ``resource``: every object (``label`` None) or those carrying ``label``.

    ``stored``: the watch store keeps its objects and serves the reconciles' reads of the
    kind from them (runtime/cache.py); off for a kind whose CRD may be missing (its store
    would never fill). ``id``: Kopf's handler id where one resource has several watches.
    ``names_by``: the path of a field in which each object names the controller's object
    (in its own namespace), for a kind that names it in its spec rather than by label
    (an InferenceTuning's ``spec.targetRef.name``): an event of the object, its deletion
    included, adds that object's key (:func:`field_keys`). Such a watch has no label."""

    resource: Resource
    label: str | None = None
    stored: bool = True
    id: str | None = None
    names_by: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.names_by is not None and self.label is not None:
            raise ValueError("a watch maps its objects by a label or by a field, not both")


@dataclass(frozen=True)
class Permission:
    """The verbs a controller needs on ``resource`` (or its ``subresource``), and why: the
    chart's rule for it says the why above it."""

    resource: Resource
    verbs: tuple[Verb, ...]
    why: str
    subresource: str | None = None

    @property
    def plural(self) -> str:
        sub = f"/{self.subresource}" if self.subresource else ""
        return f"{self.resource.plural}{sub}"


@dataclass(frozen=True)
class Controller:
    """One controller: what its queue keys name, and how its turn behaves.

    ``name``: the first part of its queue keys ``(name, namespace, object name)``.
    ``reconciles``: the kind whose object each turn reads first (a turn on an object that
    is gone, or going unless ``deleting``, ends the key). ``own_events``: whether Kopf
    watches that kind for this controller (the autoscaler's readings come from the
    service's events instead). ``owner_labels``: labels by which any watched object names
    this controller's object: an event of such an object adds that object's key.
    ``metric``: the ``kind`` label of the reconcile metrics, or None for a turn that is
    not counted. ``words``: how a failed turn's log line names it. ``gone_namespace``: a
    refusal because the namespace is being deleted ends the key quietly. ``classify``: a
    failed turn counts as ``retry`` or ``error`` by the error's kind (else always
    ``retry``). ``stall_after_repeats``: the same internal error this many passes in a
    row is reported as permanent instead of retried (0: never)."""

    name: str
    reconciles: Resource
    own_events: bool
    owner_labels: tuple[str, ...]
    watches: tuple[Watch, ...]
    permissions: tuple[Permission, ...]
    metric: str | None
    words: str = "Reconcile"
    deleting: bool = False
    gone_namespace: bool = False
    classify: bool = False
    stall_after_repeats: int = 0


# An internal error (500) that the same service gets this many passes in a row, the same
# each time, is reported as permanent (ApiServerError) instead of retried for ever: about
# half a minute of back-off (1 + 2 + 4 + 8 s between the five).
REPEATS_UNTIL_STALLED: Final = 5

_APPLIED: Final[tuple[Verb, ...]] = ("get", "list", "watch", "create", "patch")
_CHILD_WHY = (
    "Children: server-side applied and watched by label. An apply PATCH that creates the "
    "object is authorised as `create` as well (e2e/test_helm.py found out), so both. `get`: "
    "a child the watches have not shown is read first, so that an object of the same name "
    "that someone else made is never applied over (it is reported instead)."
)
_EVENTS = Permission(EVENT, ("create",), "Events on transitions and warnings.")

INFERENCE_SERVICE_CONTROLLER: Final = Controller(
    name="isvc",
    reconciles=INFERENCE_SERVICE,
    own_events=True,
    # Children and their pods; a warmup Job names the service it warms, a lock Job the
    # service it holds (the lock changes what the service may do).
    owner_labels=(LABEL_SERVICE, LABEL_WARMUP_FOR, LABEL_LOCK_TARGET),
    watches=(
        Watch(DEPLOYMENT, LABEL_SERVICE),
        Watch(SERVICE, LABEL_SERVICE),
        Watch(PDB, LABEL_SERVICE),
        Watch(HPA, LABEL_SERVICE),
        Watch(POD, LABEL_SERVICE),
        # The Service's EndpointSlices: the EndpointSlice controller copies the Service's
        # labels onto them, so the service's label finds them too. Ready waits for one to
        # list a ready endpoint, and their change is the turn that sees it.
        Watch(ENDPOINT_SLICE, LABEL_SERVICE),
        # Kopf watches it only where the CRD is installed (it warns once of the unresolved
        # resource otherwise, and starts the watch when the CRD appears); the reconcile
        # reads it from the apiserver, not from the store, which would never fill
        # without the CRD.
        Watch(LEADER_WORKER_SET, LABEL_SERVICE, stored=False),
        Watch(JOB, LABEL_WARMUP_FOR, id="warmup-job"),
        Watch(JOB, LABEL_LOCK_TARGET, id="lock-job"),
        # A measured run names the service it tunes in spec.targetRef.name (it labels
        # nothing on it): its in-place trial, its winner and its deletion change the
        # service's arguments (reconcile/measured.py).
        Watch(INFERENCE_TUNING, names_by=("spec", "targetRef", "name"), id="tuning-target"),
    ),
    permissions=(
        Permission(
            INFERENCE_SERVICE,
            ("get", "list", "watch"),
            "InferenceService: watched by Kopf, read before each reconcile, listed for "
            "resync; only its status is written (server-side apply on the status "
            "subresource).",
        ),
        Permission(INFERENCE_SERVICE, ("patch",), "", subresource="status"),
        Permission(DEPLOYMENT, _APPLIED, _CHILD_WHY),
        Permission(
            LEADER_WORKER_SET,
            _APPLIED,
            "A multi-node service runs as a LeaderWorkerSet (docs/multi-node.md): applied "
            "and watched like a Deployment; listed to learn whether the cluster serves the "
            "kind at all.",
        ),
        Permission(SERVICE, _APPLIED, ""),
        Permission(PDB, _APPLIED, ""),
        Permission(
            ENDPOINT_SLICE,
            ("list", "watch"),
            "The Service's EndpointSlices: Ready waits until one lists a ready endpoint.",
        ),
        Permission(
            POD,
            ("list", "watch"),
            "Pods of a service: readiness and warm state for status. Every pod, once as a "
            "rollout starts under spec.rollout Auto: the room on the nodes.",
        ),
        Permission(
            SECRET,
            ("get",),
            "Checks that spec.model names a Secret (with the key) and a PVC that exist. "
            "Only get: the operator never lists Secrets.",
        ),
        Permission(PVC, ("get",), "The same check of a PVC."),
        _EVENTS,
        Permission(
            JOB,
            ("get", "list", "watch", "create", "patch"),
            "Warmup Jobs (one per pod), server-side applied and watched; lock Jobs watched.",
        ),
        Permission(
            POD,
            ("patch",),
            "The warmed-up readiness gate: the operator sets the pod condition.",
            subresource="status",
        ),
        Permission(
            HPA,
            ("get", "list", "watch", "create", "patch", "delete"),
            "Autoscaling: the HPA the operator manages for spec.autoscaling.",
        ),
        Permission(
            INFERENCE_TUNING,
            ("get", "list", "watch"),
            "InferenceTunings: a service runs with the measured result it asks for (an "
            "in-place trial, spec.tuning.measuredRef, spec.autoApply); read only, never "
            "written by the service's reconcile.",
        ),
    ),
    metric=KIND_INFERENCE_SERVICE,
    gone_namespace=True,
    classify=True,
    stall_after_repeats=REPEATS_UNTIL_STALLED,
)

INFERENCE_BENCHMARK_CONTROLLER: Final = Controller(
    name="bench",
    reconciles=INFERENCE_BENCHMARK,
    own_events=True,
    # Load Jobs: the lock they are changes what their target may do, so the target is
    # reconciled too (LABEL_LOCK_TARGET, the service controller's).
    owner_labels=(LABEL_BENCHMARK,),
    watches=(Watch(JOB, LABEL_BENCHMARK, id="load-job"),),
    permissions=(
        Permission(
            INFERENCE_BENCHMARK,
            ("get", "list", "watch"),
            "InferenceBenchmark: read and watched; only its status is written.",
        ),
        Permission(INFERENCE_BENCHMARK, ("patch",), "", subresource="status"),
        Permission(
            INFERENCE_SERVICE, ("get", "list"), "The target service, and its benchmarks' locks."
        ),
        Permission(
            JOB,
            ("get", "list", "watch", "create", "patch", "delete"),
            "Benchmark Jobs (one per InferenceBenchmark) and their noisy neighbours.",
        ),
        Permission(POD, ("list",), "The target's pods and the load Job's pod."),
        Permission(
            POD,
            ("create",),
            "Never used by the operator itself (the own-objects policy refuses it): a "
            "benchmark's chaos restart has its load Job evict one target pod, and the Role "
            "that allows it (by the pods' names) can grant only what its creator holds.",
            subresource="eviction",
        ),
        Permission(
            CONFIG_MAP,
            ("get", "list", "watch", "create", "update", "patch", "delete"),
            "Benchmark specs, datasets and traces (checked before the load Job starts) and "
            "results. `update` is never used by the operator itself: RBAC lets it grant "
            "only what it holds, and the load Job's Role (below) grants get, update and "
            "patch of the results ConfigMap.",
        ),
        Permission(
            SERVICE_ACCOUNT,
            ("create", "patch"),
            "The load Job's own identity: a ServiceAccount, and a Role (with RoleBinding) "
            "that allows only writing the benchmark's results ConfigMap (resourceNames), "
            "all server-side applied and owned by the benchmark. No `escalate` or `bind`: "
            "the operator holds what the Role grants.",
        ),
        Permission(ROLE, ("create", "patch"), ""),
        Permission(ROLE_BINDING, ("create", "patch"), ""),
        _EVENTS,
    ),
    metric=KIND_INFERENCE_BENCHMARK,
)

MODEL_CACHE_CONTROLLER: Final = Controller(
    name="cache",
    reconciles=MODEL_CACHE,
    own_events=True,
    owner_labels=(LABEL_MODEL_CACHE,),
    # The download Jobs.
    watches=(Watch(JOB, LABEL_MODEL_CACHE, id="download-job"),),
    permissions=(
        Permission(
            MODEL_CACHE,
            ("get", "list", "watch", "patch"),
            "ModelCache: read and watched; its status written, and its finalizer (which "
            "defers its deletion while services name it) applied and removed: patch.",
        ),
        Permission(MODEL_CACHE, ("patch",), "", subresource="status"),
        Permission(INFERENCE_SERVICE, ("list",), "The services that name the cache."),
        Permission(
            PVC,
            ("get", "create", "patch"),
            "A ModelCache's claim, server-side applied and owned by the cache (never "
            "deleted by the operator: it goes with its cache by garbage collection).",
        ),
        Permission(SECRET, ("get",), "The Hub token the download Job is given."),
        Permission(
            JOB,
            ("get", "list", "watch", "create", "patch", "delete"),
            "The download Job, applied, watched, and deleted to start over.",
        ),
        Permission(POD, ("list",), "The download Job's pod, for why it failed."),
        _EVENTS,
    ),
    metric=KIND_MODEL_CACHE,
    # Its finalizer is ours to remove: a cache being deleted still gets its turn.
    deleting=True,
    gone_namespace=True,
)

INFERENCE_TUNING_CONTROLLER: Final = Controller(
    name="tune",
    reconciles=INFERENCE_TUNING,
    own_events=True,
    # Its trials' InferenceServices and InferenceBenchmarks, and an InPlace run's lock Job
    # (a lock Job is watched already, by the service controller's lock label).
    owner_labels=(LABEL_TUNING,),
    # Both kinds are their own controllers' too, watched whole for them: these watches
    # add no apiserver selector (apiserver_selectors), and their reads are the plain
    # client's (the store keeps the benchmarks already, and no service by this label).
    watches=(
        Watch(INFERENCE_SERVICE, LABEL_TUNING, stored=False, id="tuning-service"),
        Watch(INFERENCE_BENCHMARK, LABEL_TUNING, stored=False, id="tuning-benchmark"),
    ),
    permissions=(
        Permission(
            INFERENCE_TUNING,
            ("get", "list", "watch"),
            "InferenceTuning: read and watched; only its status is written.",
        ),
        Permission(INFERENCE_TUNING, ("patch",), "", subresource="status"),
        Permission(
            INFERENCE_SERVICE,
            ("get", "list", "watch", "create", "patch", "delete"),
            "A tuning's trials (strategy Beside): an InferenceService per trial, server-side "
            "applied, owned by the tuning and deleted when the trial ends; the target read.",
        ),
        Permission(
            INFERENCE_BENCHMARK,
            ("get", "list", "watch", "create", "patch", "delete"),
            "A tuning's trials: an InferenceBenchmark per trial, owned by the tuning; one "
            "stopped by the budget is deleted.",
        ),
        Permission(
            DEPLOYMENT,
            ("get",),
            "An InPlace tuning reads the target's Deployment: whether its pods run the trial.",
        ),
        Permission(
            JOB,
            ("get", "list", "watch", "create", "patch", "delete"),
            "An InPlace tuning's scale-down lock: a suspended Job (no pod) owned by the "
            "tuning, deleted when the run ends; the target's other lock Jobs listed.",
        ),
        Permission(POD, ("list",), "The target's pods: which node's GPUs it runs on."),
        _EVENTS,
    ),
    metric=KIND_INFERENCE_TUNING,
)

AUTOSCALER_CONTROLLER: Final = Controller(
    name="scale",
    reconciles=INFERENCE_SERVICE,
    # Scheduled by the service's events and the resync; each reading schedules the next.
    own_events=False,
    owner_labels=(),
    watches=(),
    permissions=(
        Permission(INFERENCE_SERVICE, ("get",), ""),
        Permission(
            INFERENCE_SERVICE,
            ("get", "patch"),
            "The autoscaler (spec.autoscaling, Operator mode) sets spec.replicas through "
            "the scale subresource only, as an HPA would.",
            subresource="scale",
        ),
        Permission(
            POD,
            ("list", "watch", "patch"),
            "Before a scale-down, the autoscaler sets each pod's deletion cost (an "
            "annotation) from the work it served over the window, so the least loaded "
            "pods go first.",
        ),
        Permission(HPA, ("get",), "The HPA's reading, in HPA mode."),
    ),
    metric=None,
    words="Autoscaler reading",
)

# In the order their keys are added for a labelled object's event.
CONTROLLERS: Final[tuple[Controller, ...]] = (
    INFERENCE_SERVICE_CONTROLLER,
    INFERENCE_BENCHMARK_CONTROLLER,
    MODEL_CACHE_CONTROLLER,
    INFERENCE_TUNING_CONTROLLER,
    AUTOSCALER_CONTROLLER,
)
BY_NAME: Final[Mapping[str, Controller]] = {c.name: c for c in CONTROLLERS}

# The cluster-scoped kinds the runtime's node caches keep (watched whole, relisted every
# resync): no controller of their own, read by the service reconcile's planning.
CLUSTER_CACHES: Final[tuple[Resource, ...]] = (NODE, GPU_NODE)

# (resource, verbs, why, only when operator.watchNamespaces is set): the cluster role's
# rules, which are not any one controller's.
CLUSTER_PERMISSIONS: Final[tuple[tuple[Resource, tuple[Verb, ...], str, bool], ...]] = (
    (
        NODE,
        ("list", "watch"),
        "Planning reads Nodes (GPU labels, allocatable) and GPUNodes (what the node agent "
        "measured) from a watch-fed cache, relisted every resync period.",
        False,
    ),
    (GPU_NODE, ("list", "watch"), "", False),
    (
        CRD,
        ("list", "watch"),
        "Kopf: discovers the watched resources and notices CRDs appearing or changing.",
        False,
    ),
    (
        NAMESPACE,
        ("list", "watch"),
        "Kopf: with a list of namespaces, it observes which of them exist.",
        True,
    ),
)


# (resource, verbs, names, why): the rules of a Role in the operator's own namespace, bound
# there whatever operator.watchNamespaces says (that namespace need not be watched). Only
# the named objects: the chart creates them, so no `create`.
OWN_NAMESPACE_PERMISSIONS: Final[
    tuple[tuple[Resource, tuple[Verb, ...], tuple[str, ...], str], ...]
] = (
    (
        CONFIG_MAP,
        ("get", "patch"),
        (MEASUREMENTS_CONFIG_MAP,),
        "The measurements a measured tuning run keeps for later plans "
        "(tuning/measurements.py): read, and new records merged in by a JSON merge patch.",
    ),
)


def watches() -> Iterator[tuple[Controller, Watch]]:
    """Every watch (by label, or by a field naming the owner), by controller, in table
    order."""
    for controller in CONTROLLERS:
        for watch in controller.watches:
            yield controller, watch


def owner_keys(labels: Mapping[str, str], namespace: str) -> list[tuple[str, str, str]]:
    """The keys an event of an object carrying ``labels`` adds: one for each label by
    which it names a controller's object, in table order."""
    return [
        (controller.name, namespace, owner)
        for controller in CONTROLLERS
        for label in controller.owner_labels
        if (owner := labels.get(label))
    ]


def field_keys(kind: str, body: Mapping[str, object]) -> list[tuple[str, str, str]]:
    """The keys an event of an object of ``kind`` adds through the watches that map it by
    a field (``Watch.names_by``): one for each such watch whose field the object sets."""
    meta = body.get("metadata")
    namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    if not namespace:
        return []
    keys: list[tuple[str, str, str]] = []
    for controller, watch in watches():
        if watch.resource.kind != kind or watch.names_by is None:
            continue
        value: object = body
        for part in watch.names_by:
            value = value.get(part) if isinstance(value, Mapping) else None
        if isinstance(value, str) and value:
            keys.append((controller.name, str(namespace), value))
    return keys


def store_kinds() -> dict[str, tuple[str, tuple[str, ...] | None]]:
    """The kinds the watch store keeps: kind → (apiVersion, the labels that put an
    object in a watch, or None: every object of the kind is)."""
    out: dict[str, tuple[str, tuple[str, ...] | None]] = {}
    for _, watch in watches():
        if not watch.stored:
            continue
        if watch.label is None:
            # Watched whole (a kind mapped by a field): every object is in the store.
            out[watch.resource.kind] = (watch.resource.api_version, None)
            continue
        api_version, labels = out.get(watch.resource.kind, (watch.resource.api_version, ()))
        if labels is None:
            continue  # every object of the kind is kept already
        if watch.label not in labels:
            labels = (*labels, watch.label)
        out[watch.resource.kind] = (api_version, labels)
    # A benchmark's own events feed the store too: the service reconcile reads its
    # service's benchmarks (the scale-down lock) from it.
    out[KIND_INFERENCE_BENCHMARK] = (API_VERSION, None)
    return out


def apiserver_selectors() -> dict[Resource, str]:
    """The label selector each labelled watch asks the apiserver for: a resource watched
    by one label only (Kopf's handler filters are client-side, so without it the operator
    is sent every pod of the cluster to drop). A resource watched by several labels (Jobs)
    gets none: one selector cannot OR them; nor does a kind a controller reconciles (its
    own events need every object of it)."""
    labels: dict[Resource, set[str | None]] = {}
    for _, watch in watches():
        labels.setdefault(watch.resource, set()).add(watch.label)
    # A kind some controller reconciles from its own events is watched whole.
    for controller in CONTROLLERS:
        if controller.own_events:
            labels.setdefault(controller.reconciles, set()).add(None)
    return {
        resource: label
        for resource, found in labels.items()
        if len(found) == 1 and (label := next(iter(found))) is not None
    }


def controlled_resources() -> list[Resource]:
    """Every kind a controller reconciles, watches, or has a permission on, and the node
    caches' kinds, once each in table order (k8s/resources.py takes their API paths)."""
    kinds = [
        resource
        for c in CONTROLLERS
        for resource in (
            c.reconciles,
            *(w.resource for w in c.watches),
            *(p.resource for p in c.permissions),
        )
    ]
    return list(dict.fromkeys([*kinds, *CLUSTER_CACHES]))


@dataclass(frozen=True)
class Rule:
    """One rule of the chart's namespaced ClusterRole: every verb any controller needs on
    a resource, and each controller's reason."""

    group: str
    resources: tuple[str, ...]
    verbs: tuple[Verb, ...]
    why: tuple[str, ...]


def namespaced_permissions() -> list[Rule]:
    """The namespaced role's rules: per (group, resource), the union of the controllers'
    verbs, first seen first; neighbours of one group with the same verbs and no reason of
    their own join the rule before them (as Role and RoleBinding do)."""
    verbs: dict[tuple[str, str], set[Verb]] = {}
    why: dict[tuple[str, str], list[str]] = {}
    for controller in CONTROLLERS:
        for permission in controller.permissions:
            key = (permission.resource.group, permission.plural)
            verbs.setdefault(key, set()).update(permission.verbs)
            reasons = why.setdefault(key, [])
            if permission.why and permission.why not in reasons:
                reasons.append(permission.why)
    rules: list[Rule] = []
    for (group, plural), found in verbs.items():
        ordered = tuple(v for v in VERBS if v in found)
        last = rules[-1] if rules else None
        if last and not why[(group, plural)] and (last.group, last.verbs) == (group, ordered):
            rules[-1] = Rule(group, (*last.resources, plural), ordered, last.why)
        else:
            rules.append(Rule(group, (plural,), ordered, tuple(why[(group, plural)])))
    return rules
