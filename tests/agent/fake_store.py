"""A recording ``GPUNodeStore``: the agent's own Kubernetes boundary, held in memory.

It keeps one object per name the way the apiserver would for what the agent does with it
(creation with the CRD's defaulted spec, generation bumped by spec changes only, status
written through its own call) and records every call, so tests can assert what was
written and, as important, what was not.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from vllm_operator.agent.store import StoreError
from vllm_operator.models.base import Manifest


class RecordingStore:
    def __init__(self, *, node_uid: str | None = "node-uid-1") -> None:
        self.node_uids: dict[str, str | None] = {}
        self.default_uid = node_uid
        self.objects: dict[str, Manifest] = {}
        self.calls: list[tuple[str, Any]] = []
        self.node_labels: dict[str, dict[str, str]] = {}
        self.fail_next: StoreError | None = None

    def _maybe_fail(self) -> None:
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error

    def writes(self, kind: str) -> list[Any]:
        return [body for call, body in self.calls if call == kind]

    def set_spec(self, name: str, spec: dict[str, Any]) -> None:
        obj = self.objects[name]
        obj["spec"] = spec
        obj["metadata"]["generation"] += 1

    async def node_uid(self, name: str) -> str | None:
        return self.node_uids.get(name, self.default_uid)

    async def get(self, name: str) -> Manifest | None:
        self._maybe_fail()
        obj = self.objects.get(name)
        return copy.deepcopy(obj) if obj is not None else None

    async def apply_metadata(self, name: str, *, node_uid: str, labels: dict[str, str]) -> Manifest:
        self._maybe_fail()
        self.calls.append(("metadata", {"labels": dict(labels), "nodeUid": node_uid}))
        obj = self.objects.setdefault(
            name,
            {
                "apiVersion": "inference.vllm-operator.dev/v1alpha1",
                "kind": "GPUNode",
                "metadata": {"name": name, "generation": 1},
                "spec": {"power": {"policy": "Unmanaged"}, "probe": {}},
            },
        )
        obj["metadata"]["labels"] = dict(labels)
        obj["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}
        ]
        return copy.deepcopy(obj)

    async def apply_status(self, name: str, status: Manifest) -> Manifest:
        self._maybe_fail()
        self.calls.append(("status", copy.deepcopy(status)))
        self.objects[name]["status"] = copy.deepcopy(status)
        return copy.deepcopy(self.objects[name])

    async def label_node(self, name: str, labels: dict[str, str]) -> None:
        self.calls.append(("node-labels", dict(labels)))
        self.node_labels.setdefault(name, {}).update(labels)

    async def wait_for_change(self, name: str, *, generation: int | None, timeout: float) -> None:  # noqa: ASYNC109
        await asyncio.sleep(0)

    async def close(self) -> None:
        pass
