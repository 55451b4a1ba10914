"""The network between nodes, as a multi-node plan needs it: fabric, rate, GPUDirect RDMA.

A model larger than one node runs as one vLLM instance over several nodes
(:mod:`~vllm_operator.tuning.multinode`); what crosses the nodes is the pipeline's
activations (one hidden state per token and stage boundary) and NCCL's bootstrap. NVML
cannot see the NICs, so the facts come from node labels, ours or the ones NVIDIA's and
Kubernetes' node-feature tools set:

- ``inference.vllm-operator.dev/network``: ``infiniband``, ``roce`` or ``ethernet``. Without
  it, a node that Node Feature Discovery marks RDMA-capable
  (``feature.node.kubernetes.io/rdma.capable=true``) counts as RoCE, and any other as
  Ethernet (NCCL over TCP sockets), each with a note saying it was assumed.
- ``inference.vllm-operator.dev/network-gbps``: the node's GPU-facing rate in Gb/s (all its
  NICs; 8 x 400 = 3200 on an NDR node). Without it: 400 for InfiniBand and RoCE (one NIC),
  100 for Ethernet.
- ``inference.vllm-operator.dev/gpudirect-rdma``: ``true`` when the NICs read GPU memory
  directly (nvidia-peermem or dma-buf loaded). Without it, false: NCCL stages through host
  memory, which adds a copy and latency to every transfer.

Latencies per hop (a small message, NCCL send/recv, one direction) are the usual measured
orders of magnitude (nccl-tests send/recv on NDR and 100 GbE): ~5 us for InfiniBand with
GPUDirect, ~8 us for RoCE with GPUDirect, +10 us without GPUDirect (a host bounce), ~50 us
for TCP. They matter for decode (one hop per stage boundary per token); the rate matters
for prefill (a chunk's hidden states per hop).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final, Literal

from vllm_operator.constants import (
    NODE_LABEL_GPUDIRECT_RDMA,
    NODE_LABEL_NETWORK,
    NODE_LABEL_NETWORK_GBPS,
    NODE_LABEL_NFD_RDMA_CAPABLE,
)
from vllm_operator.tuning.args import Setting

__all__ = ["Network", "NetworkKind", "nccl_environment", "network_from_labels"]

NetworkKind = Literal["InfiniBand", "RoCE", "Ethernet"]

_KINDS: Final[dict[str, NetworkKind]] = {
    "infiniband": "InfiniBand",
    "ib": "InfiniBand",
    "roce": "RoCE",
    "ethernet": "Ethernet",
    "tcp": "Ethernet",
}
DEFAULT_GBPS: Final[dict[NetworkKind, float]] = {"InfiniBand": 400, "RoCE": 400, "Ethernet": 100}
HOP_SECONDS: Final[dict[NetworkKind, float]] = {
    "InfiniBand": 5e-6,
    "RoCE": 8e-6,
    "Ethernet": 50e-6,
}
NO_GPUDIRECT_EXTRA_SECONDS: Final = 10e-6
# What NCCL achieves of the line rate on large messages.
LINK_EFFICIENCY: Final = 0.8


@dataclasses.dataclass(frozen=True)
class Network:
    """One node's inter-node network as the tuner sees it."""

    kind: NetworkKind
    gbps: float
    gpudirect_rdma: bool
    assumed: tuple[str, ...] = ()  # what was not labelled, for the plan's notes

    @property
    def rdma(self) -> bool:
        return self.kind != "Ethernet"

    def hop_seconds(self, message_bytes: int) -> float:
        """One send of ``message_bytes`` to the next node: latency plus the bytes."""
        latency = HOP_SECONDS[self.kind]
        if self.rdma and not self.gpudirect_rdma:
            latency += NO_GPUDIRECT_EXTRA_SECONDS
        return latency + message_bytes / (self.gbps * 1e9 / 8 * LINK_EFFICIENCY)

    def describe(self) -> str:
        gdr = (
            ", GPUDirect RDMA"
            if self.gpudirect_rdma
            else (", no GPUDirect RDMA" if self.rdma else " (TCP)")
        )
        return f"{self.kind} {self.gbps:g} Gb/s{gdr}"


def network_from_labels(labels: Mapping[str, str]) -> Network:
    """The node's network from its labels; what is missing is assumed and said so."""
    assumed: list[str] = []
    text = labels.get(NODE_LABEL_NETWORK, "").strip().lower()
    kind = _KINDS.get(text)
    if kind is None:
        if labels.get(NODE_LABEL_NFD_RDMA_CAPABLE) == "true":
            kind = "RoCE"
            assumed.append(
                f"no {NODE_LABEL_NETWORK} label; RoCE from {NODE_LABEL_NFD_RDMA_CAPABLE}"
            )
        else:
            kind = "Ethernet"
            assumed.append(f"no {NODE_LABEL_NETWORK} label; Ethernet (NCCL over TCP) assumed")
    gbps_text = labels.get(NODE_LABEL_NETWORK_GBPS, "")
    try:
        gbps = float(gbps_text)
        if gbps <= 0:
            raise ValueError
    except ValueError:
        gbps = DEFAULT_GBPS[kind]
        assumed.append(f"no {NODE_LABEL_NETWORK_GBPS} label; {gbps:g} Gb/s assumed")
    gdr = labels.get(NODE_LABEL_GPUDIRECT_RDMA, "").lower() == "true" and kind != "Ethernet"
    if kind != "Ethernet" and NODE_LABEL_GPUDIRECT_RDMA not in labels:
        assumed.append(f"no {NODE_LABEL_GPUDIRECT_RDMA} label; no GPUDirect RDMA assumed")
    return Network(kind, gbps, gdr, tuple(assumed))


def nccl_environment(network: Network) -> list[Setting]:
    """NCCL settings for a group spread over nodes joined by ``network``, each with why."""
    env = [
        Setting(
            "NCCL_CROSS_NIC",
            "0",
            "Tuner",
            "rings keep each GPU on its own rail (the NIC nearest it) across nodes",
        ),
    ]
    if network.kind == "Ethernet":
        env.append(
            Setting(
                "NCCL_IB_DISABLE",
                "1",
                "Tuner",
                "Ethernet without RDMA: NCCL's socket transport, not a probe for verbs "
                "devices that are absent",
            )
        )
        return env
    env.append(
        Setting(
            "NCCL_IB_DISABLE",
            "0",
            "Tuner",
            f"{network.kind}: NCCL's verbs transport (InfiniBand and RoCE both)",
        )
    )
    if network.gpudirect_rdma:
        env.append(
            Setting(
                "NCCL_NET_GDR_LEVEL",
                "SYS",
                "Tuner",
                "the node is labelled GPUDirect-RDMA-capable: NICs read GPU memory directly "
                "for every GPU, with no host bounce",
            )
        )
    return env
