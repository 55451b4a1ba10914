"""Watch-fed copies of what the reconciles read, so that a converged pass reads almost
nothing from the apiserver: the cluster-scoped Nodes and GPUNodes (:class:`ObjectCache`),
and the namespaced objects the labelled watches show (:class:`WatchStore`), which
:class:`CachedAPI` serves to the reconcile in place of GETs and LISTs.

Both work as an informer does. One LIST of each kind fills a cache at start and again
every resync period, which also drops an object whose deletion a watch reconnect missed.
Watch events keep it current in between. A kind is served from the cache only once a
LIST of it has arrived; until then the reads go to the apiserver.

Before these caches a converged pass sent 8 requests and, earlier still, two
cluster-wide LISTs (all Nodes, all GPUNodes) per service per resync (issue 15, item 6)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from vllm_operator.k8s.api import ClusterAPI
from vllm_operator.k8s.controllers import store_kinds
from vllm_operator.models.base import Manifest


@dataclass
class ObjectCache:
    """Objects of one cluster-scoped kind by name; ``ready`` once a full list arrived."""

    objects: dict[str, Manifest] = field(default_factory=dict)
    ready: bool = False

    def replace_all(self, items: list[Manifest]) -> None:
        """A fresh LIST's objects (its own, so kept as they are)."""
        self.objects = {o["metadata"]["name"]: o for o in items}
        self.ready = True

    def on_event(self, event: str | None, body: Manifest) -> None:
        name = (body.get("metadata") or {}).get("name")
        if not name:
            return
        if event == "DELETED":
            self.objects.pop(name, None)
        else:
            self.objects[name] = copy.deepcopy(body)  # the watch's body is Kopf's

    def items(self) -> list[Manifest]:
        """The objects by name, not copied: an object is replaced whole on each event and
        never changed in place, and the reconciles only read them (copying every node
        on every pass of every service was the cost the cache removes)."""
        return [o for _, o in sorted(self.objects.items())]


# The namespaced kinds the store keeps, by kind: the apiVersion, and the labels that put
# an object in a watch (an object carrying any one of them is watched; None: every object
# of the kind is). Derived from the controller table (k8s/controllers.py), from which
# handlers/operator.py registers the same watches.
WATCHED: Final[Mapping[str, tuple[str, tuple[str, ...] | None]]] = store_kinds()

# (namespace, name)
Name = tuple[str, str]


def _name_of(body: Manifest) -> Name | None:
    meta = body.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    return (str(namespace), str(name)) if namespace and name else None


@dataclass
class WatchStore:
    """The objects of the :data:`WATCHED` kinds by kind and (namespace, name).

    A relist runs between :meth:`begin_listing` and :meth:`finish_listing`. Its answer
    reflects the cluster at some moment of that span; an event that arrives meanwhile is
    at least as new, so the objects events touched during the span keep what the events
    said (a deletion included) and the LIST replaces the rest."""

    objects: dict[str, dict[Name, Manifest]] = field(default_factory=dict)
    ready: set[str] = field(default_factory=set)
    _listing: dict[str, set[Name]] = field(default_factory=dict)

    def on_event(self, kind: str, event: str | None, body: Manifest) -> None:
        name = _name_of(body)
        if kind not in WATCHED or name is None:
            return
        for_kind = self.objects.setdefault(kind, {})
        if event == "DELETED":
            for_kind.pop(name, None)
        else:
            for_kind[name] = copy.deepcopy(body)  # the watch's body is Kopf's
        if kind in self._listing:
            self._listing[kind].add(name)

    def begin_listing(self, kind: str) -> None:
        self._listing[kind] = set()

    def finish_listing(self, kind: str, items: Iterable[Manifest]) -> None:
        touched = self._listing.pop(kind, set())
        current = self.objects.get(kind, {})
        fresh = {name: o for o in items if (name := _name_of(o)) is not None}
        for name in touched:
            if name in current:
                fresh[name] = current[name]
            else:
                fresh.pop(name, None)
        self.objects[kind] = fresh
        self.ready.add(kind)

    def abort_listing(self, kind: str) -> None:
        """A relist that failed: the kind keeps what it had, fed by its events."""
        self._listing.pop(kind, None)

    def get(self, kind: str, namespace: str, name: str) -> Manifest | None:
        return self.objects.get(kind, {}).get((namespace, name))

    def select(self, kind: str, namespace: str, labels: Mapping[str, str]) -> list[Manifest]:
        """The objects of ``namespace`` that carry every one of ``labels``, by name."""
        found = [
            obj
            for (ns, _), obj in sorted(self.objects.get(kind, {}).items())
            if ns == namespace
            and all(((obj["metadata"].get("labels") or {}).get(k)) == v for k, v in labels.items())
        ]
        return found

    def answers(self, kind: str, labels: Mapping[str, str]) -> bool:
        """Whether the watches show every object such a query can match."""
        if kind not in self.ready:
            return False
        watched_by = WATCHED[kind][1]
        return watched_by is None or any(k in labels for k in watched_by)


def equality_selector(selector: str | None) -> dict[str, str] | None:
    """``a=b,c=d`` as a mapping; None for any other form (which the cache does not
    answer)."""
    if not selector:
        return {}
    labels: dict[str, str] = {}
    for term in selector.split(","):
        key, sep, value = term.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or value.startswith("=") or key.endswith("!"):
            return None
        labels[key] = value
    return labels


@dataclass
class CachedAPI:
    """The reconcile's :class:`ClusterAPI` with its reads served from the watch store
    where the store holds every object the read can return, as a controller-runtime
    cached client does; every other read, and every write, goes to ``api``. A GET of a
    watched kind that the store lacks still goes out: the object may exist without the
    labels that put it in a watch (a user's Service of the same name)."""

    api: ClusterAPI
    store: WatchStore

    async def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Manifest | None:
        if namespace and kind in self.store.ready and WATCHED[kind][0] == api_version:
            found = self.store.get(kind, namespace, name)
            if found is not None:
                return copy.deepcopy(found)
        return await self.api.get(api_version, kind, name, namespace)

    async def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
    ) -> list[Manifest]:
        labels = equality_selector(label_selector)
        if (
            namespace
            and labels is not None
            and kind in WATCHED
            and WATCHED[kind][0] == api_version
            and self.store.answers(kind, labels)
        ):
            return copy.deepcopy(self.store.select(kind, namespace, labels))
        return await self.api.list(api_version, kind, namespace, label_selector=label_selector)

    async def apply(
        self,
        manifest: Manifest,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> Manifest:
        return await self.api.apply(manifest, subresource=subresource, field_manager=field_manager)

    async def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None,
        patch: Manifest,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> Manifest:
        return await self.api.patch(
            api_version,
            kind,
            name,
            namespace,
            patch,
            subresource=subresource,
            field_manager=field_manager,
        )

    async def delete(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> None:
        await self.api.delete(api_version, kind, name, namespace)

    async def event(
        self, involved: Manifest, *, reason: str, message: str, warning: bool = False
    ) -> None:
        await self.api.event(involved, reason=reason, message=message, warning=warning)
