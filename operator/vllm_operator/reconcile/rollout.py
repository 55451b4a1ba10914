"""How a change of the pods rolls out (spec.rollout): Surge, Replace, or Auto.

A Surge rollout starts one extra replica before it stops an old one; on a node pool sized
to its GPUs (or make dev's two-core node) that pod waits for room that never comes, and
every change of the pod template hangs. Replace stops one replica first. Auto, the
default, surges when a node that fits the plan has room for one more replica and
replaces otherwise; :func:`choose` says which and why, and is pure: the reconcile reads
the cluster's pods (:func:`room_needed`) only in the pass whose apply starts a rollout:
never in a converged pass, nor while a rollout runs or is stuck (it keeps its strategy
then, and reads only the service's own pods).

The room is the scheduler's resource fit, read from the objects: a node's allocatable
minus the requests of the pods bound to it that have not ended, against the rendered
pod's requests (its containers' sum, or its largest init container's when larger),
on the nodes the pods may land on (schedulable, the node selector, the plan's GPU
product and interconnect, taints tolerated). It ignores what the objects do not show
(affinity beyond the node selector, a device plugin's own accounting): a Surge chosen on
a wrong reading is still caught, since a surge pod that cannot be scheduled turns the
rollout to Replace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Final

from vllm_operator.constants import ANNOTATION_FORCE_ROLLOUT, ANNOTATION_TEMPLATE_HASH
from vllm_operator.models import InferenceService
from vllm_operator.models.base import Manifest
from vllm_operator.models.inference_service import EffectiveTuning, ResolvedRollout
from vllm_operator.models.quantity import parse_quantity
from vllm_operator.reconcile.placement import fits_placement
from vllm_operator.reconcile.pods import unschedulable
from vllm_operator.render.deployment import rollout_strategy

# Reasons (docs/troubleshooting.md): the event posted before a rollout that leaves no
# replica serving, and the problem of a rollout held by a benchmark.
REASON_OUTAGE: Final = "RolloutWithOutage"
REASON_HELD: Final = "RolloutHeldByBenchmark"
_OUTAGE: Final = (
    "; with one replica the service is unavailable while the new pod starts and warms up"
)
# Nodes named in a message, at most.
_NAMED: Final = 3


@dataclass(frozen=True)
class RolloutChoice:
    strategy: ResolvedRollout
    message: str
    # The pass's apply starts a rollout (the rendered template differs from the live one).
    starts: bool = False
    # That rollout stops the only replica: the service serves nothing until the new pod
    # is warmed up (said in an event before the apply).
    outage: bool = False
    # A benchmark runs: the rollout waits for its end (the reconcile decides).
    held: bool = False


def _hash(deployment: Manifest | None) -> str | None:
    annotations = ((deployment or {}).get("metadata") or {}).get("annotations") or {}
    value = annotations.get(ANNOTATION_TEMPLATE_HASH)
    return str(value) if value else None


def starts_rollout(rendered: Manifest, live: Manifest | None) -> bool:
    """Applying ``rendered`` over ``live`` changes the pod template: a rollout. A live
    Deployment without the digest (an older operator's) counts as unchanged: the apply
    stamps the digest, and a change it carries rolls out with the strategy the Deployment
    has (a surge pod that cannot be placed still turns it to Replace). Counting it as
    changed would announce an outage, and read every pod, for every service at upgrade."""
    before = _hash(live)
    return live is not None and before is not None and before != _hash(rendered)


def rollout_under_way(live: Manifest | None) -> bool:
    """The live Deployment has not finished its last rollout (the controller has not seen
    its generation, or not every replica runs the current template yet)."""
    if live is None:
        return False
    spec, status = live.get("spec") or {}, live.get("status") or {}
    want = int(spec.get("replicas") or 0)
    if int(status.get("observedGeneration") or 0) < int(
        (live.get("metadata") or {}).get("generation") or 0
    ):
        return True
    return int(status.get("updatedReplicas") or 0) < want or int(status.get("replicas") or 0) > want


def forced(isvc: InferenceService) -> bool:
    return isvc.metadata.annotations.get(ANNOTATION_FORCE_ROLLOUT, "").lower() == "true"


def room_needed(isvc: InferenceService, rendered: Manifest, live: Manifest | None) -> bool:
    """Whether :func:`choose` needs the cluster's pods: Auto, and this pass starts a
    rollout (one under way keeps its strategy, and reads only the service's own pods)."""
    return isvc.spec.rollout == "Auto" and starts_rollout(rendered, live)


# --- the room on the nodes --------------------------------------------------------------------


def _quantity(value: object) -> Decimal:
    """A request's value; one the parser does not read counts as none (the apiserver
    stores quantities in canonical form, so this is a hand-made object's)."""
    try:
        return parse_quantity(str(value))
    except ValueError:
        return Decimal(0)


def _requests(pod_spec: Manifest) -> dict[str, Decimal]:
    """What a pod asks of a node: its containers' requests summed, or its largest init
    container's where larger, and its overhead (the scheduler's rule)."""
    total: dict[str, Decimal] = {}
    for container in pod_spec.get("containers") or []:
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            total[name] = total.get(name, Decimal(0)) + _quantity(value)
    for container in pod_spec.get("initContainers") or []:
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            total[name] = max(total.get(name, Decimal(0)), _quantity(value))
    for name, value in (pod_spec.get("overhead") or {}).items():
        total[name] = total.get(name, Decimal(0)) + _quantity(value)
    return total


def _tolerated(taint: Manifest, tolerations: Sequence[Manifest]) -> bool:
    if taint.get("effect") not in ("NoSchedule", "NoExecute"):
        return True
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and str(t.get("value") or "") == str(
            taint.get("value") or ""
        ):
            return True
    return False


def _ended(pod: Manifest) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _free(node: Manifest, bound: Sequence[Manifest]) -> dict[str, Decimal]:
    allocatable = {
        k: _quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()
    }
    for pod in bound:
        for name, value in _requests(pod.get("spec") or {}).items():
            if name in allocatable:
                allocatable[name] -= value
    return allocatable


def _short(name: str, value: Decimal) -> str:
    if name in ("memory", "ephemeral-storage"):
        return f"{value / 2**30:.1f}Gi"
    return f"{value.normalize():f}"


def _shortfall(need: Mapping[str, Decimal], free: Mapping[str, Decimal]) -> list[str]:
    """The resources ``free`` lacks for ``need``, in words."""
    return [
        f"{name} {_short(name, value)} wanted, {_short(name, free.get(name, Decimal(0)))} free"
        for name, value in sorted(need.items())
        if value > 0 and free.get(name, Decimal(0)) < value
    ]


def room(
    isvc: InferenceService,
    tuning: EffectiveTuning,
    rendered: Manifest,
    nodes: Sequence[Manifest],
    pods: Sequence[Manifest],
    service_pods: Sequence[Manifest] = (),
) -> tuple[str | None, str]:
    """(a node with room for one more replica of ``rendered``, or None; the words that say
    which, or what each node lacks). The tolerations are the template's and those the
    service's pods carry: admission adds some to every pod (a namespace's defaults, the
    extended-resource tolerations of GPU pods) that the template does not have."""
    pod_spec = rendered["spec"]["template"]["spec"]
    need = _requests(pod_spec)
    tolerations = [
        *(pod_spec.get("tolerations") or []),
        *(t for p in service_pods for t in (p.get("spec") or {}).get("tolerations") or []),
    ]
    by_node: dict[str, list[Manifest]] = {}
    for pod in pods:
        bound = (pod.get("spec") or {}).get("nodeName")
        # A terminating pod holds its requests until it is gone, as the scheduler counts.
        if bound and not _ended(pod):
            by_node.setdefault(str(bound), []).append(pod)
    lacking: list[str] = []
    fitting = 0
    for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        name = str(node["metadata"]["name"])
        if not fits_placement(isvc, node, tuning):
            continue
        if not all(
            _tolerated(t, tolerations) for t in (node.get("spec") or {}).get("taints") or []
        ):
            continue
        fitting += 1
        short = _shortfall(need, _free(node, by_node.get(name, [])))
        if not short:
            return name, f"node {name} has room for one more replica"
        lacking.append(f"{name}: {', '.join(short)}")
    if not fitting:
        return None, "no node the pods may land on"
    more = f" (and {len(lacking) - _NAMED} more)" if len(lacking) > _NAMED else ""
    return None, (
        f"no node that fits the plan has room for one more replica ({'; '.join(lacking[:_NAMED])}"
        f"{more})"
    )


def _unschedulable(pods: Sequence[Manifest]) -> str | None:
    """The scheduler's words on a pod of the service that cannot be placed: during a Surge
    rollout, the surge pod (the old ones run)."""
    for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
        if pod["metadata"].get("deletionTimestamp"):
            continue
        if (said := unschedulable(pod)) is not None:
            return f"pod {pod['metadata']['name']} cannot be scheduled ({said[:300]})"
    return None


# --- the choice -------------------------------------------------------------------------------


def choose(
    isvc: InferenceService,
    tuning: EffectiveTuning,
    rendered: Manifest,
    live: Manifest | None,
    *,
    nodes: Sequence[Manifest],
    cluster_pods: Sequence[Manifest] | None,
    service_pods: Sequence[Manifest],
    stored: tuple[ResolvedRollout, str] | None,
    unreadable: str | None = None,
) -> RolloutChoice:
    """The strategy this pass renders, and why. ``cluster_pods``: every pod of the cluster
    (None when not read: no rollout starts, see :func:`room_needed`);
    ``stored``: what status.rollout said last; ``unreadable``: why the cluster's pods
    could not be read (an operator limited to some namespaces may not list them all)."""
    starts = starts_rollout(rendered, live)
    replicas = isvc.spec.replicas
    spec = isvc.spec.rollout
    if spec != "Auto":
        strategy: ResolvedRollout = spec
        message = f"spec.rollout is {spec}"
    elif live is None:
        strategy, message = "Surge", "Auto: the first pods, nothing to replace"
    elif not starts and not rollout_under_way(live):
        strategy = rollout_strategy(live) or "Surge"
        kept = stored[1] if stored and stored[0] == strategy else None
        message = kept or f"Auto: {strategy} (no rollout under way)"
    elif not starts:
        # Under way: keep the strategy it started with (a surge pod that has started takes
        # the room it was chosen for: reading the room now would turn it to Replace and
        # stop an old replica early), unless the surge pod cannot be placed.
        strategy = rollout_strategy(live) or "Surge"
        kept = stored[1] if stored and stored[0] == strategy else None
        message = kept or f"Auto: {strategy}"
        stuck = _unschedulable(service_pods) if strategy == "Surge" else None
        if stuck is not None:
            strategy = "Replace"
            message = f"Auto: Replace, the surge {stuck}"
    elif unreadable is not None:
        # The room is unknown: surge, and let a surge pod that cannot be placed turn the
        # rollout to Replace (the branch above, in the passes that follow).
        strategy = "Surge"
        message = (
            f"Auto: Surge, the room on the nodes is unknown (the cluster's pods could not be "
            f"read: {unreadable}); a surge pod that cannot be scheduled turns it to Replace"
        )
    else:
        node, said = room(isvc, tuning, rendered, nodes, cluster_pods or [], service_pods)
        strategy = "Surge" if node is not None else "Replace"
        message = f"Auto: {strategy}, {said}"
    outage = starts and strategy == "Replace" and replicas <= 1 and live is not None
    if strategy == "Replace" and replicas <= 1 and _OUTAGE not in message:
        message += _OUTAGE
    return RolloutChoice(strategy, message[:1024], starts=starts, outage=outage)
