"""The boundary between the operator and the Kubernetes API.

Everything above this layer talks to Kubernetes through ``ClusterAPI`` alone; the unit
tests drive the reconcile through a recording implementation of it (a boundary we own),
the cluster tests through the real one against a real apiserver.
"""

from __future__ import annotations

from typing import Protocol

from vllm_operator.models.base import Manifest


class ApiError(Exception):
    """A failed API request, classified once: transient (retry later) or not."""

    def __init__(
        self, status: int, reason: str, message: str, causes: tuple[str, ...] = ()
    ) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        # The reasons of the Status's details.causes (NamespaceTerminating, FieldValueInvalid).
        self.causes = causes

    @property
    def transient(self) -> bool:
        """429, 5xx and conflicts go away by themselves; 4xx others need a changed spec."""
        return self.status == 429 or self.status >= 500 or self.status in (0, 409)

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def namespace_terminating(self) -> bool:
        """Refused because the namespace is being deleted: what was asked goes with it."""
        return self.status == 403 and "NamespaceTerminating" in self.causes


class ClusterAPI(Protocol):
    async def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Manifest | None:
        """The object, or None when it does not exist."""
        ...

    async def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
    ) -> list[Manifest]:
        """Objects of a kind (in a namespace, or cluster-wide when None)."""
        ...

    async def apply(
        self,
        manifest: Manifest,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> Manifest:
        """Server-side apply under the operator's field manager (or ``field_manager``),
        forcing ownership."""
        ...

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
        """A JSON merge patch (for a subresource such as ``scale``, or one annotation)."""
        ...

    async def delete(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> None:
        """Delete (background propagation); absent objects are fine."""
        ...

    async def event(
        self, involved: Manifest, *, reason: str, message: str, warning: bool = False
    ) -> None:
        """Record an Event on an object."""
        ...


async def apply_status(
    api: ClusterAPI, body: Manifest, status: Manifest, *, field_manager: str | None = None
) -> Manifest:
    """Server-side apply of ``status`` to the status subresource of the object ``body``
    (only its identity is sent besides the status)."""
    meta = body["metadata"]
    return await api.apply(
        {
            "apiVersion": body["apiVersion"],
            "kind": body["kind"],
            "metadata": {"name": meta["name"], "namespace": meta.get("namespace")},
            "status": status,
        },
        subresource="status",
        field_manager=field_manager,
    )
