"""The controller table (k8s/controllers.py) held to what is derived from it: the watches
the operator's start-up registers with Kopf, the runtime's bindings, the API paths, and
the chart's RBAC as Helm renders it. A watch registered by hand beside the table, a row
the registration skips, or a verb the chart lacks fails here."""

from __future__ import annotations

import kopf
import pytest

from tests.test_chart import one, render
from vllm_operator.constants import (
    LABEL_BENCHMARK,
    LABEL_LOCK_TARGET,
    LABEL_SERVICE,
    LABEL_TRIAL,
    LABEL_TUNING,
)
from vllm_operator.k8s.controllers import (
    CLUSTER_CACHES,
    CLUSTER_PERMISSIONS,
    CONTROLLERS,
    Controller,
    Resource,
    Watch,
    field_keys,
    owner_keys,
    watches,
)
from vllm_operator.k8s.resources import resource_for
from vllm_operator.runtime.controllers import BINDINGS

# (group, version, plural, label filtered on or None)
Registered = tuple[str, str, str, str | None]


def _spelled(resource: Resource, label: str | None) -> Registered:
    return (resource.group, resource.version, resource.plural, label)


def _declared() -> set[Registered]:
    own = {_spelled(c.reconciles, None) for c in CONTROLLERS if c.own_events}
    own_kinds = {c.reconciles for c in CONTROLLERS if c.own_events}
    labelled = {
        _spelled(w.resource, w.label)
        for _, w in watches()
        if w.names_by is None or w.resource not in own_kinds
    }
    return own | labelled | {_spelled(r, None) for r in CLUSTER_CACHES}


def _registered(registry: kopf.OperatorRegistry) -> list[Registered]:
    out: list[Registered] = []
    for handler in registry._watching.get_all_handlers():
        selector = handler.selector
        assert selector is not None and selector.group is not None
        labels = dict(handler.labels or {})
        assert set(labels.values()) <= {kopf.PRESENT}, handler.id
        assert len(labels) <= 1, handler.id
        label = next(iter(labels), None)
        out.append((selector.group, str(selector.version), str(selector.any_name), label))
    return out


def test_the_start_up_registers_exactly_the_watches_the_table_declares() -> None:
    """As `vllm-operator run` does: importing the Kopf module registers its handlers into
    Kopf's default registry, which the operator then runs."""
    from vllm_operator.handlers import operator

    assert operator.run is not None
    registered = _registered(kopf.get_default_registry())
    assert len(registered) == len(set(registered)), "a watch registered twice"
    assert set(registered) == _declared()


def test_the_registration_from_the_table_is_all_there_is() -> None:
    """The same into a fresh registry: nothing registered beside the table's loop."""
    from vllm_operator.handlers.operator import register_watches

    registry = kopf.OperatorRegistry()
    register_watches(registry)

    # A kind may be watched whole (its controller's own events) and by a label (another
    # controller's children): sorted with no label first.
    def key(r: Registered) -> tuple[str, str, str, str]:
        return (*r[:3], r[3] or "")

    assert sorted(_registered(registry), key=key) == sorted(
        _registered(kopf.get_default_registry()), key=key
    )


def test_every_controller_is_bound_to_its_turn_and_nothing_else_is() -> None:
    assert list(BINDINGS) == [c.name for c in CONTROLLERS]
    for controller in CONTROLLERS:
        binding = BINDINGS[controller.name]
        assert binding.controller is controller
        assert (binding.on_event is not None) == controller.own_events, controller.name
        assert (binding.report_repeated is not None) == bool(controller.stall_after_repeats)


def _verbs(controller: Controller, resource: Resource, sub: str | None = None) -> set[str]:
    return {
        verb
        for p in controller.permissions
        if p.resource == resource and p.subresource == sub
        for verb in p.verbs
    }


