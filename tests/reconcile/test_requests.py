"""API requests of one reconcile pass of a converged InferenceService: what the operator
costs the apiserver per service per resync. A regression guard, not a speed claim: it
counts requests against the recording fake of the k8s layer."""

from __future__ import annotations

from tests.fakes import RecordingCluster
from tests.reconcile.test_inference_service import NOW, SETTINGS, _cluster, _node, _stored
from vllm_operator.reconcile.inference_service import list_nodes, reconcile_inference_service
from vllm_operator.runtime.cache import ChildOwners


async def test_a_converged_pass_makes_eight_requests_and_no_cluster_wide_list() -> None:
    api, body = _cluster(_node("a", 2))
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    body = _stored(api, body)
    view = await list_nodes(api)  # the runtime's caches stand in
    owners = _owners(api)
    api.calls.clear()
    await reconcile_inference_service(
        api, body, settings=SETTINGS, now=NOW, view=view, owners=owners
    )
    kinds = [(verb, kind) for verb, kind, _ in api.calls]
    assert ("list", "Node") not in kinds and ("list", "GPUNode") not in kinds
    # Lock Jobs, the HPA, three server-side applies (no-ops when converged), the pods,
    # the warmup Jobs and the benchmarks.
    assert len(api.calls) == 8, api.calls


def _owners(api: RecordingCluster) -> dict[tuple[str, str, str], str | None]:
    """What the runtime's labelled watches would have shown of the children."""
    owners = ChildOwners()
    for obj in api.objects.values():
        owners.on_event("ADDED", obj)
    return owners.owners


async def test_without_the_watches_a_pass_reads_its_three_children_to_know_they_are_its() -> None:
    api, body = _cluster(_node("a", 2))
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    view = await list_nodes(api)
    api.calls.clear()
    await reconcile_inference_service(
        api, _stored(api, body), settings=SETTINGS, now=NOW, view=view
    )
    gets = sorted(kind for verb, kind, _ in api.calls if verb == "get")
    assert gets == ["Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service"]


async def test_every_read_of_a_pass_comes_before_its_first_write() -> None:
    """Gather, decide, apply: no read between the writes, on the first pass (nothing
    exists yet) as on a converged one."""
    api, body = _cluster(_node("a", 2))
    for _ in range(2):
        api.calls.clear()
        await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
        verbs = [verb for verb, _, _ in api.calls]
        first_write = verbs.index("apply")
        assert all(v in ("get", "list") for v in verbs[:first_write]), api.calls
        assert all(v in ("apply", "delete") for v in verbs[first_write:]), api.calls
        body = _stored(api, body)


def test_the_decision_is_a_function_of_the_snapshot_alone() -> None:
    """decide() runs with no API at all: a hand-made snapshot in, the children out."""
    from tests.reconcile.test_inference_service import _node as node
    from tests.specs import BASE
    from vllm_operator.models import InferenceService
    from vllm_operator.reconcile.inference_service import NodeView, Snapshot, decide

    isvc = InferenceService.model_validate(BASE)
    snap = Snapshot(
        view=NodeView([node("a", 2)], []),
        token_secret=None,
        claim=None,
        hpa=None,
        lock_jobs=[],
        warmup_jobs=[],
        pods=[],
        benchmarks=[],
        live_deployment=None,
    )
    decision = decide(isvc, snap, SETTINGS, NOW)
    assert [c["kind"] for c in decision.children] == [
        "Service",
        "PodDisruptionBudget",
        "Deployment",
    ]
    assert decision.problems == [] and decision.scale_down_blocked_by is None
    # The same snapshot, with nodes too small: a problem, and no Deployment to apply.
    small = Snapshot(**{**snap.__dict__, "view": NodeView([node("a", 0)], [])})
    held = decide(isvc, small, SETTINGS, NOW)
    assert held.problems and "Deployment" not in [c["kind"] for c in held.children]
