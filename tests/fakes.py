"""A recording ``ClusterAPI``: the boundary we own, faked for unit tests.

It stores what was applied and returns it, records every call, and can be told to fail a
call. It has no Kubernetes semantics (no defaulting, no controllers, no garbage
collection): tests that need those run against the real control plane in e2e/.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from vllm_operator.k8s.api import ApiError, Manifest

Key = tuple[str, str, str | None, str]  # apiVersion, kind, namespace, name


@dataclass
class RecordingCluster:
    objects: dict[Key, Manifest] = field(default_factory=dict)
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    events: list[tuple[str, str, bool]] = field(default_factory=list)
    fail: dict[tuple[str, str], ApiError] = field(default_factory=dict)

    def put(self, obj: Manifest) -> None:
        meta = obj["metadata"]
        self.objects[(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])] = (
            copy.deepcopy(obj)
        )

    def _maybe_fail(self, verb: str, kind: str) -> None:
        err = self.fail.get((verb, kind))
        if err is not None:
            raise err

    async def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Manifest | None:
        self.calls.append(("get", kind, name))
        self._maybe_fail("get", kind)
        obj = self.objects.get((api_version, kind, namespace, name))
        return copy.deepcopy(obj) if obj else None

    async def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
    ) -> list[Manifest]:
        self.calls.append(("list", kind, namespace or ""))
        self._maybe_fail("list", kind)
        wanted = dict(s.split("=", 1) for s in label_selector.split(",")) if label_selector else {}
        return [
            copy.deepcopy(o)
            for (av, k, ns, _), o in self.objects.items()
            if av == api_version
            and k == kind
            and (namespace is None or ns == namespace)
            and all(o["metadata"].get("labels", {}).get(a) == b for a, b in wanted.items())
        ]

    async def apply(self, manifest: Manifest, *, subresource: str | None = None) -> Manifest:
        kind = manifest["kind"] + (f"/{subresource}" if subresource else "")
        self.calls.append(("apply", kind, manifest["metadata"]["name"]))
        self._maybe_fail("apply", kind)
        meta = manifest["metadata"]
        key = (manifest["apiVersion"], manifest["kind"], meta.get("namespace"), meta["name"])
        current = copy.deepcopy(self.objects.get(key, {}))
        if subresource == "status":
            current["status"] = copy.deepcopy(manifest["status"])
        else:
            status = current.get("status")
            current = copy.deepcopy(manifest)
            if status is not None:
                current["status"] = status
        # The one thing an apiserver always adds that the reconcile relies on: a uid,
        # which owner references need.
        current.setdefault("metadata", {}).setdefault("uid", f"uid-{kind}-{meta['name']}")
        self.objects[key] = current
        return copy.deepcopy(current)

    async def delete(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> None:
        self.calls.append(("delete", kind, name))
        self.objects.pop((api_version, kind, namespace, name), None)

    async def event(
        self, involved: Manifest, *, reason: str, message: str, warning: bool = False
    ) -> None:
        self.events.append((reason, message, warning))

    def applied(self, kind: str) -> list[str]:
        return [name for verb, k, name in self.calls if verb == "apply" and k == kind]
