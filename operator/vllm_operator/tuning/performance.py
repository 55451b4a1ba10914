"""Predicted speed: decode tokens per second from the memory-bandwidth roofline, load time.

**Decode.** Generating one token of one sequence reads every active weight once and that
sequence's KV cache once; at small batch the GPU does little else, so the step time is
those bytes over the memory bandwidth (the roofline; Williams et al., 2009, applied to
LLM decode in e.g. "LLM Inference Unveiled", Yuan et al., 2024). Kernels reach ~85 % of the
datasheet bandwidth; a measured device-copy bandwidth (GPUNode probe) is already what
streaming achieves, so it is used at ~95 %. Under tensor parallelism each GPU reads its
share in parallel, but every layer adds two all-reduces whose latency is the link's:
microseconds on NVLink, tens over PCIe with peer-to-peer, more through host memory when the
boards cannot do peer-to-peer (GeForce). The result is an upper bound for one sequence.

**Load.** Weights are read from storage once (all GPUs of a replica share it) and copied
to each GPU over PCIe; the two overlap, so the slower of the two bounds the time.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from vllm_operator.models.gpu_node import LinkKind
from vllm_operator.tuning.architecture import Architecture

__all__ = ["DecodeEstimate", "LoadEstimate", "decode_rate", "load_time"]

SPEC_EFFICIENCY: Final = 0.85
MEASURED_EFFICIENCY: Final = 0.95

# One all-reduce of a decode step's hidden state (a few KiB): latency, not bandwidth.
# NVLink with vLLM's custom all-reduce: ~5-10 us; NCCL over PCIe P2P: ~20-30 us; through
# host memory (no P2P, NCCL's SHM transport): ~50-100 us.
ALL_REDUCE_SECONDS: Final[dict[str, float]] = {
    "NVLink": 8e-6,
    "PIX": 25e-6,
    "PXB": 30e-6,
    "PHB": 40e-6,
    "NODE": 50e-6,
    "SYS": 70e-6,
}
NO_P2P_ALL_REDUCE_SECONDS: Final = 100e-6

# Storage read rate assumed for weights: a local NVMe or the page cache. Network volumes
# and Hub downloads are slower; the reason line says so.
STORAGE_BYTES_PER_SECOND: Final = 2e9
# Host-to-device copy: ~80 % of the PCIe x16 link rate per generation.
PCIE_BYTES_PER_SECOND: Final[dict[int, float]] = {3: 12.6e9, 4: 25.2e9, 5: 50.4e9}


@dataclasses.dataclass(frozen=True)
class DecodeEstimate:
    tokens_per_second: float
    step_seconds: float
    bytes_per_gpu: int
    communication_seconds: float


def decode_rate(
    arch: Architecture,
    *,
    weights_bytes: int,
    kv_bytes_per_token_gpu: int,
    context_tokens: int,
    bandwidth_bytes_per_second: float,
    measured: bool,
    tensor_parallel: int,
    link: LinkKind | None,
    peer_to_peer: bool,
) -> DecodeEstimate:
    """Tokens per second for one sequence of ``context_tokens`` (see the module docstring)."""
    tp = max(1, tensor_parallel)
    active = weights_bytes * arch.active_parameter_count / max(1, arch.parameter_count)
    if not arch.tie_word_embeddings:
        # The input embedding is a lookup of one row, not a read of the table.
        active -= (
            weights_bytes * (arch.vocab_size * arch.hidden_size) / max(1, arch.parameter_count)
        )
    per_gpu = int(active / tp) + kv_bytes_per_token_gpu * context_tokens
    efficiency = MEASURED_EFFICIENCY if measured else SPEC_EFFICIENCY
    memory_seconds = per_gpu / (bandwidth_bytes_per_second * efficiency)
    comm = 0.0
    if tp > 1 and link is not None:
        latency = ALL_REDUCE_SECONDS[link]
        if link != "NVLink" and not peer_to_peer:
            latency = max(latency, NO_P2P_ALL_REDUCE_SECONDS)
        comm = 2 * arch.num_layers * latency
    step = memory_seconds + comm
    return DecodeEstimate(1 / step, step, per_gpu, comm)


@dataclasses.dataclass(frozen=True)
class LoadEstimate:
    seconds: float
    storage_seconds: float
    copy_seconds: float


def load_time(
    *,
    weights_bytes: int,
    tensor_parallel: int,
    pcie_generation: int | None,
    host_to_device_bytes_per_second: float | None,
) -> LoadEstimate:
    """Seconds to bring one replica's weights from storage onto its GPUs."""
    storage = weights_bytes / STORAGE_BYTES_PER_SECOND
    rate = host_to_device_bytes_per_second or PCIE_BYTES_PER_SECOND.get(
        pcie_generation or 4, PCIE_BYTES_PER_SECOND[4]
    )
    copy = weights_bytes / max(1, tensor_parallel) / rate
    return LoadEstimate(max(storage, copy), storage, copy)
