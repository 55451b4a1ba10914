"""The chaos phase's noisy neighbour: CPUs burnt beside a target pod, only while told.

The operator starts the neighbour with the load Job, as a Job of its own pinned to the
node of one of the target's Ready pods (``vllm-operator noisy-neighbour``). Neighbour and
load Job talk through two keys of the benchmark's results ConfigMap, which both may read
and patch under the load Job's ServiceAccount (its Role allows that one ConfigMap and no
other):

- ``chaos-neighbour-order`` (the load Job writes it): ``{"burn": bool, "until": t,
  "done": bool}``, ``t`` in Unix seconds;
- ``chaos-neighbour-state`` (the neighbour writes it): ``{"node": ..., "cpus": n,
  "burning": bool, "at": t, "allowed": [...], "nodeCpus": m, "beside": ..., "besideQos": ...}``:
  the CPUs its processes may run on (its cpuset) of the node's ``m``, and the target pod
  it was placed beside with that pod's QoS class.

The neighbour burns while the order says ``burn`` and ``until`` has not passed, and exits
on ``done``. Every way a run can end stops the burn: the load Job writes ``done`` when its
chaos phase ends, however it ends; if the load Job dies, ``until`` passes (the perturbed
run's expected length and a margin); if the neighbour cannot read the order for
``STALE_S``, it stops burning; the neighbour Job's ``activeDeadlineSeconds`` and the
benchmark's ownership bound its life, operator up or not.

A burn is one busy process per CPU taken (the share of the node's CPUs, at least one),
BestEffort, as a rogue process on the node would be: a container whose CPU the static CPU
manager pins is out of its reach, one in the shared pool is not. Which it was shows in the
perturbation's words (:meth:`NeighbourState.describe`): the CPUs the neighbour was kept
off are the ones the kubelet holds for pinned containers.

kubernetes_asyncio is imported only by :class:`ConfigMapBoard`, when a cluster is used.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import math
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

log = logging.getLogger(__name__)

ORDER_KEY: Final = "chaos-neighbour-order"
STATE_KEY: Final = "chaos-neighbour-state"
POLL_S: Final = 0.5
# The neighbour stops burning when it has not read an order for this long.
STALE_S: Final = 15.0
# How long the load Job waits for the neighbour to burn before its run (pod start).
START_WAIT_S: Final = 120.0
REQUEST_TIMEOUT_S: Final = 10


class Board(Protocol):
    """Where orders and state are written: the results ConfigMap's ``data``."""

    async def read(self) -> Mapping[str, str]: ...

    async def write(self, values: Mapping[str, str]) -> None: ...


class ConfigMapBoard:
    """A :class:`Board` on ConfigMap ``namespace/name`` (get and merge patch)."""

    def __init__(self, name: str, namespace: str) -> None:
        self.name = name
        self.namespace = namespace
        self._api: Any = None

    async def __aenter__(self) -> ConfigMapBoard:
        from vllm_operator.bench.upload import api_client

        # The client's import takes a good part of a second: off the sending loop.
        await asyncio.to_thread(importlib.import_module, "kubernetes_asyncio.client")

        self._api = await api_client()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._api is not None:
            await self._api.close()

    def _core(self) -> Any:
        from kubernetes_asyncio import client

        return client.CoreV1Api(self._api)

    async def read(self) -> Mapping[str, str]:
        cm = await self._core().read_namespaced_config_map(
            self.name, self.namespace, _request_timeout=REQUEST_TIMEOUT_S
        )
        return dict(cm.data or {})

    async def write(self, values: Mapping[str, str]) -> None:
        await self._core().patch_namespaced_config_map(
            self.name, self.namespace, {"data": dict(values)}, _request_timeout=REQUEST_TIMEOUT_S
        )


