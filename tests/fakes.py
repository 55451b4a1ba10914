"""A recording ``ClusterAPI``: the boundary we own, faked for unit tests.

It stores what was applied and returns it, records every call, and can be told to fail a
call. It has no Kubernetes semantics (no defaulting, no controllers, no garbage
collection): tests that need those run against the real control plane in e2e/.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from vllm_operator.k8s.api import ApiError
from vllm_operator.models.base import Manifest

Key = tuple[str, str, str | None, str]  # apiVersion, kind, namespace, name


@dataclass
class RecordingCluster:
    objects: dict[Key, Manifest] = field(default_factory=dict)
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    events: list[tuple[str, str, bool]] = field(default_factory=list)
    fail: dict[tuple[str, str], ApiError] = field(default_factory=dict)
    status_owners: dict[Key, dict[str, str]] = field(default_factory=dict)

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
        # Equality terms (a=b) and existence terms (a), as the reconciles send them.
        terms = [t.partition("=") for t in label_selector.split(",")] if label_selector else []
        return [
            copy.deepcopy(o)
            for (av, k, ns, _), o in self.objects.items()
            if av == api_version
            and k == kind
            and (namespace is None or ns == namespace)
            and all(
                (a in labels if not sep else labels.get(a) == b)
                for a, sep, b in terms
                for labels in [o["metadata"].get("labels") or {}]
            )
        ]

    async def apply(
        self,
        manifest: Manifest,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> Manifest:
        kind = manifest["kind"] + (f"/{subresource}" if subresource else "")
        self.calls.append(("apply", kind, manifest["metadata"]["name"]))
        self._maybe_fail("apply", kind)
        meta = manifest["metadata"]
        key = (manifest["apiVersion"], manifest["kind"], meta.get("namespace"), meta["name"])
        current = copy.deepcopy(self.objects.get(key, {}))
        if subresource == "status":
            # Server-side apply at the granularity of status's top-level fields: a manager's
            # apply replaces the fields it applied before and leaves other managers' alone.
            manager = field_manager or "vllm-operator"
            owned = self.status_owners.setdefault(key, {})
            status = current.get("status") or {}
            for name in [n for n, m in owned.items() if m == manager]:
                status.pop(name, None)
                owned.pop(name)
            for name, value in manifest["status"].items():
                status[name] = copy.deepcopy(value)
                owned[name] = manager
            current["status"] = status
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
        """A JSON merge patch; ``scale`` writes spec.replicas, as the apiserver does."""
        full = kind + (f"/{subresource}" if subresource else "")
        self.calls.append(("patch", full, name))
        self._maybe_fail("patch", full)
        key = (api_version, kind, namespace, name)
        if key not in self.objects:
            raise ApiError(404, "NotFound", f"{kind} {name} not found")
        obj = self.objects[key]
        if subresource == "scale":
            obj.setdefault("spec", {})["replicas"] = patch["spec"]["replicas"]
        else:
            _merge(obj, patch)
        return copy.deepcopy(obj)

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


def _merge(target: Manifest, patch: Manifest) -> None:
    """RFC 7386 merge: null deletes, objects merge, everything else replaces."""
    for name, value in patch.items():
        if value is None:
            target.pop(name, None)
        elif isinstance(value, dict) and isinstance(target.get(name), dict):
            _merge(target[name], value)
        else:
            target[name] = copy.deepcopy(value)


def endpoint_slice(
    namespace: str, service: str, ready: int, *, unready: int = 0, name: str | None = None
) -> Manifest:
    """An EndpointSlice as the EndpointSlice controller writes one for Service ``service``
    of an InferenceService of the same name: the Service's labels copied, its name in
    ``kubernetes.io/service-name``, ``ready`` endpoints and ``unready`` ones."""
    from vllm_operator.constants import LABEL_SERVICE

    endpoints = [
        {"addresses": [f"198.19.0.{i + 1}"], "conditions": {"ready": i < ready}}
        for i in range(ready + unready)
    ]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name or f"{service}-abcde",
            "namespace": namespace,
            "labels": {LABEL_SERVICE: service, "kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
    }
