"""Watch-fed copies of the cluster-scoped objects every reconcile reads: Nodes and
GPUNodes. Listing them in every reconcile pass of every service was two cluster-wide
LISTs per pass; here one LIST of each fills the cache at start and again every resync
period (which also drops an object whose deletion a watch reconnect missed), and watch
events keep it current in between, as an informer does."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

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