def _decoded(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# --- the load Job's side -------------------------------------------------------------------


def cpu_list(cpus: Iterable[int]) -> str:
    """CPUs in the kernel's list format (``0-3,6``), as cpuset and /proc show them."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


@dataclass(frozen=True)
class NeighbourState:
    node: str
    cpus: int
    burning: bool
    # The CPUs the neighbour could run on, of the node's node_cpus (empty: not reported).
    allowed: tuple[int, ...] = ()
    node_cpus: int = 0
    # The target pod it burns beside, and that pod's QoS class.
    beside: str = ""
    beside_qos: str = ""

    @classmethod
    def of(cls, state: Mapping[str, Any]) -> NeighbourState:
        return cls(
            str(state.get("node")),
            int(state.get("cpus", 0)),
            bool(state.get("burning")),
            tuple(int(c) for c in state.get("allowed") or ()),
            int(state.get("nodeCpus", 0)),
            str(state.get("beside") or ""),
            str(state.get("besideQos") or ""),
        )

    def describe(self) -> str:
        """The perturbation in words: what burnt where, beside which pod, and whether the
        kubelet kept the burn off some CPUs (those it holds for pinned containers)."""
        plural = "s" if self.cpus != 1 else ""
        words = f"noisy neighbour: {self.cpus} CPU{plural} burnt on node {self.node}"
        if self.beside:
            qos = f" ({self.beside_qos} QoS)" if self.beside_qos else ""
            words += f" beside pod {self.beside}{qos}"
        if self.allowed and self.node_cpus:
            kept_off = set(range(self.node_cpus)) - set(self.allowed)
            if kept_off:
                words += (
                    f", on CPUs {cpu_list(self.allowed)} only "
                    f"({cpu_list(kept_off)} held for pinned containers)"
                )
            else:
                words += f", on all CPUs ({cpu_list(self.allowed)})"
        return words


async def order(board: Board, *, burn: bool, until: float = 0.0, done: bool = False) -> None:
    await board.write(
        {ORDER_KEY: json.dumps({"burn": burn, "until": until, "done": done}, sort_keys=True)}
    )


async def start_burn(
    board: Board, *, seconds: float, wait_s: float = START_WAIT_S, poll_s: float = POLL_S
) -> NeighbourState | str:
    """Tell the neighbour to burn for ``seconds`` at most; its state once it burns, or why
    it does not (it never answered within ``wait_s``)."""
    await order(board, burn=True, until=time.time() + seconds)
    deadline = time.monotonic() + wait_s
    while True:
        state = _decoded((await board.read()).get(STATE_KEY))
        if state.get("burning"):
            return NeighbourState.of(state)
        if time.monotonic() >= deadline:
            return f"the neighbour did not start burning within {wait_s:g} s (see its Job's pod)"
        await asyncio.sleep(poll_s)


# --- the neighbour's side ------------------------------------------------------------------


def _burn() -> None:
    """One busy CPU, until terminated."""
    while True:
        pass


class Burner(Protocol):
    def start(self, cpus: int) -> None: ...

    def stop(self) -> None: ...


class ProcessBurner:
    """``cpus`` busy processes (processes, not threads: the GIL would hold threads to one)."""

    def __init__(self) -> None:
        self._procs: list[multiprocessing.process.BaseProcess] = []

    def start(self, cpus: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._procs = [context.Process(target=_burn, daemon=True) for _ in range(cpus)]
        for proc in self._procs:
            proc.start()

    def stop(self) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            proc.join(timeout=5)
        self._procs = []


def cpus_to_burn(share: float, node_cpus: int) -> int:
    return max(1, min(node_cpus, math.floor(share * node_cpus + 0.5)))


async def run_neighbour(
    board: Board,
    *,
    cpu_share: float,
    node: str,
    deadline_s: float,
    burner: Burner | None = None,
    node_cpus: int | None = None,
    allowed: Iterable[int] | None = None,
    beside: str = "",
    beside_qos: str = "",
    poll_s: float = POLL_S,
    clock: Callable[[], float] = time.time,
) -> str:
    """Burn while the order says so; returns why it stopped ("done" or "deadline").
    ``allowed``: the CPUs its processes may run on (default: this process's affinity)."""
    burner = burner or ProcessBurner()
    node_cpus = node_cpus or os.cpu_count() or 1
    cpus = cpus_to_burn(cpu_share, node_cpus)
    given = None if allowed is None else sorted(allowed)
    burning = False
    last_read = time.monotonic()
    end = time.monotonic() + deadline_s

    async def report() -> None:
        state = {
            "node": node,
            "cpus": cpus,
            "burning": burning,
            "at": clock(),
            # Read as each state is written: the kubelet may move the cpuset meanwhile.
            "allowed": given if given is not None else sorted(os.sched_getaffinity(0)),
            "nodeCpus": node_cpus,
            "beside": beside,
            "besideQos": beside_qos,
        }
        try:
            await board.write({STATE_KEY: json.dumps(state, sort_keys=True)})
        except Exception as exc:
            log.warning("Could not write the neighbour's state: %s", exc)

    why = "deadline"
    try:
        await report()
        while time.monotonic() < end:
            try:
                current = _decoded((await board.read()).get(ORDER_KEY))
                last_read = time.monotonic()
            except Exception as exc:
                log.warning("Could not read the order: %s", exc)
                current = None
            if current is not None and current.get("done"):
                why = "done"
                break
            stale = time.monotonic() - last_read > STALE_S
            want = (
                not stale
                and current is not None
                and bool(current.get("burn"))
                and clock() < float(current.get("until") or 0)
            ) or (current is None and burning and not stale)
            if want != burning:
                if want:
                    burner.start(cpus)
                    log.info("Burning %d CPUs on node %s", cpus, node)
                else:
                    burner.stop()
                    log.info("Stopped burning on node %s", node)
                burning = want
                await report()
            await asyncio.sleep(poll_s)
    finally:
        if burning:
            burner.stop()
            burning = False
            await report()
    return why


# --- the command ---------------------------------------------------------------------------


def add_parser(subparsers: Any) -> Any:
    """Register ``noisy-neighbour`` on the top-level CLI's subparsers."""
    import argparse

    parser = subparsers.add_parser(
        "noisy-neighbour",
        help="Burn CPUs while a benchmark's load Job says so (an InferenceBenchmark's chaos).",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config-map", required=True, help="the benchmark's results ConfigMap")
    parser.add_argument("--namespace", required=True, help="its namespace")
    parser.add_argument(
        "--cpu-share", type=float, required=True, help="share of the node's CPUs (0 to 1]"
    )
    parser.add_argument(
        "--node", default=os.environ.get("NODE_NAME", ""), help="the node (default: $NODE_NAME)"
    )
    parser.add_argument(
        "--deadline-seconds", type=float, required=True, help="exit after this long at most"
    )
    parser.add_argument("--beside", default="", help="the target pod it burns beside")
    parser.add_argument("--beside-qos", default="", help="that pod's QoS class")
    parser.set_defaults(func=_cmd)
    return parser


def _cmd(args: Any) -> int:
    import sys

    if not 0 < args.cpu_share <= 1:
        print(f"--cpu-share: must be above 0 and at most 1, got {args.cpu_share}", file=sys.stderr)
        return 2
    if not args.deadline_seconds > 0:
        print("--deadline-seconds: must be above 0", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    async def go() -> str:
        async with ConfigMapBoard(args.config_map, args.namespace) as board:
            return await run_neighbour(
                board,
                cpu_share=args.cpu_share,
                node=args.node,
                deadline_s=args.deadline_seconds,
                beside=args.beside,
                beside_qos=args.beside_qos,
            )

    why = asyncio.run(go())
    log.info("The neighbour stops: %s", why)
    return 0
