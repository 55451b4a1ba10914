"""The agent's view of the apiserver: its GPUNode and its Node, behind a small protocol.

The loop talks to the apiserver only through ``GPUNodeStore``; ``agent.kube`` implements it
with kubernetes_asyncio, the unit tests with a recording fake. Keeping the protocol apart
from the client also lets ``--print`` run where no Kubernetes client is installed.
"""

from __future__ import annotations

from typing import Protocol

from vllm_operator.models.base import Manifest


class StoreError(Exception):
    """An API request failed; ``transient`` says whether retrying later may help."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message

    @property
    def transient(self) -> bool:
        return self.status == 0 or self.status == 429 or self.status >= 500 or self.status == 409


class GPUNodeStore(Protocol):
    """What the agent needs from the apiserver."""

    async def node_uid(self, name: str) -> str | None:
        """The Node's uid, or None when there is no such Node."""
        ...

    async def get(self, name: str) -> Manifest | None:
        """The GPUNode, or None."""
        ...

    async def apply_metadata(self, name: str, *, node_uid: str, labels: dict[str, str]) -> Manifest:
        """Create the GPUNode or update the agent's metadata on it (never the spec)."""
        ...

    async def apply_status(self, name: str, status: Manifest) -> Manifest:
        """Write the status subresource."""
        ...

    async def label_node(self, name: str, labels: dict[str, str]) -> None:
        """Set labels on the Node."""
        ...

    async def wait_for_change(self, name: str, *, generation: int | None, timeout: float) -> None:  # noqa: ASYNC109
        """Return when the GPUNode's spec changed (its generation moved) or after timeout."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
