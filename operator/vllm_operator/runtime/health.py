"""Liveness: whether the work loop makes progress, and the ``/healthz`` endpoint that says so;
readiness (``/readyz``): that, and the caches filled by their first LISTs.

A stuck operator is one where work waits and nothing completes: a key has been due, or
its reconcile running, or the resync overdue, for longer than the bound, and no
reconcile and no resync LIST succeeded within the bound. An idle operator (nothing due,
the resync on time) is healthy however long ago it last did anything, and a busy one is
healthy while anything completes. The kubelet restarts the pod when ``/healthz`` fails.

Our own endpoint rather than Kopf's ``liveness_endpoint`` with an ``@kopf.on.probe``:
Kopf's answers 200 while its event loop runs, and a probe handler that raises is retried
by Kopf's activity machinery before the request fails as a 500 with a traceback logged
per probe; here the decision is one pure function and a failure is a 503 with its reason.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from aiohttp import web

log = logging.getLogger(__name__)

# What the endpoint asks: the reason the operator is stuck, or None when it is not.
Check = Callable[[], str | None]


def stuck(
    now: float, *, waiting_since: float | None, last_progress: float, bound: float
) -> str | None:
    """Why the work loop is stuck at ``now`` (monotonic seconds), or None.

    ``waiting_since``: since when work has waited (None: nothing waits); ``last_progress``:
    when a reconcile or a resync last completed (or the runtime started)."""
    if waiting_since is None or now - waiting_since <= bound:
        return None
    if now - last_progress <= bound:
        return None
    return (
        f"work has waited {now - waiting_since:.0f} s and nothing completed for "
        f"{now - last_progress:.0f} s (the bound is {bound:.0f} s)"
    )


class HealthServer:
    """``GET /healthz``: 200 while ``check`` finds nothing wrong, else 503 with the reason.
    ``GET /readyz``: the same, and 503 with the reason while ``ready`` finds the operator
    not ready yet (its caches not filled: it would reconcile from reads of its own). The
    kubelet restarts the pod on the first, takes it out of ``kubectl rollout status`` and
    ``helm --wait`` on the second."""

    def __init__(
        self, check: Check, *, ready: Check | None = None, host: str = "0.0.0.0", port: int
    ) -> None:
        self._check = check
        self._ready = ready if ready is not None else lambda: None
        self._host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    def _answer(self, stuck_reason: str | None, starting: str | None) -> web.Response:
        """200, or 503 with the reason: stuck before starting."""
        if stuck_reason is not None:
            log.warning("Liveness failed: %s.", stuck_reason, extra={"reason": stuck_reason})
            body = {"status": "stuck", "reason": stuck_reason}
        elif starting is not None:
            body = {"status": "starting", "reason": starting}
        else:
            return web.Response(text=json.dumps({"status": "ok"}), content_type="application/json")
        return web.Response(status=503, text=json.dumps(body), content_type="application/json")

    async def _healthz(self, _: web.Request) -> web.Response:
        return self._answer(self._check(), None)

    async def _readyz(self, _: web.Request) -> web.Response:
        stuck_reason = self._check()
        return self._answer(stuck_reason, self._ready() if stuck_reason is None else None)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, self.port).start()
        self.port = self._runner.addresses[0][1]  # the one bound, when asked for 0

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