@pytest.mark.parametrize("controller", CONTROLLERS, ids=lambda c: c.name)
def test_a_controller_may_do_what_its_turn_and_watches_do(controller: Controller) -> None:
    """Its turn reads its object first; Kopf lists and watches what it watches (a watch
    without the permission is a 403 loop in the operator's log, not a failed test)."""
    assert "get" in _verbs(controller, controller.reconciles)
    if controller.own_events:
        assert {"list", "watch"} <= _verbs(controller, controller.reconciles)
    for watch in controller.watches:
        assert {"list", "watch"} <= _verbs(controller, watch.resource), watch.resource.kind


def test_every_controlled_kind_has_its_api_path() -> None:
    for controller in CONTROLLERS:
        kinds = [controller.reconciles, *(w.resource for w in controller.watches)]
        kinds += [p.resource for p in controller.permissions]
        for resource in kinds:
            assert resource_for(resource.api_version, resource.kind) == resource


@pytest.mark.parametrize(
    ("labels", "keys"),
    [
        ({LABEL_SERVICE: "chat"}, [("isvc", "team", "chat")]),
        (
            {LABEL_BENCHMARK: "load", LABEL_LOCK_TARGET: "chat"},
            [("isvc", "team", "chat"), ("bench", "team", "load")],
        ),
        (
            {LABEL_TUNING: "fast", LABEL_TRIAL: "seqs-8"},
            [("tune", "team", "fast")],
        ),
        (
            {LABEL_TUNING: "fast", LABEL_LOCK_TARGET: "chat"},
            [("isvc", "team", "chat"), ("tune", "team", "fast")],
        ),
        ({"app": "chat"}, []),
    ],
    ids=[
        "a child names its service",
        "a load Job names its benchmark and its target",
        "a trial names its tuning",
        "an InPlace tuning's lock Job names its tuning and its target",
        "none",
    ],
)
def test_an_object_names_the_controllers_whose_labels_it_carries(
    labels: dict[str, str], keys: list[tuple[str, str, str]]
) -> None:
    assert owner_keys(labels, "team") == keys


@pytest.mark.parametrize(
    ("body", "keys"),
    [
        (
            {"metadata": {"namespace": "team"}, "spec": {"targetRef": {"name": "chat"}}},
            [("isvc", "team", "chat")],
        ),
        ({"metadata": {"namespace": "team"}, "spec": {}}, []),
        ({"metadata": {}, "spec": {"targetRef": {"name": "chat"}}}, []),
    ],
    ids=["a tuning names its target", "one naming none adds nothing", "nor one of no namespace"],
)
def test_a_tuning_names_the_service_it_targets_by_its_field(
    body: dict[str, object], keys: list[tuple[str, str, str]]
) -> None:
    assert field_keys("InferenceTuning", body) == keys
    assert field_keys("InferenceBenchmark", body) == [], "only the kinds a watch maps so"


def test_a_watch_maps_by_a_label_or_by_a_field_not_both() -> None:
    resource = CONTROLLERS[0].reconciles
    with pytest.raises(ValueError, match="not both"):
        Watch(resource, "some-label", names_by=("spec", "x"))


def _granted(role: dict[str, object]) -> set[tuple[str, str, str]]:
    rules = role["rules"]
    assert isinstance(rules, list)
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_chart_grants_every_verb_the_table_declares_and_no_other() -> None:
    """The chart's rbac.yaml is written from the table (scripts/chart_rbac.py); this
    holds what Helm renders of it to the table, both ways."""
    docs = render({"operator.watchNamespaces": "{team-a}"})
    declared = {
        (p.resource.group, p.plural, verb)
        for c in CONTROLLERS
        for p in c.permissions
        for verb in p.verbs
    }
    assert _granted(one(docs, "ClusterRole", "r-vllm-operator")) == declared
    cluster = {
        (r.group, r.plural, verb) for r, verbs, _, _ in CLUSTER_PERMISSIONS for verb in verbs
    }
    assert _granted(one(docs, "ClusterRole", "r-vllm-operator-cluster")) == cluster
