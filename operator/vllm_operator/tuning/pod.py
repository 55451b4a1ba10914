"""The pod around one replica (:func:`pod_plan`): /dev/shm, CPUs, host memory, CPU
pinning, the startup budget and the interconnect a node must offer, each with its reason;
the spec's values win where it sets them (read leniently by :func:`spec_bytes`)."""

from __future__ import annotations

from typing import Final, Literal

from vllm_operator.models.quantity import to_bytes
from vllm_operator.tuning import lora
from vllm_operator.tuning.args import Setting
from vllm_operator.tuning.candidate import Candidate
from vllm_operator.tuning.memory import GIB
from vllm_operator.tuning.request import Ask
from vllm_operator.tuning.results import PodPlan, gib_quantity
from vllm_operator.tuning.units import gib, round_up

__all__ = ["pod_plan", "spec_bytes"]


def spec_bytes(text: str) -> int | None:
    """Bytes in a Kubernetes quantity ("2Gi", "512M", "1.5G"), rounded up; None if the
    text is not one (admission's pattern is looser than the grammar)."""
    try:
        return to_bytes(text)
    except ValueError:
        return None


# The download cache: the weights estimate with headroom (the estimate's error, the
# tokenizer and config files), and room for vLLM's and torch's compile caches, which share
# the volume (VLLM_CACHE_ROOT).
CACHE_HEADROOM: Final = 1.25
CACHE_EXTRA_BYTES: Final = 2 * GIB


def pod_plan(
    ask: Ask,
    c: Candidate,
    load_seconds: float,
    weights_per_gpu: int,
    *,
    download_bytes: int | None = None,
) -> PodPlan:
    gpus = c.gpus_count
    node = ask.node
    reasons: list[Setting] = []
    # /dev/shm
    shm_spec = spec_bytes(node.shm_size) if node.shm_size != "auto" else None
    if shm_spec is not None:
        shm = shm_spec
        reasons.append(Setting("shm-size", gib_quantity(shm), "Spec", "spec.node.shmSize"))
    elif gpus == 1:
        shm = GIB
        reasons.append(
            Setting(
                "shm-size",
                "1Gi",
                "Tuner",
                "one GPU: vLLM's processes exchange little through /dev/shm, but Docker's "
                "64 MB default still breaks its multiprocess front end",
            )
        )
    else:
        shm = max(2, gpus) * GIB
        reasons.append(
            Setting(
                "shm-size",
                gib_quantity(shm),
                "Tuner",
                f"{gpus} GPU worker processes: vLLM's shared-memory broadcast queue and NCCL's "
                "SHM transport (used where peer-to-peer is not) need /dev/shm; 64 MB breaks NCCL",
            )
        )
    # CPUs
    if node.cpus is not None:
        cpus = node.cpus
        reasons.append(Setting("cpus", str(cpus), "Spec", "spec.node.cpus"))
    else:
        extra = 2 if ask.profile == "Throughput" else 1
        cpus = 2 + gpus + extra
        reasons.append(
            Setting(
                "cpus",
                str(cpus),
                "Tuner",
                f"vLLM V1 busy-polls in its API server, engine core and each of {gpus} GPU "
                f"worker(s): 2 + {gpus}, plus {extra} for tokenization and detokenization",
            )
        )
    # Host memory
    if node.memory is not None and (spec_mem := spec_bytes(node.memory)) is not None:
        memory = spec_mem
        reasons.append(Setting("memory", node.memory, "Spec", "spec.node.memory"))
    else:
        offload = int((ask.pins.cpu_offload_gb or 0) * 10**9) * gpus
        adapters = (
            lora.host_bytes(ask.model.architecture, ask.lora, dtype_bytes=c.dtype_bytes)
            if ask.lora is not None
            else 0
        )
        memory = round_up(4 * GIB + 3 * GIB * gpus + offload + adapters, GIB)
        reasons.append(
            Setting(
                "memory",
                gib_quantity(memory),
                "Tuner",
                "4 GiB for the API server and engine core, 3 GiB per GPU worker (torch, CUDA "
                "runtime, load staging)"
                + (", plus the CPU-offloaded weights" if offload else "")
                + (
                    f", plus {gib(adapters)} for the {ask.lora.max_cpu_loras} LoRA adapters "
                    "cached in host memory"
                    if ask.lora is not None
                    else ""
                )
                + "; weights are memory-mapped (page cache), not copied; /dev/shm comes on top",
            )
        )
    # Pinning
    if node.cpu_pinning:
        reasons.append(
            Setting(
                "cpu-pinning",
                "true",
                "Spec",
                "spec.node.cpuPinning: exclusive cores (Guaranteed QoS), so a noisy neighbour "
                "cannot take the tokenizer's and engine's cores",
            )
        )
    else:
        hint = (
            "; the Latency profile would benefit: a noisy neighbour pushed P99 up 300 %"
            if ask.profile == "Latency"
            else ""
        )
        reasons.append(
            Setting("cpu-pinning", "false", "Default", f"spec.node.cpuPinning is off{hint}")
        )
    # Startup budget: download, load, compile and capture, with a wide margin.
    # What the pod downloads: its GPUs' weights, or the whole checkpoint where it serves
    # one pipeline stage of a multi-node group (every node fetches every file).
    fetched = download_bytes if download_bytes is not None else weights_per_gpu * c.gpus_count
    download = fetched / 200e6 if ask.downloads_weights else 0.0
    compile_s = 0.0 if ask.pins.enforce_eager or ask.profile == "FastStart" else 120.0
    startup = max(300, round_up(int(60 + 2 * (download + load_seconds) + compile_s * 1.5), 60))
    reasons.append(
        Setting(
            "startup-seconds",
            str(startup),
            "Tuner",
            "engine start + twice the predicted load"
            + (" and download (at an assumed 200 MB/s)" if download else "")
            + (" + compilation and CUDA-graph capture" if compile_s else "")
            + ", at least 5 minutes",
        )
    )
    # The cache volume the weights are downloaded into (an emptyDir: node disk).
    cache: int | None = None
    if ask.downloads_weights:
        weights = fetched
        cache = round_up(int(weights * CACHE_HEADROOM) + CACHE_EXTRA_BYTES, GIB)
        reasons.append(
            Setting(
                "cache-size",
                gib_quantity(cache),
                "Tuner",
                f"the weights downloaded from the Hub ({gib(weights)}) plus "
                f"{CACHE_HEADROOM - 1:.0%} for the estimate and the repository's other files "
                f"and {CACHE_EXTRA_BYTES // GIB} GiB for vLLM's and torch's compile caches: "
                "the cache volume's sizeLimit and the ephemeral-storage request, so the pod "
                "lands on a node with that much disk and is not evicted for filling it",
            )
        )
    interconnect: Literal["NVLink", "PCIe"] | None = None
    if c.tp > 1 and c.link == "NVLink":
        interconnect = "NVLink"
        reasons.append(
            Setting(
                "interconnect",
                "NVLink",
                "Tuner",
                f"tensor parallel {c.tp} needs its GPUs on NVLink: only nodes labelled nvlink",
            )
        )
    return PodPlan(
        shm_bytes=shm,
        cpus=cpus,
        memory_bytes=memory,
        cpu_pinning=node.cpu_pinning,
        startup_seconds=startup,
        interconnect=interconnect,
        reasons=tuple(reasons),
        cache_bytes=cache,
    )
