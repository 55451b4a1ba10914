"""API requests of one reconcile pass of a converged InferenceService: what the operator
costs the apiserver per service per resync. A regression guard, not a speed claim: it
counts requests against the recording fake of the k8s layer (docs/scale.md has the
measured figures)."""

from __future__ import annotations

import copy

from tests.fakes import RecordingCluster
from tests.reconcile.test_inference_service import NOW, SETTINGS, _cluster, _node, _stored
from vllm_operator.constants import LABEL_SERVICE, MEASUREMENTS_CONFIG_MAP
from vllm_operator.reconcile.inference_service import (
    AppliedMemo,
    list_nodes,
    reconcile_inference_service,
)
from vllm_operator.runtime.cache import WATCHED, CachedAPI, WatchStore
from vllm_operator.runtime.measurements import MeasurementsCache


def watched(api: RecordingCluster) -> WatchStore:
    """What the runtime's labelled watches and their relist would hold of the fake."""
    store = WatchStore()
    for kind, (api_version, labels) in WATCHED.items():
        store.begin_listing(kind)
        items = [
            o
            for (av, k, _, _), o in api.objects.items()
            if (av, k) == (api_version, kind)
            and (labels is None or any(label in (o["metadata"].get("labels") or {})
                                       for label in labels))
        ]  # fmt: skip
        store.finish_listing(kind, copy.deepcopy(items))
    return store


async def _converged(**spec: object) -> tuple[RecordingCluster, dict, AppliedMemo]:  # type: ignore[type-arg]
    """A service after its first pass, with the runtime's memo of what that pass applied."""
    api, body = _cluster(_node("a", 2), **spec)
    applied: AppliedMemo = {}
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW, applied=applied)
    return api, _stored(api, body), applied


async def test_a_converged_pass_through_the_watches_sends_no_request() -> None:
    """Every read is served by the watches and every apply would change nothing: the
    pass sends nothing (the runtime's GET of the service itself is the one request per
    service per resync, tests/runtime/test_dispatch.py)."""
    api, body, applied = await _converged()
    view = await list_nodes(api)  # the runtime's node caches stand in
    cached = CachedAPI(api, watched(api))
    api.calls.clear()
    await reconcile_inference_service(
        cached, body, settings=SETTINGS, now=NOW, view=view, applied=applied
    )
    assert api.calls == []


async def test_a_child_changed_by_someone_else_is_applied_again() -> None:
    api, body, applied = await _converged()
    view = await list_nodes(api)
    store = watched(api)
    service = store.get("Service", "team-a", "chat")
    assert service is not None
    edited = copy.deepcopy(service)
    edited["spec"]["selector"] = {"app": "elsewhere"}
    store.on_event("Service", "MODIFIED", edited)  # the edit's watch event
    api.calls.clear()
    await reconcile_inference_service(
        CachedAPI(api, store), body, settings=SETTINGS, now=NOW, view=view, applied=applied
    )
    assert api.calls == [("apply", "Service", "chat")]


async def test_a_spec_change_applies_what_it_changes() -> None:
    api, body, applied = await _converged()
    view = await list_nodes(api)
    body = copy.deepcopy(body)
    body["spec"]["replicas"] = 2
    body["metadata"]["generation"] = 2
    api.calls.clear()
    await reconcile_inference_service(
        CachedAPI(api, watched(api)), body, settings=SETTINGS, now=NOW, view=view,
        applied=applied,
    )  # fmt: skip
    applies = [name for verb, kind, name in api.calls if verb == "apply" and kind == "Deployment"]
    assert applies == ["chat"]
    assert ("apply", "PodDisruptionBudget", "chat") not in api.calls


async def test_a_foreign_child_outside_the_watches_is_still_read_and_left_alone() -> None:
    """The takeover guard holds with the cache: a user's Service of the service's name,
    without our label, is in no watch, so it is read by name and never applied over."""
    api, body = _cluster(_node("a", 2))
    theirs = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "chat", "namespace": "team-a", "uid": "theirs"},
        "spec": {"selector": {"app": "mine"}},
    }  # fmt: skip
    api.put(theirs)
    cached = CachedAPI(api, watched(api))
    await reconcile_inference_service(cached, body, settings=SETTINGS, now=NOW, applied={})
    assert ("get", "Service", "chat") in api.calls
    assert api.applied("Service") == []
    stored = api.objects[("v1", "Service", "team-a", "chat")]
    assert stored["spec"]["selector"] == {"app": "mine"}
    conditions = _stored(api, body)["status"]["conditions"]
    assert any(c.get("reason") == "ServiceConflict" for c in conditions), conditions


