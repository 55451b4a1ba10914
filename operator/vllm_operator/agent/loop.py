"""The agent's loop: read NVML, apply the power policy, probe on request, publish the status.

``cycle`` is one pass over the GPUs (blocking; it runs in a worker thread): it reads
NVML, makes the power policy's set-calls (none in a dry run), runs the bandwidth probe
when ``spec.probe.requestId`` is new, and computes the whole status. Both the cluster
mode (``Agent``) and the no-apiserver mode (``--print``) use it.

``Agent`` runs ``cycle`` against the node's GPUNode: on start, then whenever the GPUNode's
spec changes (a watch wakes it) and at least every ``interval``. It writes the status only
when it changed (see ``status.needs_write``). On SIGTERM it restores the original power
limits (the agent being removed must not leave GPUs capped or raised), marks the status
stale, and exits. Errors of the API or NVML are logged and retried on the next pass;
nothing in the loop ends the process except a stop request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from vllm_operator.agent import conditions as cond
from vllm_operator.agent import power
from vllm_operator.agent.inventory import inventory, node_labels
from vllm_operator.agent.logs import kv
from vllm_operator.agent.nvml import NvmlReader
from vllm_operator.agent.probe import ProbeRun, probe_status
from vllm_operator.agent.readings import NvmlCallError, NvmlSnapshot
from vllm_operator.agent.status import compute_status, needs_write
from vllm_operator.agent.store import GPUNodeStore, StoreError
from vllm_operator.agent.topology import links
from vllm_operator.models.conditions import find
from vllm_operator.models.gpu_node import GPUNodeSpec, GPUNodeStatus, PowerSpec

log = logging.getLogger(__name__)

Prober = Callable[[Mapping[str, int]], ProbeRun]


def utc_now() -> datetime:
    """Now, to the second: Kubernetes times carry no fractions, so a round trip is exact."""
    return datetime.now(UTC).replace(microsecond=0)


@dataclass(frozen=True)
class CycleResult:
    """One pass: the status to publish, the NVML read it came from, what was set."""

    status: GPUNodeStatus
    snapshot: NvmlSnapshot | None
    set_calls: int = 0
    labels: dict[str, str] = field(default_factory=dict)


def cycle(
    reader: NvmlReader,
    spec: GPUNodeSpec,
    previous: GPUNodeStatus | None,
    *,
    dry_run: bool,
    prober: Prober | None,
    now: datetime,
    generation: int | None,
    node: str,
) -> CycleResult:
    """Read, act and compute the status once. Blocking; never raises for NVML errors."""
    prev = previous or GPUNodeStatus()
    try:
        snapshot = reader.snapshot()
    except NvmlCallError as error:
        log.warning(
            "Failed to read GPUs through NVML",
            extra=kv(gpuNode=node, reason=error.reason, err=error.message),
        )
        fact = cond.Fact(
            cond.POWER_POLICY_APPLIED,
            "Unknown" if spec.power.policy == "Unmanaged" else "False",
            error.reason,
            error.message,
        )
        status = compute_status(
            snapshot=None,
            nvml_error=error,
            previous=previous,
            power_records=None,
            power_fact=fact,
            bandwidth=None,
            generation=generation,
            now=now,
        )
        return CycleResult(status=status, snapshot=None)

    the_plan = power.plan(spec.power, snapshot.devices, prev.power, dry_run=dry_run)
    failures: dict[int, NvmlCallError] = {}
    done = 0
    for action in the_plan.actions:
        fields = kv(
            gpuNode=node,
            gpu=action.index,
            uuid=action.uuid,
            fromWatts=None if action.from_milliwatts is None else action.from_milliwatts / 1000,
            toWatts=action.to_milliwatts / 1000,
            purpose=action.purpose,
            policy=spec.power.policy,
        )
        if dry_run:
            log.info("Skipped power limit change (dry run)", extra=fields)
            continue
        try:
            reader.set_power_limit(action.index, action.to_milliwatts)
        except NvmlCallError as error:
            failures[action.index] = error
            fields["kv"].update(reason=error.reason, err=error.message)
            log.warning("Failed to set power limit", extra=fields)
            continue
        done += 1
        log.info(
            "Restored power limit" if action.purpose == "Restore" else "Applied power limit",
            extra=fields,
        )
    if done:
        try:
            snapshot = reader.snapshot()  # show the limits as they are now
        except NvmlCallError as error:
            log.warning("Failed to re-read GPUs", extra=kv(gpuNode=node, err=error.message))
    records, power_fact = power.outcome(the_plan, failures)

    bandwidth = None
    request = spec.probe.request_id
    if (
        prober is not None
        and request
        and (prev.bandwidth is None or prev.bandwidth.request_id != request)
    ):
        log.info("Started bandwidth probe", extra=kv(gpuNode=node, requestId=request))
        run = prober({d.pci_bus_id: d.index for d in snapshot.devices})
        bandwidth = probe_status(request, run, snapshot, links(snapshot), measured_at=now)
        log.info(
            "Finished bandwidth probe",
            extra=kv(
                gpuNode=node,
                requestId=request,
                results=len(bandwidth.results),
                errors=len(run.errors),
            ),
        )
    status = compute_status(
        snapshot=snapshot,
        nvml_error=None,
        previous=previous,
        power_records=records,
        power_fact=power_fact,
        bandwidth=bandwidth,
        generation=generation,
        now=now,
    )
    return CycleResult(
        status=status,
        snapshot=snapshot,
        set_calls=done,
        labels=node_labels(inventory(snapshot)),
    )


@dataclass(frozen=True)
class AgentConfig:
    """How the agent runs; see ``agent.cli`` for each option's meaning."""

    node_name: str
    interval: float = 30.0
    refresh: float = 300.0
    dry_run: bool = False
    label_node: bool = False


