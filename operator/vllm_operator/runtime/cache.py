"""Watch-fed copies of what every reconcile reads: the cluster-scoped Nodes and
GPUNodes (:class:`ObjectCache`), and who controls each child the operator renders
(:class:`ChildOwners`).

Nodes and GPUNodes: Listing them in every reconcile pass of every service was two cluster-wide
LISTs per pass; here one LIST of each fills the cache at start and again every resync
period (which also drops an object whose deletion a watch reconnect missed), and watch
events keep it current in between, as an informer does."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from vllm_operator.models.base import Manifest
from vllm_operator.reconcile.inference_service import CHILD_KINDS, ChildKey


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


@dataclass
class ChildOwners:
    """The uid of the controller of each labelled child the watches have shown (None for
    one without a controller), so a converged pass need not read its children to know
    they are its own. A child it has not seen is read by the reconcile."""

    owners: dict[ChildKey, str | None] = field(default_factory=dict)

    def on_event(self, event: str | None, body: Manifest) -> None:
        kind, meta = body.get("kind"), body.get("metadata") or {}
        if kind not in CHILD_KINDS or not meta.get("name") or not meta.get("namespace"):
            return
        key = (str(kind), meta["namespace"], meta["name"])
        if event == "DELETED":
            self.owners.pop(key, None)
            return
        controllers = [o for o in meta.get("ownerReferences") or () if o.get("controller")]
        self.owners[key] = controllers[0].get("uid") if controllers else None
