"""What one pass of a kind's reconcile decided, as data: the pure ``next_step`` of
reconcile/benchmark.py, model_cache.py and autoscale.py returns its ``Step`` (the status to
write, the objects to apply and to delete, the events, when to look again) built from
these parts, and one apply-and-write function per kind carries it out. A decision is
table-tested as data, with no fake API."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from vllm_operator.k8s.api import ClusterAPI
from vllm_operator.models.base import Manifest


@dataclass(frozen=True)
class Event:
    """An event on the reconciled object (only on transitions and warnings)."""

    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class Ref:
    """An object to delete."""

    api_version: str
    kind: str
    name: str
    namespace: str | None


async def apply_all(api: ClusterAPI, manifests: Iterable[Manifest]) -> None:
    """Server-side apply, one after another in the order given (a Job after what its pod
    needs)."""
    for manifest in manifests:
        await api.apply(manifest)


async def delete_all(api: ClusterAPI, refs: Iterable[Ref]) -> None:
    for ref in refs:
        await api.delete(ref.api_version, ref.kind, ref.name, ref.namespace)


async def emit(api: ClusterAPI, body: Manifest, events: Iterable[Event]) -> None:
    for event in events:
        await api.event(body, reason=event.reason, message=event.message, warning=event.warning)
