"""What the offline commands read: manifests from files, and a GPU shape from flags.

``vllm-operator tune`` and ``vllm-operator render`` take the same GPU flags (``--gpu``,
``--count``, ``--interconnect``, ``--gpu-memory``, ``--gpu-node``, and the network between
nodes) and the same InferenceService files, and refuse bad ones with the same words: one
parser here, so the two commands cannot drift apart. Neither command writes or contacts
anything; every refusal is an :class:`InputError` whose message names the flag, file or
field, which the commands print and exit 2 on.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from vllm_operator.constants import (
    NODE_LABEL_GPUDIRECT_RDMA,
    NODE_LABEL_NETWORK,
    NODE_LABEL_NETWORK_GBPS,
)
from vllm_operator.models.base import field_errors
from vllm_operator.models.gpu_node import GPUNode
from vllm_operator.models.inference_service import InferenceService
from vllm_operator.tuning import gpus
from vllm_operator.tuning.measurements import Measurements, MeasurementsError
from vllm_operator.tuning.network import network_from_labels

__all__ = [
    "InputError",
    "add_gpu_arguments",
    "gpu_node",
    "gpu_profile",
    "network_labels",
    "positive",
    "read_documents",
    "read_service",
    "read_yaml",
    "refusal",
]


class InputError(ValueError):
    """A flag or file the command cannot use; the message says which and why."""


def refusal(exc: InputError | ValidationError) -> str:
    """What a command prints for a refusal: the InputError's message, or the models'
    refusal as field paths (models/base.py, field_errors)."""
    return field_errors(exc) if isinstance(exc, ValidationError) else str(exc)


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1 (argparse names the flag)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def add_gpu_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The "GPUs" flags, as a group a command may add its own to."""
    hw = parser.add_argument_group("GPUs")
    hw.add_argument("--gpu", help=f"GPU product ({', '.join(gpus.names())}, or a node label)")
    hw.add_argument("--count", type=positive, default=1, help="GPUs on the node (default: 1)")
    hw.add_argument(
        "--interconnect",
        help="nvlink, pcie (through a host bridge), or pix/pxb/phb/node/sys "
        "(default: nvlink for NVLink parts, else pcie)",
    )
    hw.add_argument("--gpu-memory", type=positive, metavar="MIB", help="memory per GPU, MiB")
    hw.add_argument("--gpu-node", metavar="FILE", help="a GPUNode manifest (uses its status)")
    hw.add_argument(
        "--network",
        choices=["infiniband", "roce", "ethernet"],
        help="the network between nodes, for a model no single node holds (default: ethernet)",
    )
    hw.add_argument("--network-gbps", type=positive, metavar="GBPS", help="a node's NIC rate")
    hw.add_argument(
        "--gpudirect-rdma", action="store_true", help="the NICs read GPU memory directly"
    )
    return hw


def read_documents(path: str) -> list[Any]:
    """The documents of a YAML file, empty ones left out."""
    try:
        return [d for d in yaml.safe_load_all(Path(path).read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc


def read_yaml(path: str, kind: str) -> Any:
    """The document of ``kind`` in a YAML file of one or more documents (a manifest file
    often holds a Secret or a Namespace beside the object); a file of one document is
    returned as it is, for the models to say what is wrong with it."""
    docs = read_documents(path)
    if len(docs) == 1:
        return docs[0]
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") == kind]
    if len(found) != 1:
        kinds = ", ".join(str(d.get("kind")) if isinstance(d, dict) else "?" for d in docs)
        raise InputError(
            f"{path} has {len(found)} {kind} documents among {len(docs)} ({kinds}); "
            f"give a file with one {kind}"
        )
    return found[0]


def read_service(path: str) -> InferenceService:
    """The InferenceService of a manifest file; the models' refusal names the field."""
    try:
        return InferenceService.model_validate(read_yaml(path, "InferenceService"))
    except ValidationError as exc:
        raise InputError(f"{path} is not an InferenceService: {field_errors(exc)}") from None


def read_measurements(path: str) -> Measurements:
    """The measured records of ``--measurements FILE`` (a list, or the ConfigMap); a file
    that cannot be read, or a record that is not valid, is an :class:`InputError` naming
    the record and the field."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(f"--measurements {path}: cannot read it: {exc.strerror or exc}") from exc
    try:
        return Measurements.parse(text)
    except MeasurementsError as exc:
        raise InputError(f"--measurements {path}: {exc}") from exc


def network_labels(args: argparse.Namespace) -> dict[str, str]:
    """The labels a node on the network of the flags would carry (tuning/network.py reads
    them); none for a flag not given."""
    labels = {
        NODE_LABEL_NETWORK: args.network or "",
        NODE_LABEL_NETWORK_GBPS: str(args.network_gbps or ""),
        NODE_LABEL_GPUDIRECT_RDMA: "true" if args.gpudirect_rdma else "false",
    }
    return {k: v for k, v in labels.items() if v}


def gpu_profile(args: argparse.Namespace) -> gpus.GPUProfile:
    """The node's GPUs, with the network to other nodes as the flags give it (the labels
    a node would carry: tuning/network.py)."""
    network = network_from_labels(network_labels(args))
    return dataclasses.replace(_gpus(args), network=network)


def gpu_node(args: argparse.Namespace) -> GPUNode | None:
    """The GPUNode of ``--gpu-node``, None without the flag."""
    if not args.gpu_node:
        return None
    data = read_yaml(args.gpu_node, "GPUNode")
    try:
        return GPUNode.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"{args.gpu_node} is not a GPUNode: {field_errors(exc)}") from None


def _gpus(args: argparse.Namespace) -> gpus.GPUProfile:
    node = gpu_node(args)
    if node is not None:
        profile = (
            gpus.profile_from_gpu_node(node.status, node=node.metadata.name)
            if node.status
            else None
        )
        if profile is None:
            raise InputError(f"{args.gpu_node}: its status lists no GPUs")
        return profile
    if not args.gpu:
        raise InputError("give --gpu PRODUCT (with --count, --interconnect) or --gpu-node FILE")
    if args.count < 1 or args.count > 64:
        raise InputError("--count must be between 1 and 64")
    try:
        return gpus.profile_from_product(
            args.gpu, args.count, interconnect=args.interconnect, memory_mib=args.gpu_memory
        )
    except gpus.UnknownInterconnect as exc:
        raise InputError(str(exc)) from exc
    except ValueError as exc:
        raise InputError(f"{exc} (known: {', '.join(gpus.names())}; or give --gpu-memory)") from exc