def _parse(obj: Mapping[str, Any] | None) -> tuple[GPUNodeSpec, GPUNodeStatus | None, int | None]:
    if obj is None:
        return GPUNodeSpec(), None, None
    meta = obj.get("metadata") or {}
    try:
        spec = GPUNodeSpec.model_validate(obj.get("spec") or {})
    except ValidationError as error:
        # Admission validates the spec; this guards against a CRD older than the agent.
        log.warning("Ignored invalid GPUNode spec", extra=kv(gpuNode=meta.get("name"), err=error))
        spec = GPUNodeSpec()
    status: GPUNodeStatus | None = None
    if obj.get("status"):
        try:
            status = GPUNodeStatus.model_validate(obj["status"])
        except ValidationError as error:
            log.warning("Ignored unreadable GPUNode status", extra=kv(err=str(error)))
    generation = meta.get("generation")
    return spec, status, generation if isinstance(generation, int) else None


class Agent:
    """The node agent against the apiserver."""

    def __init__(
        self,
        config: AgentConfig,
        reader: NvmlReader,
        store: GPUNodeStore,
        *,
        prober: Prober | None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.config = config
        self.reader = reader
        self.store = store
        self.prober = prober
        self.clock = clock
        self._node_uid: str | None = None
        self._generation: int | None = None
        self._node_labels: dict[str, str] | None = None

    @property
    def name(self) -> str:
        return self.config.node_name

    async def _ensure_metadata(self, obj: Mapping[str, Any] | None, labels: dict[str, str]) -> None:
        if self._node_uid is None:
            self._node_uid = await self.store.node_uid(self.name)
            if self._node_uid is None:
                raise StoreError(404, f"Node {self.name} not found")
        meta = (obj or {}).get("metadata") or {}
        owners = meta.get("ownerReferences") or []
        have = meta.get("labels") or {}
        owned = any(o.get("uid") == self._node_uid for o in owners)
        if obj is not None and owned and all(have.get(k) == v for k, v in labels.items()):
            return
        await self.store.apply_metadata(self.name, node_uid=self._node_uid, labels=labels)
        log.info(
            "Created GPUNode" if obj is None else "Updated GPUNode metadata",
            extra=kv(gpuNode=self.name, labels=",".join(f"{k}={v}" for k, v in labels.items())),
        )

    async def step(self) -> CycleResult:
        """One pass against the GPUNode."""
        obj = await self.store.get(self.name)
        if obj is None:
            # Create it first (labels come once the GPUs are read), so the spec's defaults
            # and generation come from the apiserver, as for any other object.
            await self._ensure_metadata(None, {})
            obj = await self.store.get(self.name)
        spec, status, generation = _parse(obj)
        self._generation = generation
        result = await asyncio.to_thread(
            cycle,
            self.reader,
            spec,
            status,
            dry_run=self.config.dry_run,
            prober=self.prober,
            now=self.clock(),
            generation=generation,
            node=self.name,
        )
        if result.snapshot is not None:
            await self._ensure_metadata(obj, result.labels)
            if self.config.label_node and result.labels != self._node_labels:
                await self.store.label_node(self.name, result.labels)
                self._node_labels = result.labels
                log.info("Labelled Node", extra=kv(node=self.name))
        await self._publish(result.status, status)
        return result

    async def _publish(self, new: GPUNodeStatus, written: GPUNodeStatus | None) -> None:
        now = self.clock()
        if not needs_write(
            new,
            written,
            written_at=written.last_updated if written else None,
            now=now,
            refresh=timedelta(seconds=self.config.refresh),
        ):
            return
        await self.store.apply_status(self.name, new.to_wire())
        ready = find(new.conditions, cond.READY)
        log.info(
            "Updated GPUNode status",
            extra=kv(
                gpuNode=self.name,
                gpus=len(new.gpus),
                interconnect=new.interconnect,
                ready=ready.status if ready else "Unknown",
            ),
        )

    async def run(self, stop: asyncio.Event, *, once: bool = False) -> None:
        """Loop until ``stop`` is set (or once), then restore the power limits."""
        while not stop.is_set():
            try:
                await self.step()
            except StoreError as error:
                log.warning(
                    "Failed to sync GPUNode",
                    extra=kv(gpuNode=self.name, status=error.status, err=error.message),
                )
            except Exception:
                # A bug must not take the node's power management down with it: log, retry.
                log.exception("Failed to sync GPUNode", extra=kv(gpuNode=self.name))
            if once:
                break
            await self._wait(stop)
        if not once:
            await self.shutdown()

    async def _wait(self, stop: asyncio.Event) -> None:
        """Until the spec changes, the interval passes, or stop is requested."""
        watcher = asyncio.ensure_future(
            self.store.wait_for_change(
                self.name, generation=self._generation, timeout=self.config.interval
            )
        )
        stopper = asyncio.ensure_future(stop.wait())
        timer = asyncio.ensure_future(asyncio.sleep(self.config.interval))
        try:
            done, _ = await asyncio.wait(
                {watcher, stopper, timer}, return_when=asyncio.FIRST_COMPLETED
            )
            if watcher in done and watcher.exception() is not None:
                # The watch failed at once (apiserver away): wait out the interval instead.
                await asyncio.wait({stopper, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (watcher, stopper, timer):
                task.cancel()
            await asyncio.gather(watcher, stopper, timer, return_exceptions=True)

    async def shutdown(self) -> None:
        """Restore every limit the agent changed (none in a dry run), mark the status stale."""
        try:
            obj = await self.store.get(self.name)
            spec, status, generation = _parse(obj)
            restored = 0
            if self.config.dry_run:
                final = status
            else:
                unmanaged = spec.model_copy(update={"power": PowerSpec()})
                result = await asyncio.to_thread(
                    cycle,
                    self.reader,
                    unmanaged,
                    status,
                    dry_run=False,
                    prober=None,
                    now=self.clock(),
                    generation=generation,
                    node=self.name,
                )
                final, restored = result.status, result.set_calls
            if obj is not None and final is not None:
                await self.store.apply_status(self.name, _stopped(final, self.clock()).to_wire())
            log.info(
                "Stopped node agent",
                extra=kv(gpuNode=self.name, dryRun=self.config.dry_run, restored=restored),
            )
        except Exception:
            log.exception("Failed to restore power limits on stop", extra=kv(gpuNode=self.name))


def _stopped(status: GPUNodeStatus, now: datetime) -> GPUNodeStatus:
    """The status with Ready=False: nobody keeps it current any more."""
    stopped = cond.Fact(
        cond.READY, "False", "AgentStopped", "the node agent stopped; status not updated"
    )
    others = [
        cond.Fact(c.type, c.status, c.reason, c.message)
        for c in status.conditions
        if c.type != cond.READY
    ]
    merged = cond.merge(
        status.conditions, [stopped, *others], now=now, generation=status.observed_generation
    )
    return status.model_copy(update={"conditions": merged})
