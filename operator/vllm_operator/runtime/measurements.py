"""The measurements store as the InferenceService plans read it: one GET of the ConfigMap
``vllm-operator-measurements`` (k8s/measurements.py) shared by every service's passes for
:data:`MEASUREMENTS_TTL_SECONDS`, then another.

Why a read with a short lifetime, not a watch: the ConfigMap lives in the operator's own
namespace, which the watches may not cover (``operator.watchNamespaces`` names the
services' namespaces, not necessarily the operator's), and the chart's Role there grants
only ``get`` and ``patch`` of it by name: a watch would need ``list`` and ``watch`` and
a field selector on the name, which the labelled watches of the controller table do not
make. The store changes rarely (when a measured tuning run ends) and no service has to
react to its change at once: a plan takes a new record within a minute, at its next pass
(a watch event of its own, or the resync). So one request a minute for the whole operator,
whatever the number of services, costs less than a watch connection, and a converged pass
of a service sends no request for it (tests/reconcile/test_requests.py).

A read that fails is kept for the lifetime too (its line goes into the plans' notes), so
an unreadable store costs one request a minute as well, never one per pass.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from vllm_operator.k8s.api import ClusterAPI
from vllm_operator.k8s.measurements import StoredMeasurements, read_for_plans

__all__ = ["MEASUREMENTS_TTL_SECONDS", "MeasurementsCache"]

# How long one read of the store serves every plan.
MEASUREMENTS_TTL_SECONDS: Final = 60.0


@dataclass
class MeasurementsCache:
    """The last read of the store in ``namespace`` and when it was made (``clock``:
    monotonic seconds). Passes that find it stale at once wait for one read together."""

    namespace: str
    ttl_seconds: float = MEASUREMENTS_TTL_SECONDS
    clock: Callable[[], float] = time.monotonic
    _read: StoredMeasurements | None = None
    _at: float = 0.0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def read(self, api: ClusterAPI) -> StoredMeasurements:
        async with self._lock:
            now = self.clock()
            if self._read is None or now - self._at >= self.ttl_seconds:
                self._read = await read_for_plans(api, self.namespace)
                self._at = now
            return self._read
