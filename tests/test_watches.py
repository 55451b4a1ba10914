"""What the operator asks Kopf to watch, held to the handlers it registers: every labelled
watch filtered on the apiserver by the label its objects carry, the store's kinds the same,
and no diff base built per event. The settings come from ``configure_kopf``, which the
operator's start-up calls, and the handlers from Kopf's registry as importing the operator
fills it, so a handler added without its selector (or a selector without its handler)
fails here."""

from __future__ import annotations

import kopf
from kopf._cogs.structs.references import Resource

from vllm_operator.constants import LABEL_SERVICE
from vllm_operator.handlers import operator
from vllm_operator.handlers.operator import (
    LABELLED_BY_SERVICE,
    EventsOnlyDiffBase,
    configure_kopf,
)
from vllm_operator.runtime.cache import WATCHED


def _registered() -> dict[tuple[str, str, str], list[dict[str, object] | None]]:
    """(group, version, plural) -> the label filters of each event handler registered."""
    out: dict[tuple[str, str, str], list[dict[str, object] | None]] = {}
    for handler in kopf.get_default_registry()._watching.get_all_handlers():
        selector = handler.selector
        assert selector is not None and selector.group is not None
        key = (selector.group, str(selector.version), str(selector.any_name))
        out.setdefault(key, []).append(dict(handler.labels) if handler.labels else None)
    return out


def _key(resource: tuple[str, ...]) -> tuple[str, str, str]:
    """LABELLED_BY_SERVICE's spelling (core resources without a group) as Kopf's."""
    return ("", *resource) if len(resource) == 2 else (resource[0], resource[1], resource[2])  # type: ignore[return-value]


def _configured() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    configure_kopf(settings, request_timeout=30)
    return settings


def test_the_handlers_filtered_by_the_service_label_are_the_labelled_watches() -> None:
    assert operator.startup is not None  # the module registered its handlers on import
    labelled = {
        key
        for key, filters in _registered().items()
        if filters and all(f == {LABEL_SERVICE: kopf.PRESENT} for f in filters)
    }
    assert labelled == {_key(r) for r in LABELLED_BY_SERVICE}


def test_each_registered_watch_asks_the_apiserver_for_what_its_handlers_take() -> None:
    settings = _configured()
    for (group, version, plural), filters in _registered().items():
        resource = Resource(group=group, version=version, plural=plural, namespaced=True)
        selectors = list(settings.watching.label_selectors.collect(resource))
        if filters and all(f == {LABEL_SERVICE: kopf.PRESENT} for f in filters):
            assert selectors == [LABEL_SERVICE], plural
        else:
            # Jobs carry one of several labels, which one selector cannot OR; the
            # operator's own kinds and nodes are watched whole.
            assert selectors == [], plural


def test_the_store_keeps_what_the_watches_show() -> None:
    registered = _registered()
    for kind, (api_version, labels) in WATCHED.items():
        group, _, version = api_version.rpartition("/")
        matches = [k for k in registered if k[0] == group and k[1] == version]
        assert matches, kind
        if labels == (LABEL_SERVICE,):
            plural = next(k for k in matches if registered[k][0] == {LABEL_SERVICE: kopf.PRESENT})
            assert plural in {_key(r) for r in LABELLED_BY_SERVICE}, kind


def test_kopf_is_set_up_as_the_operator_runs_it() -> None:
    settings = _configured()
    assert isinstance(settings.persistence.diffbase_storage, EventsOnlyDiffBase)
    assert settings.posting.enabled is False
    assert settings.networking.request_timeout == 30
    assert settings.watching.server_timeout == 300


def test_no_diff_base_is_built_from_the_object() -> None:
    body = kopf.Body({"metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {"x": [1] * 100}})
    assert EventsOnlyDiffBase(prefix="x.dev").build(body=body) == {}
