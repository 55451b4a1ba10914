"""GPUs as the tuner sees them: a catalog of products and the profile of a node's GPU set.

The **catalog** holds what a product name implies and the node cannot always tell: memory
bandwidth (the decode roofline), compute capability (bf16, Marlin, FP8), whether the board
can do peer-to-peer over PCIe, its power and its PCIe generation. Figures are NVIDIA's
published specifications; memory is what ``nvidia-smi`` reports as total (a little under
the marketing number), used only when the node does not report it.

A **GPU profile** is one node's set of GPUs: product, count, memory per GPU, compute
capability, bandwidth, and the pairwise interconnect (the ``nvidia-smi topo -m`` matrix:
NVLink, or the PCIe path PIX / PXB / PHB / NODE / SYS). It is built from the GPUNode
status when the node agent publishes one (:func:`profile_from_gpu_node`; measured
bandwidths win over the catalog), else from the node's labels (:func:`profile_from_labels`;
NVIDIA GPU Feature Discovery's product, memory and count, plus our interconnect label), or
from a product name and count (:func:`profile_from_product`, for ``vllm-operator tune``).

Product strings differ by source (``NVIDIA-GeForce-RTX-4090`` from GFD, ``NVIDIA GeForce
RTX 4090`` from NVML, ``RTX-4090`` typed by a user); :func:`match_product` compares them
as sets of lower-case words, ignoring vendor words.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Literal

from vllm_operator.constants import (
    NODE_LABEL_GPU_COUNT,
    NODE_LABEL_GPU_INTERCONNECT,
    NODE_LABEL_GPU_MEMORY_MIB,
    NODE_LABEL_GPU_PRODUCT,
)
from vllm_operator.models.gpu_node import GPUNodeStatus, LinkKind
from vllm_operator.tuning.network import Network, network_from_labels

__all__ = [
    "CATALOG",
    "LINK_ORDER",
    "GPUModel",
    "GPUProfile",
    "match_product",
    "node_profile",
    "profile_from_gpu_node",
    "profile_from_labels",
    "profile_from_product",
]

MIB: Final = 1024**2
GB: Final = 10**9

# Best to worst. NVLink is a direct GPU-GPU link; PIX one PCIe switch; PXB several
# switches; PHB through the CPU's host bridge; NODE across host bridges within a NUMA node;
# SYS across sockets (the SMP interconnect). TP all-reduces pay more at every step down.
LINK_ORDER: Final[tuple[LinkKind, ...]] = ("NVLink", "PIX", "PXB", "PHB", "NODE", "SYS")


@dataclasses.dataclass(frozen=True)
class GPUModel:
    """One product in the catalog."""

    name: str
    match: tuple[str, ...]  # every word must appear in the product string
    memory_mib: int
    bandwidth_gb_s: float  # memory bandwidth, 10^9 bytes/s
    compute_capability: tuple[int, int]
    tdp_watts: int
    pcie_generation: int
    # NVLink is how these boards are normally joined (SXM modules); PCIe boards that take an
    # optional bridge (RTX 3090, A6000, A40...) are not, since most sets have none.
    nvlink: bool = False
    pcie_p2p: bool = True  # peer-to-peer over PCIe (GeForce boards: disabled by the driver)
    # Dense 16-bit tensor throughput, 10^12 FLOP/s, as the datasheet states it: bf16 (fp16
    # before compute capability 8.0) with fp32 accumulation, which is what vLLM's GEMMs use
    # (GeForce boards run it at half their fp16-accumulate rate), without sparsity. Sizes
    # prefill (TTFT); None where NVIDIA publishes none.
    tflops: float | None = None

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    @property
    def bf16(self) -> bool:
        return self.compute_capability >= (8, 0)


# Bandwidth, capability and TDP from NVIDIA's datasheets (product pages, the CUDA
# compute-capability table at developer.nvidia.com/cuda-gpus). Ordered so that, among equal
# matches, the smaller memory variant comes first (the conservative guess).
# Tensor TFLOPS (dense): GeForce from the architecture whitepapers' "FP16 Tensor TFLOPS with
# FP32 Accumulate" (Ampere GA102: RTX 3090 71, 3080 59.5, 3060 25.5 from its 12.7 FP32
# TFLOPS x2 like the others; Ada AD102: RTX 4090 165.2, 4080 97.5; Blackwell GB202: RTX 5090
# 209.5); data-centre and workstation boards from their datasheets' BF16 (FP16 for T4 and
# V100) tensor figure, halved where only the sparse one is printed: A100 312, A30 165, A10
# 125, A40 149.7, RTX A6000 154.8 (309.7 sparse), L4 121 (242), L40 181 (362), L40S 362
# (733), H100 SXM 989, H100 PCIe 756, H100 NVL 835, H200 989, H200 NVL 835, B200 2250 (4.5
# PFLOPS sparse), T4 65, V100 SXM2 125. RTX 6000 Ada: 1,457 FP8 sparse / 8 = 182.1, as the
# same AD102 L40's. A10G (an AWS part): none published.
CATALOG: Final[tuple[GPUModel, ...]] = (
    GPUModel("RTX-3060", ("3060",), 12288, 360, (8, 6), 170, 4, pcie_p2p=False, tflops=25.5),
    GPUModel("RTX-3080", ("3080",), 10240, 760, (8, 6), 320, 4, pcie_p2p=False, tflops=59.5),
    GPUModel("RTX-3090", ("3090",), 24576, 936, (8, 6), 350, 4, pcie_p2p=False, tflops=71),
    GPUModel("RTX-4080", ("4080",), 16376, 717, (8, 9), 320, 4, pcie_p2p=False, tflops=97.5),
    GPUModel("RTX-4090", ("4090",), 24564, 1008, (8, 9), 450, 4, pcie_p2p=False, tflops=165.2),
    GPUModel("RTX-5090", ("5090",), 32607, 1792, (12, 0), 575, 5, pcie_p2p=False, tflops=209.5),
    GPUModel("RTX-A6000", ("a6000",), 49140, 768, (8, 6), 300, 4, tflops=154.8),
    GPUModel("RTX-6000-Ada", ("6000", "ada"), 49140, 960, (8, 9), 300, 4, tflops=182.1),
    GPUModel("T4", ("t4",), 15360, 320, (7, 5), 70, 3, tflops=65),
    GPUModel("V100-16GB", ("v100",), 16384, 900, (7, 0), 300, 3, nvlink=True, tflops=125),
    GPUModel("V100-32GB", ("v100", "32gb"), 32768, 900, (7, 0), 300, 3, nvlink=True, tflops=125),
    GPUModel("A10", ("a10",), 23028, 600, (8, 6), 150, 4, tflops=125),
    GPUModel("A10G", ("a10g",), 23028, 600, (8, 6), 300, 4),
    GPUModel("A30", ("a30",), 24576, 933, (8, 0), 165, 4, tflops=165),
    GPUModel("A40", ("a40",), 46068, 696, (8, 6), 300, 4, tflops=149.7),
    GPUModel("L4", ("l4",), 23034, 300, (8, 9), 72, 4, tflops=121),
    GPUModel("L40", ("l40",), 46068, 864, (8, 9), 300, 4, tflops=181),
    GPUModel("L40S", ("l40s",), 46068, 864, (8, 9), 350, 4, tflops=362),
    GPUModel("A100-40GB", ("a100",), 40960, 1555, (8, 0), 400, 4, nvlink=True, tflops=312),
    GPUModel("A100-40GB", ("a100", "40gb"), 40960, 1555, (8, 0), 400, 4, nvlink=True, tflops=312),
    GPUModel("A100-80GB", ("a100", "80gb"), 81920, 2039, (8, 0), 400, 4, nvlink=True, tflops=312),
    GPUModel("A100-40GB-PCIe", ("a100", "40gb", "pcie"), 40960, 1555, (8, 0), 250, 4, tflops=312),
    GPUModel("A100-80GB-PCIe", ("a100", "80gb", "pcie"), 81920, 1935, (8, 0), 300, 4, tflops=312),
    GPUModel("H100-80GB", ("h100",), 81559, 3350, (9, 0), 700, 5, nvlink=True, tflops=989),
    GPUModel("H100-PCIe", ("h100", "pcie"), 81559, 2000, (9, 0), 350, 5, tflops=756),
    GPUModel("H100-NVL", ("h100", "nvl"), 95830, 3900, (9, 0), 400, 5, nvlink=True, tflops=835),
    GPUModel("H200", ("h200",), 143771, 4800, (9, 0), 700, 5, nvlink=True, tflops=989),
    GPUModel("H200-NVL", ("h200", "nvl"), 143771, 4800, (9, 0), 600, 5, nvlink=True, tflops=835),
    GPUModel("B200", ("b200",), 183359, 8000, (10, 0), 1000, 5, nvlink=True, tflops=2250),
)

_SIZE: Final = re.compile(r"\d+gb")
_VENDOR_WORDS: Final = frozenset({"nvidia", "geforce", "tesla", "gpu", "quadro", "generation"})


def _words(product: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9]+", product.lower()) if w} - _VENDOR_WORDS


@functools.lru_cache(maxsize=1024)
def match_product(product: str, memory_mib: int | None = None) -> GPUModel | None:
    """The catalog entry for a product string, or None when the product is unknown.

    The entry with the most matching words wins; among equals, the one whose memory is
    closest to ``memory_mib`` (A100 40 vs 80 GB from a label without the size).

    Memoized: every reconcile pass profiles every GPU node, and a cluster has a handful
    of products (the matching was 80 % of a converged pass's time at 200 nodes).
    """
    words = _words(product)
    sizes_named = {w for w in words if _SIZE.fullmatch(w)}
    best: tuple[tuple[int, int], GPUModel] | None = None
    for model in CATALOG:
        required = {w for w in model.match if not _SIZE.fullmatch(w)}
        sizes = set(model.match) - required
        if not required <= words:
            continue
        if sizes and not sizes <= words and (sizes_named or memory_mib is None):
            # A size in the name that differs, or no size and no memory to tell by.
            continue
        distance = abs(model.memory_mib - memory_mib) if memory_mib is not None else 0
        score = (len(required) + len(sizes & words), -distance)
        if best is None or score > best[0]:
            best = (score, model)
    return best[1] if best else None


Link = tuple[int, int, LinkKind]
InterconnectSource = Literal["GPUNode", "NodeLabels", "Given"]


@dataclasses.dataclass(frozen=True)
class GPUProfile:
    """One node's GPUs, as far as the tuner needs them."""

    product: str
    count: int
    memory_bytes: int
    model: GPUModel | None = None
    compute_capability: tuple[int, int] | None = None
    bandwidth_bytes_per_second: float | None = None
    bandwidth_measured: bool = False
    host_to_device_bytes_per_second: float | None = None
    host_to_device_measured: bool = False
    links: tuple[Link, ...] = ()
    source: InterconnectSource = "Given"
    node: str | None = None
    # Where the links came from when they were not read pair by pair ("nvlink" label...).
    links_assumed: bool = False
    notes: tuple[str, ...] = ()
    # The network to other nodes (node labels; tuning/network.py): only a multi-node plan
    # reads it. None where nothing was read (a product given to `vllm-operator tune`).
    network: Network | None = None

    @property
    def name(self) -> str:
        return self.model.name if self.model else self.product

    @property
    def bf16(self) -> bool | None:
        cc = self.compute_capability
        return None if cc is None else cc >= (8, 0)

    @property
    def pcie_p2p(self) -> bool:
        return self.model.pcie_p2p if self.model else True

    @property
    def flops_per_second(self) -> float | None:
        """Datasheet dense 16-bit tensor FLOP/s of one GPU; None if the catalog has none."""
        tflops = self.model.tflops if self.model else None
        return tflops * 1e12 if tflops else None

    def link(self, a: int, b: int) -> LinkKind:
        """How GPUs ``a`` and ``b`` reach each other; SYS (the worst) when unknown."""
        for x, y, kind in self.links:
            if {x, y} == {a, b}:
                return kind
        return "SYS"

    def worst_link(self, gpus: Iterable[int]) -> LinkKind | None:
        """The slowest link within a set of GPUs; None for a single GPU."""
        kinds = [self.link(a, b) for a, b in itertools.combinations(sorted(gpus), 2)]
        if not kinds:
            return None
        return max(kinds, key=LINK_ORDER.index)

    def best_group(self, size: int) -> tuple[tuple[int, ...], LinkKind | None] | None:
        """The set of ``size`` GPUs whose worst link is best, with that link; None if too few.

        Exhaustive over combinations (a node has at most 16 GPUs), stopping at the first
        group as good as the node's best link.
        """
        if size > self.count or size < 1:
            return None
        if size == 1:
            return (0,), None
        table = {frozenset((a, b)): LINK_ORDER.index(kind) for a, b, kind in self.links}
        worst_kind = len(LINK_ORDER) - 1  # SYS, for a pair the node did not report
        best_possible = min(table.values(), default=worst_kind)
        best: tuple[tuple[int, ...], int] | None = None
        for group in itertools.combinations(range(self.count), size):
            worst = max(
                table.get(frozenset(pair), worst_kind) for pair in itertools.combinations(group, 2)
            )
            if best is None or worst < best[1]:
                best = (group, worst)
                if worst == best_possible:
                    break
        assert best is not None
        return best[0], LINK_ORDER[best[1]]

    def describe(self) -> str:
        mem = self.memory_bytes / 1024**3
        kinds = sorted({k for _, _, k in self.links}, key=LINK_ORDER.index)
        links = "/".join(kinds) if kinds else "no peers"
        where = f" on {self.node}" if self.node else ""
        return f"{self.count}x {self.name} ({mem:.1f} GiB, {links}){where}"


def _all_pairs(count: int, kind: LinkKind) -> tuple[Link, ...]:
    return tuple((a, b, kind) for a, b in itertools.combinations(range(count), 2))


def _interconnect_kind(value: str | None) -> LinkKind | None:
    if value is None:
        return None
    v = value.strip().lower()
    if v in ("nvlink", "nvswitch", "nv"):
        return "NVLink"
    if v in ("pcie", "pci", "phb"):
        return "PHB"
    upper = v.upper()
    for kind in LINK_ORDER:
        if kind.upper() == upper:
            return kind
    return None


class UnknownInterconnect(ValueError):
    """An interconnect that is neither NVLink, PCIe nor a topology kind."""


def profile_from_product(
    product: str,
    count: int = 1,
    *,
    interconnect: str | None = None,
    memory_mib: int | None = None,
    node: str | None = None,
) -> GPUProfile:
    """A profile from a product name and count (``--gpu H100-80GB --count 8``).

    ``interconnect`` is ``nvlink`` (every pair on NVLink), ``pcie`` (every pair through a
    host bridge: the common case on workstations and cloud PCIe instances), or one of the
    topo kinds (``pix``, ``pxb``, ``phb``, ``node``, ``sys``). Left out, it is NVLink where
    the product is an NVLink part and PCIe (PHB) otherwise.
    """
    model = match_product(product, memory_mib)
    memory = memory_mib * MIB if memory_mib else (model.memory_bytes if model else 0)
    if memory <= 0:
        raise ValueError(f"unknown GPU {product!r}: give its memory")
    kind = _interconnect_kind(interconnect)
    if interconnect is not None and kind is None:
        raise UnknownInterconnect(
            f"--interconnect {interconnect!r} is not one: use nvlink, pcie, or a topology "
            "kind of nvidia-smi topo -m (pix, pxb, phb, node, sys)"
        )
    assumed = kind is None
    if kind is None:
        kind = "NVLink" if model is not None and model.nvlink else "PHB"
    return GPUProfile(
        product=product,
        count=count,
        memory_bytes=memory,
        model=model,
        compute_capability=model.compute_capability if model else None,
        bandwidth_bytes_per_second=model.bandwidth_gb_s * GB if model else None,
        links=_all_pairs(count, kind) if count > 1 else (),
        source="Given",
        node=node,
        links_assumed=assumed and count > 1,
    )


def profile_from_labels(labels: Mapping[str, str], *, node: str | None = None) -> GPUProfile | None:
    """A profile from a node's labels (GPU Feature Discovery plus ours); None if no GPUs."""
    return _profile_from_labels(
        labels.get(NODE_LABEL_GPU_PRODUCT),
        labels.get(NODE_LABEL_GPU_COUNT, "1"),
        labels.get(NODE_LABEL_GPU_MEMORY_MIB, ""),
        labels.get(NODE_LABEL_GPU_INTERCONNECT),
        node,
    )


# Memoized on the labels it reads: every pass of every service profiles every node, and
# the links of a 16-GPU node alone are 120 pairs (this was 8 % of the operator's CPU
# while 500 services rolled in on 200 such nodes, py-spy). The profile is frozen.
@functools.lru_cache(maxsize=8192)
def _profile_from_labels(
    product: str | None,
    count_text: str,
    memory_text: str,
    label: str | None,
    node: str | None,
) -> GPUProfile | None:
    if not product or not count_text.isdigit() or int(count_text) < 1:
        return None
    count = int(count_text)
    memory_mib = int(memory_text) if memory_text.isdigit() else None
    model = match_product(product, memory_mib)
    memory = memory_mib * MIB if memory_mib else (model.memory_bytes if model else 0)
    if memory <= 0:
        return None
    kind = _interconnect_kind(label)
    notes: list[str] = []
    if kind is None:
        kind = "PHB"
        if count > 1:
            notes.append(
                f"{node or 'node'}: no {NODE_LABEL_GPU_INTERCONNECT} label; GPUs treated as "
                "PCIe behind a host bridge"
            )
    elif kind == "PHB" and count > 1:
        notes.append(
            f"{node or 'node'}: PCIe from the node label; the exact path (switch or host "
            "bridge) is unknown, treated as a host bridge"
        )
    return GPUProfile(
        product=product,
        count=count,
        memory_bytes=memory,
        model=model,
        compute_capability=model.compute_capability if model else None,
        bandwidth_bytes_per_second=model.bandwidth_gb_s * GB if model else None,
        links=_all_pairs(count, kind) if count > 1 else (),
        source="NodeLabels",
        node=node,
        links_assumed=count > 1,
        notes=tuple(notes),
    )


def _capability(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", text)
    return (int(match[1]), int(match[2])) if match else None


def _gpu_notes(status: GPUNodeStatus, node: str | None) -> list[str]:
    where = node or "node"
    notes: list[str] = []
    for gpu in status.gpus:
        power = gpu.power
        if power and power.current and power.default and power.current < 0.95 * power.default:
            notes.append(
                f"{where} GPU {gpu.index}: power limit {power.current:.0f} W of "
                f"{power.default:.0f} W default; prefill (compute-bound) slows, decode "
                "(bandwidth-bound) less; see the GPUNode's PowerCapped condition"
            )
        pcie = gpu.pcie
        if (
            pcie
            and pcie.width
            and pcie.max_width
            and pcie.generation
            and pcie.max_generation
            and (pcie.width < pcie.max_width or pcie.generation < pcie.max_generation)
        ):
            notes.append(
                f"{where} GPU {gpu.index}: PCIe gen{pcie.generation} x{pcie.width} of "
                f"gen{pcie.max_generation} x{pcie.max_width}; loading and PCIe all-reduce slow"
            )
    return notes


def profile_from_gpu_node(status: GPUNodeStatus, *, node: str | None = None) -> GPUProfile | None:
    """A profile from a GPUNode's status (the node agent's NVML reading); None if no GPUs.

    A node with mixed products is profiled by its most common product (those GPUs only).
    """
    if not status.gpus:
        return None
    products = [g.product for g in status.gpus]
    product = max(sorted(set(products)), key=products.count)
    gpus = sorted((g for g in status.gpus if g.product == product), key=lambda g: g.index)
    index = {g.index: i for i, g in enumerate(gpus)}
    memories = [g.memory_bytes for g in gpus if g.memory_bytes]
    memory_mib = min(memories) // MIB if memories else None
    model = match_product(product, memory_mib)
    memory = min(memories) if memories else (model.memory_bytes if model else 0)
    if memory <= 0:
        return None
    capability = _capability(gpus[0].compute_capability) or (
        model.compute_capability if model else None
    )
    links: list[Link] = [
        (index[link.a], index[link.b], link.kind)
        for link in status.links
        if link.a in index and link.b in index and link.a != link.b
    ]
    assumed = False
    if len(gpus) > 1 and not links:
        fallback: LinkKind = "NVLink" if status.interconnect == "NVLink" else "PHB"
        links = list(_all_pairs(len(gpus), fallback))
        assumed = True
    bandwidth = model.bandwidth_gb_s * GB if model else None
    measured = False
    h2d: float | None = None
    h2d_measured = False
    probe = status.bandwidth
    if probe is not None and probe.results:
        copies = [r.gigabytes_per_second for r in probe.results if r.kind == "DeviceCopy"]
        if copies:
            # A device-to-device copy counts read plus write: what decode can stream.
            bandwidth, measured = min(copies) * GB, True
        uploads = [r.gigabytes_per_second for r in probe.results if r.kind == "HostToDevice"]
        if uploads:
            h2d, h2d_measured = min(uploads) * GB, True
    return GPUProfile(
        product=product,
        count=len(gpus),
        memory_bytes=memory,
        model=model,
        compute_capability=capability,
        bandwidth_bytes_per_second=bandwidth,
        bandwidth_measured=measured,
        host_to_device_bytes_per_second=h2d,
        host_to_device_measured=h2d_measured,
        links=tuple(links),
        source="GPUNode",
        node=node,
        links_assumed=assumed,
        notes=tuple(_gpu_notes(status, node)),
    )


def node_profile(
    labels: Mapping[str, str],
    status: GPUNodeStatus | None = None,
    *,
    node: str | None = None,
) -> GPUProfile | None:
    """A node's profile: from its GPUNode status when the agent wrote one, else its labels;
    its network to other nodes from the labels either way."""
    profile = profile_from_gpu_node(status, node=node) if status is not None else None
    if profile is None:
        profile = profile_from_labels(labels, node=node)
    if profile is None:
        return None
    return dataclasses.replace(profile, network=network_from_labels(labels))


def names() -> Sequence[str]:
    """Catalog names, for the CLI's help and errors."""
    return sorted({m.name for m in CATALOG})