async def test_without_the_watches_a_pass_reads_everything_and_applies_every_child() -> None:
    """Before the first relist (and in the tests that pass the fake directly), every
    read goes to the apiserver: the three children, the HPA by label, the lock and the
    warmup Jobs, the pods, the benchmarks, the tunings and the Service's EndpointSlices;
    and without a memo every child is applied."""
    api, body, _ = await _converged()
    view = await list_nodes(api)
    api.calls.clear()
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW, view=view)
    gets = sorted(kind for verb, kind, _ in api.calls if verb == "get")
    lists = sorted(kind for verb, kind, _ in api.calls if verb == "list")
    assert gets == ["Deployment", "PodDisruptionBudget", "Service"]
    assert lists == [
        "EndpointSlice",
        "HorizontalPodAutoscaler",
        "InferenceBenchmark",
        "InferenceTuning",
        "Job",
        "Job",
        "Pod",
    ]
    assert sorted(api.applied("Deployment") + api.applied("Service")) == ["chat", "chat"]


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


async def test_an_hpa_of_ours_is_found_by_label_and_a_foreign_one_only_in_hpa_mode() -> None:
    api, body = _cluster(_node("a", 2))
    foreign = {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "chat", "namespace": "team-a", "uid": "theirs"}, "spec": {},
    }  # fmt: skip
    api.put(foreign)
    await reconcile_inference_service(api, body, settings=SETTINGS, now=NOW)
    assert ("get", "HorizontalPodAutoscaler", "chat") not in api.calls
    assert not [c for c in api.calls if c[0] == "delete"], "someone else's HPA stays"
    labelled = {**foreign, "metadata": {**foreign["metadata"], "labels": {LABEL_SERVICE: "chat"}}}
    api.put(labelled)
    api.calls.clear()
    await reconcile_inference_service(api, _stored(api, body), settings=SETTINGS, now=NOW)
    assert not [c for c in api.calls if c[0] == "delete"], "labelled but not controlled"


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


async def test_labels_and_annotations_of_others_on_a_child_bring_no_apply() -> None:
    """The Deployment controller annotates the revision on every Deployment: not ours to
    apply back, so no second apply of each service's Deployment. Our own label changed
    by hand is applied back."""
    api, body, applied = await _converged()
    view = await list_nodes(api)
    store = watched(api)
    deployment = copy.deepcopy(store.get("Deployment", "team-a", "chat"))
    assert deployment is not None
    deployment["metadata"].setdefault("annotations", {})["deployment.kubernetes.io/revision"] = "1"
    store.on_event("Deployment", "MODIFIED", deployment)
    api.calls.clear()
    await reconcile_inference_service(
        CachedAPI(api, store), body, settings=SETTINGS, now=NOW, view=view, applied=applied
    )
    assert api.calls == []
    deployment = copy.deepcopy(deployment)
    deployment["metadata"]["labels"][LABEL_SERVICE] = "edited"
    store.on_event("Deployment", "MODIFIED", deployment)
    await reconcile_inference_service(
        CachedAPI(api, store), body, settings=SETTINGS, now=NOW, view=view, applied=applied
    )
    assert api.calls == [("apply", "Deployment", "chat")]


async def test_a_converged_pass_reading_the_measurements_sends_no_request_within_the_minute() -> (
    None
):
    """The runtime's read of the measurements store (runtime/measurements.py) is shared
    by every pass: once it was made, converged passes send nothing for it; once it is a
    minute old, the next pass sends its one GET (whoever's pass it is), not one per pass."""
    api, body, applied = await _converged()
    view = await list_nodes(api)
    cached = CachedAPI(api, watched(api))
    clock = [0.0]
    cache = MeasurementsCache(SETTINGS.own_namespace, clock=lambda: clock[0])
    await cache.read(api)
    for _ in range(3):
        api.calls.clear()
        await reconcile_inference_service(
            cached,
            body,
            settings=SETTINGS,
            now=NOW,
            view=view,
            applied=applied,
            measurements=lambda: cache.read(api),
        )
        assert api.calls == []
    clock[0] += 61
    api.calls.clear()
    for _ in range(2):
        await reconcile_inference_service(
            cached,
            body,
            settings=SETTINGS,
            now=NOW,
            view=view,
            applied=applied,
            measurements=lambda: cache.read(api),
        )
    assert api.calls == [("get", "ConfigMap", MEASUREMENTS_CONFIG_MAP)]
