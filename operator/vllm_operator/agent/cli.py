"""``vllm-operator agent``: the GPU node agent's command line.

In a cluster (the DaemonSet) it runs until SIGTERM, publishing the GPUNode named after its
node (``NODE_NAME``, from the downward API) through the pod's service account:

    vllm-operator agent [--dry-run] [--interval 30]

Locally, against any apiserver, with a recorded NVML answer set instead of real GPUs:

    vllm-operator agent --node-name gpu-4090x2 --kubeconfig KUBECONFIG \\
        --nvml-fixture tests/agent/fixtures/rtx4090x2-phb.yaml --nvml-record calls.jsonl

Without an apiserver, printing the GPUNode it would publish (always a dry run):

    vllm-operator agent --print --policy Max --probe --dump-nvml nvml.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_operator.agent import logs
from vllm_operator.agent.logs import kv
from vllm_operator.agent.nvml import FixtureReader, NvmlReader, PynvmlReader, ReadOnlyReader
from vllm_operator.agent.readings import dump_snapshot
from vllm_operator.constants import API_VERSION, KIND_GPU_NODE
from vllm_operator.models.gpu_node import GPUNodeSpec, PowerSpec, ProbeSpec

log = logging.getLogger(__name__)

HELP = "Run the GPU node agent: inventory, power policy and bandwidth probe for one node."


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="Node (and GPUNode) name (default: $NODE_NAME).",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=30.0,
        help="Seconds between reads when nothing changes (default: 30).",
    )
    parser.add_argument(
        "--refresh",
        type=float,
        default=300.0,
        help="Seconds after which temperatures, clocks and draw are written even when "
        "nothing else changed (default: 300).",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="Report the power changes the policy asks for; change nothing on any GPU.",
    )
    parser.add_argument(
        "--once", action="store_true", help="One pass, then exit (limits are not restored)."
    )
    parser.add_argument(
        "--nvml-fixture",
        type=Path,
        help="Answer from this recorded NVML answer set (JSON or YAML) instead of NVML.",
    )
    parser.add_argument(
        "--nvml-record",
        type=Path,
        help="With --nvml-fixture: append every power set-call to this file (JSON lines).",
    )
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="Kubeconfig file (default: $KUBECONFIG, else the pod's service account).",
    )
    parser.add_argument(
        "--label-node",
        action="store_true",
        help="Also set the GPU labels on the Node (needs patch on nodes).",
    )
    parser.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="No apiserver: print the GPUNode as JSON and exit. Always a dry run.",
    )
    parser.add_argument(
        "--policy",
        choices=["Unmanaged", "Default", "Max", "Watts"],
        default="Unmanaged",
        help="With --print: the power policy to evaluate (default: Unmanaged).",
    )
    parser.add_argument("--watts", type=int, help="With --print and --policy Watts: the limit.")
    parser.add_argument("--probe", action="store_true", help="With --print: run the probe.")
    parser.add_argument(
        "--dump-nvml",
        type=Path,
        help="With --print or --once: write the raw NVML answer set read to this file.",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR.")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``agent`` on the main command's subparsers (``func`` runs it)."""
    parser: argparse.ArgumentParser = subparsers.add_parser("agent", help=HELP, description=HELP)
    _arguments(parser)
    parser.set_defaults(func=run)
    return parser


def _reader(args: argparse.Namespace) -> NvmlReader:
    reader: NvmlReader
    if args.nvml_fixture is not None:
        reader = FixtureReader(args.nvml_fixture, record=args.nvml_record)
    else:
        reader = PynvmlReader()
    # Dry run: a reader that cannot set anything, whatever the logic above it decides.
    return ReadOnlyReader(reader) if args.dry_run or args.print_only else reader


def _prober() -> Any:
    from vllm_operator.agent.cuda import run_probe

    return run_probe


def _print(args: argparse.Namespace, reader: NvmlReader) -> int:
    from vllm_operator.agent.loop import cycle, utc_now

    try:
        spec = GPUNodeSpec(
            power=PowerSpec(policy=args.policy, watts=args.watts),
            probe=ProbeSpec(request_id="cli" if args.probe else None),
        )
    except ValueError as error:
        print(f"vllm-operator agent: {error}", file=sys.stderr)
        return 2
    name = args.node_name or os.uname().nodename
    result = cycle(
        reader,
        spec,
        None,
        dry_run=True,
        prober=_prober() if args.probe else None,
        now=utc_now(),
        generation=None,
        node=name,
    )
    if args.dump_nvml is not None and result.snapshot is not None:
        args.dump_nvml.write_text(dump_snapshot(result.snapshot))
    obj: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND_GPU_NODE,
        "metadata": {"name": name, "labels": result.labels},
        "spec": spec.to_wire(),
        "status": result.status.to_wire(),
    }
    print(json.dumps(obj, indent=2))
    return 0


async def _serve(args: argparse.Namespace, reader: NvmlReader) -> int:
    from vllm_operator.agent.kube import KubeStore
    from vllm_operator.agent.loop import Agent, AgentConfig
    from vllm_operator.agent.store import StoreError

    store = await KubeStore.connect(args.kubeconfig)
    agent = Agent(
        AgentConfig(
            node_name=args.node_name,
            interval=args.interval,
            refresh=args.refresh,
            dry_run=args.dry_run,
            label_node=args.label_node,
        ),
        reader,
        store,
        prober=_prober(),
    )
    try:
        if args.once:
            try:
                result = await agent.step()
            except StoreError as error:
                log.error("Failed to sync GPUNode", extra=kv(gpuNode=args.node_name, err=error))
                return 1
            if args.dump_nvml is not None and result.snapshot is not None:
                args.dump_nvml.write_text(dump_snapshot(result.snapshot))
            return 0
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info(
            "Started node agent",
            extra=kv(gpuNode=args.node_name, dryRun=args.dry_run, interval=args.interval),
        )
        await agent.run(stop)
        return 0
    finally:
        await store.close()


def run(args: argparse.Namespace) -> int:
    """Run the agent with parsed arguments; the exit code."""
    logs.setup(args.log_level)
    if not args.print_only and not args.node_name:
        print("vllm-operator agent: --node-name or $NODE_NAME is required", file=sys.stderr)
        return 2
    if args.nvml_record is not None and args.nvml_fixture is None:
        print("vllm-operator agent: --nvml-record needs --nvml-fixture", file=sys.stderr)
        return 2
    reader = _reader(args)
    try:
        if args.print_only:
            return _print(args, reader)
        return asyncio.run(_serve(args, reader))
    finally:
        reader.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``vllm-operator agent`` as a program of its own."""
    parser = argparse.ArgumentParser(prog="vllm-operator agent", description=HELP)
    _arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
