"""spec.rollout: what Auto resolves to on fake GPU nodes, and the rest of the choice
(reconcile/rollout.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.specs import isvc, plan_for
from tests.specs import node as gpu_node
from vllm_operator.constants import ANNOTATION_TEMPLATE_HASH, DEFAULT_SERVING_IMAGE, GPU_RESOURCE
from vllm_operator.models import InferenceService
from vllm_operator.reconcile.rollout import RolloutChoice, choose, room_needed, starts_rollout
from vllm_operator.render.deployment import build_deployment, rollout_strategy, with_strategy


def node(name: str, product: str, count: int, memory_mib: int, interconnect: str) -> Any:
    """A GPU node as a kubelet reports it: its GPUs and its CPUs, memory and disk."""
    found = gpu_node(name, product, count, memory_mib, interconnect)
    found["status"]["allocatable"].update(
        {"cpu": "96", "memory": "1Ti", "ephemeral-storage": "1Ti", "pods": "110"}
    )
    return found


def _pod(name: str, on: str | None, gpus: int = 1, phase: str = "Running", **extra: Any) -> Any:
    pod: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {"containers": [{"resources": {"requests": {GPU_RESOURCE: str(gpus)}}}]},
        "status": {"phase": phase},
    }
    if on is not None:
        pod["spec"]["nodeName"] = on
    pod["spec"].update(extra)
    return pod


def _rendered(svc: InferenceService) -> Any:
    return build_deployment(svc, plan_for(svc), image=DEFAULT_SERVING_IMAGE, replicas=1)


def _stale(rendered: Any, strategy: str = "Surge", **status: int) -> Any:
    """The live Deployment of an older template (the apply starts a rollout)."""
    live = with_strategy(copy.deepcopy(rendered), strategy)  # type: ignore[arg-type]
    live["metadata"]["annotations"] = {ANNOTATION_TEMPLATE_HASH: "older"}
    live["metadata"]["generation"] = 2
    live["status"] = {"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1, **status}
    return live


def _current(rendered: Any, strategy: str = "Surge", **status: int) -> Any:
    """The live Deployment of the rendered template."""
    live = _stale(rendered, strategy, **status)
    live["metadata"]["annotations"] = dict(rendered["metadata"]["annotations"])
    return live


H100 = ("NVIDIA-H100-80GB-HBM3", 81559, "nvlink")

# Auto's rule, on fake GPU nodes: (nodes, pods bound to them, what Auto resolves to, words
# the message must have).
AUTO_TABLE = {
    "a full node": (
        [node("h100-a", H100[0], 1, H100[1], H100[2])],
        [_pod("chat-old", "h100-a")],
        "Replace",
        ["no node that fits the plan has room", "h100-a: nvidia.com/gpu 1 wanted, 0 free",
         "unavailable while the new pod starts"],
    ),
    "a node with one spare GPU": (
        [node("h100-a", H100[0], 2, H100[1], H100[2])],
        [_pod("chat-old", "h100-a")],
        "Surge",
        ["node h100-a has room for one more replica"],
    ),
    "a node pool with room elsewhere": (
        [node("h100-a", H100[0], 1, H100[1], H100[2]),
         node("h100-b", H100[0], 1, H100[1], H100[2])],
        [_pod("chat-old", "h100-a")],
        "Surge",
        ["node h100-b has room"],
    ),
    "a pool whose free GPUs are of a product the service does not allow": (
        [node("h100-a", H100[0], 1, H100[1], H100[2]),
         node("l40s-a", "NVIDIA-L40S", 4, 46068, "pcie")],
        [_pod("chat-old", "h100-a")],
        "Replace",
        ["h100-a: nvidia.com/gpu 1 wanted, 0 free"],
    ),
    "pods that ended or have no node take no room": (
        [node("h100-a", H100[0], 2, H100[1], H100[2])],
        [_pod("chat-old", "h100-a"), _pod("done", "h100-a", phase="Succeeded"),
         _pod("pending", None)],
        "Surge",
        ["node h100-a has room"],
    ),
    "another team's pods count": (
        [node("h100-a", H100[0], 2, H100[1], H100[2])],
        [_pod("chat-old", "h100-a"), _pod("theirs", "h100-a")],
        "Replace",
        ["h100-a: nvidia.com/gpu 1 wanted, 0 free"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(AUTO_TABLE))
def test_auto_surges_where_a_node_that_fits_has_room_and_replaces_otherwise(case: str) -> None:
    nodes, pods, strategy, words = AUTO_TABLE[case]
    svc = isvc(gpu={"count": 1, "products": [H100[0]]})
    rendered = _rendered(svc)
    live = _stale(rendered)
    assert room_needed(svc, rendered, live)
    choice = choose(svc, plan_for(svc), rendered, live, nodes=nodes, cluster_pods=pods,
                    service_pods=[], stored=None)  # fmt: skip
    assert choice.strategy == strategy, choice.message
    assert choice.starts
    for word in words:
        assert word in choice.message
    assert choice.outage == (strategy == "Replace")  # one replica


def test_a_taint_the_pods_do_not_tolerate_leaves_the_node_out() -> None:
    tainted = node("h100-a", H100[0], 2, H100[1], H100[2])
    tainted["spec"] = {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]}
    svc = isvc(gpu={"count": 1})
    rendered = _rendered(svc)
    pick = choose(svc, plan_for(svc), rendered, _stale(rendered), nodes=[tainted],
                  cluster_pods=[], service_pods=[], stored=None)  # fmt: skip
    assert (pick.strategy, pick.message.split(";")[0]) == (
        "Replace",
        "Auto: Replace, no node the pods may land on",
    )
    tolerant = isvc(gpu={"count": 1}, podTemplate={
        "tolerations": [{"key": "maintenance", "operator": "Exists"}]})  # fmt: skip
    rendered = _rendered(tolerant)
    pick = choose(tolerant, plan_for(tolerant), rendered, _stale(rendered), nodes=[tainted],
                  cluster_pods=[], service_pods=[], stored=None)  # fmt: skip
    assert pick.strategy == "Surge"
    # A toleration admission gave the service's pods (a namespace's default tolerations),
    # which the template does not carry, counts too.
    admitted = _pod("chat-old", "elsewhere", tolerations=[
        {"key": "maintenance", "operator": "Equal", "effect": "NoSchedule"}])  # fmt: skip
    rendered = _rendered(svc)
    pick = choose(svc, plan_for(svc), rendered, _stale(rendered), nodes=[tainted],
                  cluster_pods=[], service_pods=[admitted], stored=None)  # fmt: skip
    assert pick.strategy == "Surge", pick.message


def test_cpu_and_memory_count_as_the_scheduler_counts_them() -> None:
    """make dev's case: a node of two cores (1.9 allocatable) and stand-in GPUs to spare, one
    server of one core: no room for a second."""
    cpu_node = {"metadata": {"name": "real"}, "status": {"allocatable": {
        "cpu": "1900m", "memory": "16Gi", "ephemeral-storage": "100Gi", "pods": "110",
        GPU_RESOURCE: "4"}}}  # fmt: skip
    svc = isvc(node={"cpus": 1, "memory": "4Gi"})
    rendered = _rendered(svc)
    requests = rendered["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    old = {"metadata": {"name": "old"}, "spec": {"nodeName": "real", "containers": [
        {"resources": {"requests": requests}}]}, "status": {"phase": "Running"}}  # fmt: skip
    system = {"metadata": {"name": "dns"}, "spec": {"nodeName": "real", "containers": [
        {"resources": {"requests": {"cpu": "100m"}}}]}, "status": {"phase": "Running"}}  # fmt: skip
    pick = choose(svc, plan_for(svc), rendered, _stale(rendered), nodes=[cpu_node],
                  cluster_pods=[old, system], service_pods=[], stored=None)  # fmt: skip
    assert pick.strategy == "Replace"
    assert "real: cpu 1 wanted, 0.8 free" in pick.message
    pick = choose(svc, plan_for(svc), rendered, _stale(rendered), nodes=[cpu_node],
                  cluster_pods=[system], service_pods=[], stored=None)  # fmt: skip
    assert pick.strategy == "Surge"


def test_surge_and_replace_are_taken_as_asked() -> None:
    full = [node("h100-a", H100[0], 1, H100[1], H100[2])]
    for asked in ("Surge", "Replace"):
        svc = isvc(rollout=asked, gpu={"count": 1}, replicas=2)
        rendered = _rendered(svc)
        assert not room_needed(svc, rendered, _stale(rendered))  # no pods read
        pick = choose(svc, plan_for(svc), rendered, _stale(rendered), nodes=full,
                      cluster_pods=None, service_pods=[], stored=None)  # fmt: skip
        assert (pick.strategy, pick.message, pick.outage) == (
            asked,
            f"spec.rollout is {asked}",
            False,
        )


def test_a_converged_service_reads_no_pods_and_keeps_its_strategy() -> None:
    svc = isvc(gpu={"count": 1})
    rendered = _rendered(svc)
    live = _current(rendered, "Replace")
    assert not starts_rollout(rendered, live)
    assert not room_needed(svc, rendered, live)
    said = "Auto: Replace, no node that fits the plan has room for one more replica (...)"
    pick = choose(svc, plan_for(svc), rendered, live, nodes=[], cluster_pods=None,
                  service_pods=[], stored=("Replace", said))  # fmt: skip
    assert pick == RolloutChoice("Replace", said + pick.message[len(said) :])
    assert not pick.starts and not pick.outage
    # The first pods: nothing to replace.
    first = choose(svc, plan_for(svc), rendered, None, nodes=[], cluster_pods=None,
                   service_pods=[], stored=None)  # fmt: skip
    assert (first.strategy, first.starts) == ("Surge", False)


def test_a_surge_under_way_keeps_its_strategy_until_its_pod_cannot_be_scheduled() -> None:
    svc = isvc(gpu={"count": 1})
    rendered = _rendered(svc)
    live = _current(rendered, "Surge", replicas=2, updatedReplicas=1)
    assert not room_needed(svc, rendered, live)  # under way: its own pods tell
    # The surge pod started on the last free GPU: the room is gone, the strategy stays.
    full = [node("h100-a", H100[0], 2, H100[1], H100[2])]
    taken = [_pod("chat-old", "h100-a"), _pod("chat-new", "h100-a")]
    said = ("Surge", "Auto: Surge, node h100-a has room")
    pick = choose(svc, plan_for(svc), rendered, live, nodes=full, cluster_pods=taken,
                  service_pods=taken, stored=said)  # fmt: skip
    assert pick.strategy == "Surge" and not pick.starts
    # A surge pod the scheduler cannot place turns the rollout to Replace, in its words.
    stuck = _pod("chat-new", None)
    stuck["status"]["conditions"] = [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/1 nodes are available: 1 Insufficient cpu.",
    }]  # fmt: skip
    pick = choose(svc, plan_for(svc), rendered, live, nodes=full, cluster_pods=taken,
                  service_pods=[taken[0], stuck], stored=None)  # fmt: skip
    assert pick.strategy == "Replace"
    assert "the surge pod chat-new cannot be scheduled (0/1 nodes are available: 1 Insuff" in (
        pick.message
    )


def test_the_rendered_strategy_reads_back() -> None:
    svc = isvc()
    rendered = _rendered(svc)
    assert rollout_strategy(rendered) == "Surge"
    assert rollout_strategy(with_strategy(rendered, "Replace")) == "Replace"
    assert rollout_strategy(None) is None
    # The digest is of the pod template: a change of replicas is no rollout.
    again = build_deployment(svc, plan_for(svc), image=DEFAULT_SERVING_IMAGE, replicas=5)
    assert not starts_rollout(again, rendered)
    other = build_deployment(svc, plan_for(svc), image="other:1", replicas=1)
    assert starts_rollout(other, rendered)
    # An older operator's Deployment, without the digest: no rollout is announced for it.
    older = copy.deepcopy(rendered)
    del older["metadata"]["annotations"]
    assert not starts_rollout(other, older)


# --- in the reconcile: the Deployment's strategy, the event before, the benchmark's hold ------


def _cluster(gpus: int, **spec: Any) -> tuple[Any, dict[str, Any]]:
    from tests.fakes import RecordingCluster
    from tests.specs import BASE

    api = RecordingCluster()
    api.put(node("h100-a", H100[0], gpus, H100[1], H100[2]) | {"apiVersion": "v1", "kind": "Node"})
    body = copy.deepcopy(BASE)
    body["spec"].update(spec)
    api.put(body)
    return api, body


DEPLOYMENT_KEY = ("apps/v1", "Deployment", "team-a", "chat")
SERVICE_KEY = ("inference.vllm-operator.dev/v1alpha1", "InferenceService", "team-a", "chat")


def _settle(api: Any) -> None:
    """The Deployment controller's part: every replica runs the template, one pod of the
    service bound to the node with its GPU."""
    dep = api.objects[DEPLOYMENT_KEY]
    dep["metadata"]["generation"] = 1
    want = dep["spec"]["replicas"]
    dep["status"] = {"observedGeneration": 1, "replicas": want, "updatedReplicas": want,
                     "readyReplicas": want, "availableReplicas": want}  # fmt: skip
    labels = dep["spec"]["template"]["metadata"]["labels"]
    api.put({"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "chat-old", "namespace": "team-a", "labels": labels,
                          "uid": "pod-uid-1"},
             "spec": {**dep["spec"]["template"]["spec"], "nodeName": "h100-a"},
             "status": {"phase": "Running"}})  # fmt: skip


async def _pass(api: Any) -> Any:
    from datetime import UTC, datetime

    from vllm_operator.reconcile.inference_service import reconcile_inference_service
    from vllm_operator.settings import OperatorSettings

    body = copy.deepcopy(api.objects[SERVICE_KEY])
    settings = OperatorSettings(default_image="registry.local/vllm:test")
    now = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    return await reconcile_inference_service(api, body, settings=settings, now=now)


def _change(api: Any, **spec: Any) -> None:
    svc = api.objects[SERVICE_KEY]
    svc["spec"].update(spec)
    svc["metadata"]["generation"] += 1


async def test_on_a_full_node_auto_replaces_and_says_so_before_the_pod_goes() -> None:
    api, _ = _cluster(1)
    await _pass(api)
    assert rollout_strategy(api.objects[DEPLOYMENT_KEY]) == "Surge"  # the first pods
    _settle(api)
    api.calls.clear()
    await _pass(api)  # converged: no pod of the cluster is read
    assert ("list", "Pod", "") not in api.calls

    events_at_apply: list[int] = []
    apply = api.apply

    async def recording_apply(manifest: Any, **kw: Any) -> Any:
        if manifest["kind"] == "Deployment":
            events_at_apply.append(len(api.events))
        return await apply(manifest, **kw)

    api.apply = recording_apply
    _change(api, tuning={"overrides": {"max-model-len": "2048"}})
    await _pass(api)
    assert ("list", "Pod", "") in api.calls  # the room is read once a rollout starts
    assert rollout_strategy(api.objects[DEPLOYMENT_KEY]) == "Replace"
    outage = [e for e in api.events if e[0] == "RolloutWithOutage"]
    assert len(outage) == 1 and outage[0][2], api.events  # a warning
    assert "unavailable while the new pod starts and warms up" in outage[0][1]
    assert events_at_apply and events_at_apply[0] >= 1  # posted before the Deployment's apply
    rollout = api.objects[SERVICE_KEY]["status"]["rollout"]
    assert rollout["strategy"] == "Replace"
    assert "h100-a: nvidia.com/gpu 1 wanted, 0 free" in rollout["message"]


async def test_with_a_spare_gpu_auto_surges_and_no_outage_is_announced() -> None:
    api, _ = _cluster(2)
    await _pass(api)
    _settle(api)
    _change(api, tuning={"overrides": {"max-model-len": "2048"}})
    await _pass(api)
    assert rollout_strategy(api.objects[DEPLOYMENT_KEY]) == "Surge"
    assert not [e for e in api.events if e[0] == "RolloutWithOutage"]
    assert api.objects[SERVICE_KEY]["status"]["rollout"]["message"] == (
        "Auto: Surge, node h100-a has room for one more replica"
    )


async def test_a_running_benchmark_holds_a_rollout_until_forced() -> None:
    from tests.specs import lock_job
    from vllm_operator.constants import ANNOTATION_FORCE_ROLLOUT

    api, _ = _cluster(2)
    await _pass(api)
    _settle(api)
    api.put(lock_job())
    before = copy.deepcopy(api.objects[DEPLOYMENT_KEY]["spec"]["template"])
    _change(api, tuning={"overrides": {"max-model-len": "2048"}})
    await _pass(api)
    await _pass(api)
    assert api.objects[DEPLOYMENT_KEY]["spec"]["template"] == before  # not rolled out
    message = api.objects[SERVICE_KEY]["status"]["rollout"]["message"]
    assert message.startswith("Held: InferenceBenchmark load is running;"), message
    assert [e[0] for e in api.events].count("RolloutHeldByBenchmark") == 1  # said once
    api.objects[SERVICE_KEY]["metadata"]["annotations"] = {ANNOTATION_FORCE_ROLLOUT: "true"}
    await _pass(api)
    assert api.objects[DEPLOYMENT_KEY]["spec"]["template"] != before
    assert not api.objects[SERVICE_KEY]["status"]["rollout"]["message"].startswith("Held")


async def test_an_operator_that_may_not_list_every_pod_surges_and_says_why() -> None:
    """The chart's watchNamespaces binds the pod permissions in those namespaces only."""
    from vllm_operator.k8s.api import ApiError

    api, _ = _cluster(1)
    await _pass(api)
    _settle(api)
    api.fail[("list", "Pod")] = ApiError(403, "Forbidden", "pods is forbidden at the cluster scope")
    listed = api.list

    async def namespaced_only(api_version: str, kind: str, namespace: Any = None, **kw: Any) -> Any:
        if kind == "Pod" and namespace is not None:
            return [
                o for (av, k, ns, _), o in api.objects.items() if k == "Pod" and ns == namespace
            ]
        return await listed(api_version, kind, namespace, **kw)

    api.list = namespaced_only
    _change(api, tuning={"overrides": {"max-model-len": "2048"}})
    await _pass(api)
    assert rollout_strategy(api.objects[DEPLOYMENT_KEY]) == "Surge"
    message = api.objects[SERVICE_KEY]["status"]["rollout"]["message"]
    assert message.startswith("Auto: Surge, the room on the nodes is unknown"), message
    assert "pods is forbidden at the cluster scope" in message
