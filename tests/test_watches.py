"""What the operator asks Kopf to watch: labelled resources filtered on the apiserver, and
no diff base built per event."""

from __future__ import annotations

import kopf
from kopf._cogs.structs.references import Resource

from vllm_operator.constants import LABEL_SERVICE
from vllm_operator.handlers.operator import LABELLED_BY_SERVICE, EventsOnlyDiffBase


def _resource(group: str, version: str, plural: str) -> Resource:
    return Resource(group=group, version=version, plural=plural, namespaced=True)


def test_the_labelled_watches_ask_the_apiserver_for_labelled_objects_only() -> None:
    settings = kopf.OperatorSettings()
    for resource in LABELLED_BY_SERVICE:
        settings.watching.label_selectors[resource] = LABEL_SERVICE
    for group, version, plural in [
        ("apps", "v1", "deployments"), ("", "v1", "services"), ("", "v1", "pods"),
        ("policy", "v1", "poddisruptionbudgets"),
        ("autoscaling", "v2", "horizontalpodautoscalers"),
        ("discovery.k8s.io", "v1", "endpointslices"),
    ]:  # fmt: skip
        selectors = list(
            settings.watching.label_selectors.collect(_resource(group, version, plural))
        )
        assert selectors == [LABEL_SERVICE], plural
    # Jobs carry one of three labels: no one selector; their handlers filter.
    assert list(settings.watching.label_selectors.collect(_resource("batch", "v1", "jobs"))) == []
    assert list(settings.watching.label_selectors.collect(_resource("", "v1", "nodes"))) == []


def test_no_diff_base_is_built_from_the_object() -> None:
    body = kopf.Body({"metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {"x": [1] * 100}})
    assert EventsOnlyDiffBase(prefix="x.dev").build(body=body) == {}
