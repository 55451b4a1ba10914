"""The controller table's behaviour: for each row of k8s/controllers.py (pure data, low in
the import layers so that ``k8s`` and the chart's RBAC can read it), what its turn calls
and what the watch events of its own kind do. This layer may import the reconciles; the
table's may not (docs/architecture.md).

A binding's ``run`` is the one place a controller's reconcile is called: it passes what
that reconcile takes (the watch store's cached reads or the plain client, the node view,
the autoscaler's memory) and turns its answer into (delay, metric result). Everything
common, the read of the object first, the failure's back-off, log line and metrics, is
the runtime's one generic turn (``Runtime.work``), steered by the row's fields. The
reconciles themselves are the runtime's fields (``reconcile_service`` and the others), so
tests give their own.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from vllm_operator.constants import KIND_INFERENCE_SERVICE
from vllm_operator.k8s.api import ApiError, ClusterAPI
from vllm_operator.k8s.controllers import (
    AUTOSCALER_CONTROLLER,
    INFERENCE_BENCHMARK_CONTROLLER,
    INFERENCE_SERVICE_CONTROLLER,
    INFERENCE_TUNING_CONTROLLER,
    MODEL_CACHE_CONTROLLER,
    Controller,
)
from vllm_operator.metrics import CONDITIONS
from vllm_operator.models.base import Manifest
from vllm_operator.reconcile.inference_service import report_repeated_error
from vllm_operator.runtime.cache import CachedAPI

if TYPE_CHECKING:
    from vllm_operator.runtime.dispatch import Runtime

log = logging.getLogger("vllm_operator")

# (controller name, namespace, name) of the object a turn is for.
Key = tuple[str, str, str]
# A benchmark waiting for its target or dataset is looked at again this soon.
PENDING_BENCHMARK_SECONDS: Final = 5.0


@dataclass(frozen=True)
class Binding:
    """A row of the controller table, bound to code.

    ``run``: one pass of the reconcile for a present object: (delay until the next turn
    or None, the metric's result). ``gone``: what the runtime forgets of a key whose
    object is gone. ``on_event``: a watch event of the reconciled kind (None: the kind's
    events are not this controller's). ``report_repeated``: writes an internal error that
    repeated ``stall_after_repeats`` times into the object's status."""

    controller: Controller
    run: Callable[[Runtime, Key, Manifest], Awaitable[tuple[float | None, str]]]
    gone: Callable[[Runtime, Key], None] | None = None
    on_event: Callable[[Runtime, str | None, Manifest], None] | None = None
    report_repeated: Callable[[ClusterAPI, Manifest, ApiError, int], Awaitable[None]] | None = None


async def _service(rt: Runtime, key: Key, body: Manifest) -> tuple[float | None, str]:
    _, namespace, name = key
    outcome = await rt.reconcile_service(
        CachedAPI(rt.api, rt.store),
        body,
        settings=rt.settings,
        view=rt.node_view(),
        applied=rt.applied.setdefault((namespace, name), {}),
        http=rt.http,
        measurements=lambda: rt.measurements.read(rt.api),
    )
    result = "stalled" if outcome.stalled else "ok"
    # The object in the message itself: the plain log format prints no extras.
    log.debug("Reconciled InferenceService %s/%s: %s.", namespace, name, result)
    CONDITIONS.labels(KIND_INFERENCE_SERVICE, namespace, name, "Ready", "True").set(
        1 if outcome.ready else 0
    )
    return None, result


async def _benchmark(rt: Runtime, key: Key, body: Manifest) -> tuple[float | None, str]:
    phase = await rt.reconcile_benchmark(rt.api, body, settings=rt.settings)
    return (PENDING_BENCHMARK_SECONDS if phase == "Pending" else None), "ok"


async def _cache(rt: Runtime, key: Key, body: Manifest) -> tuple[float | None, str]:
    again = await rt.reconcile_cache(rt.api, body, settings=rt.settings, http=rt.http)
    return again, "ok"


async def _tuning(rt: Runtime, key: Key, body: Manifest) -> tuple[float | None, str]:
    """One pass of a tuning, with the runtime's node caches (its fingerprint's GPU facts
    and the tuner's plan) where they are filled."""
    view = rt.node_view()
    step = await rt.reconcile_tuning(
        rt.api,
        body,
        settings=rt.settings,
        nodes=view.nodes if view is not None else None,
        gpu_nodes=view.gpu_nodes if view is not None else None,
    )
    return step.requeue, "ok"


async def _autoscale(rt: Runtime, key: Key, body: Manifest) -> tuple[float | None, str]:
    """One autoscaler reading; it schedules the next one itself while autoscaling is on.
    Its pods and lock Jobs come from the watch store, as the service reconcile's do (the
    chart's admission policy, not this read, is what refuses a scale-down while a lock
    Job runs)."""
    again = await rt.autoscale(
        CachedAPI(rt.api, rt.store),
        body,
        states=rt.scaler_states,
        scrape=rt.http.metrics,
    )
    if again is None:
        rt.scaling.discard(key)
    return again, "ok"


def _service_gone(rt: Runtime, key: Key) -> None:
    rt.applied.pop(key[1:], None)


def _readings_end(rt: Runtime, key: Key) -> None:
    rt.scaling.discard(key)


def _benchmark_event(rt: Runtime, event: str | None, body: Manifest) -> None:
    meta = body.get("metadata") or {}
    target = ((body.get("spec") or {}).get("targetRef") or {}).get("name")
    rt.on_inference_benchmark(
        meta.get("namespace"), str(meta.get("name")), target, event=event, body=body
    )


def _tuning_event(rt: Runtime, event: str | None, body: Manifest) -> None:
    meta = body.get("metadata") or {}
    target = ((body.get("spec") or {}).get("targetRef") or {}).get("name")
    rt.on_inference_tuning(
        meta.get("namespace"), str(meta.get("name")), target, gone=event == "DELETED"
    )


BINDINGS: Final[Mapping[str, Binding]] = {
    b.controller.name: b
    for b in (
        Binding(
            INFERENCE_SERVICE_CONTROLLER,
            _service,
            gone=_service_gone,
            on_event=lambda rt, event, body: rt.on_inference_service(event, body),
            report_repeated=report_repeated_error,
        ),
        Binding(INFERENCE_BENCHMARK_CONTROLLER, _benchmark, on_event=_benchmark_event),
        Binding(
            MODEL_CACHE_CONTROLLER,
            _cache,
            on_event=lambda rt, event, body: rt.on_model_cache(event, body),
        ),
        Binding(INFERENCE_TUNING_CONTROLLER, _tuning, on_event=_tuning_event),
        Binding(AUTOSCALER_CONTROLLER, _autoscale, gone=_readings_end),
    )
}
