"""The pod around one replica (:func:`pod_plan`): /dev/shm, CPUs, host memory, CPU
pinning, the startup budget, the download cache and the interconnect a node must offer,
each with its reason; the spec's values win where it sets them (read leniently by
:func:`spec_bytes`). Each is one step (a function returning the figure and its reason, a
:class:`Sized`), so each is tested on its own; :func:`pod_plan` puts them in order."""

from __future__ import annotations

import dataclasses
from typing import Final

from vllm_operator.models.inference_service import NodeSpec, Profile
from vllm_operator.models.quantity import to_bytes
from vllm_operator.tuning import lora
from vllm_operator.tuning.args import Setting
from vllm_operator.tuning.candidate import Candidate
from vllm_operator.tuning.memory import GIB
from vllm_operator.tuning.request import Ask
from vllm_operator.tuning.results import PodPlan, gib_quantity
from vllm_operator.tuning.units import gib, round_up

__all__ = [
    "Sized",
    "cache_volume",
    "cpu_count",
    "cpu_pinning",
    "host_memory",
    "interconnect",
    "pod_plan",
    "shm_size",
    "spec_bytes",
    "startup_budget",
]


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


@dataclasses.dataclass(frozen=True)
class Sized:
    """One of the pod's figures (bytes, cores, seconds) and the reason it was chosen."""

    value: int
    reason: Setting


def shm_size(node: NodeSpec, gpus: int) -> Sized:
    """/dev/shm: the spec's size, else 1 GiB for one GPU, else a GiB per GPU (2 at least)."""
    shm_spec = spec_bytes(node.shm_size) if node.shm_size != "auto" else None
    if shm_spec is not None:
        return Sized(
            shm_spec, Setting("shm-size", gib_quantity(shm_spec), "Spec", "spec.node.shmSize")
        )
    if gpus == 1:
        return Sized(
            GIB,
            Setting(
                "shm-size",
                "1Gi",
                "Tuner",
                "one GPU: vLLM's processes exchange little through /dev/shm, but Docker's "
                "64 MB default still breaks its multiprocess front end",
            ),
        )
    shm = max(2, gpus) * GIB
    return Sized(
        shm,
        Setting(
            "shm-size",
            gib_quantity(shm),
            "Tuner",
            f"{gpus} GPU worker processes: vLLM's shared-memory broadcast queue and NCCL's "
            "SHM transport (used where peer-to-peer is not) need /dev/shm; 64 MB breaks NCCL",
        ),
    )


def cpu_count(node: NodeSpec, profile: Profile, gpus: int) -> Sized:
    """CPUs: the spec's, else one busy-polling core per vLLM process plus tokenization."""
    if node.cpus is not None:
        return Sized(node.cpus, Setting("cpus", str(node.cpus), "Spec", "spec.node.cpus"))
    extra = 2 if profile == "Throughput" else 1
    cpus = 2 + gpus + extra
    return Sized(
        cpus,
        Setting(
            "cpus",
            str(cpus),
            "Tuner",
            f"vLLM V1 busy-polls in its API server, engine core and each of {gpus} GPU "
            f"worker(s): 2 + {gpus}, plus {extra} for tokenization and detokenization",
        ),
    )


def host_memory(ask: Ask, c: Candidate) -> Sized:
    """Host memory: the spec's, else the processes' own, offloaded weights and adapters."""
    node, gpus = ask.node, c.gpus_count
    if node.memory is not None and (spec_mem := spec_bytes(node.memory)) is not None:
        return Sized(spec_mem, Setting("memory", node.memory, "Spec", "spec.node.memory"))
    offload = int((ask.pins.cpu_offload_gb or 0) * 10**9) * gpus
    adapters = (
        lora.host_bytes(ask.model.architecture, ask.lora, dtype_bytes=c.dtype_bytes)
        if ask.lora is not None
        else 0
    )
    memory = round_up(4 * GIB + 3 * GIB * gpus + offload + adapters, GIB)
    return Sized(
        memory,
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
        ),
    )


def cpu_pinning(node: NodeSpec, profile: Profile) -> Setting:
    """Whether the pod's cores are exclusive (the spec's choice), with a hint for Latency."""
    if node.cpu_pinning:
        return Setting(
            "cpu-pinning",
            "true",
            "Spec",
            "spec.node.cpuPinning: exclusive cores (Guaranteed QoS), so a noisy neighbour "
            "cannot take the tokenizer's and engine's cores",
        )
    hint = (
        "; the Latency profile would benefit: a noisy neighbour pushed P99 up 300 %"
        if profile == "Latency"
        else ""
    )
    return Setting("cpu-pinning", "false", "Default", f"spec.node.cpuPinning is off{hint}")


def startup_budget(ask: Ask, fetched_bytes: int, load_seconds: float) -> Sized:
    """Startup budget: download, load, compile and capture, with a wide margin."""
    download = fetched_bytes / 200e6 if ask.downloads_weights else 0.0
    compile_s = 0.0 if ask.pins.enforce_eager or ask.profile == "FastStart" else 120.0
    startup = max(300, round_up(int(60 + 2 * (download + load_seconds) + compile_s * 1.5), 60))
    return Sized(
        startup,
        Setting(
            "startup-seconds",
            str(startup),
            "Tuner",
            "engine start + twice the predicted load"
            + (" and download (at an assumed 200 MB/s)" if download else "")
            + (" + compilation and CUDA-graph capture" if compile_s else "")
            + ", at least 5 minutes",
        ),
    )


def cache_volume(downloads_weights: bool, fetched_bytes: int) -> Sized | None:
    """The cache volume the weights are downloaded into (an emptyDir: node disk); None
    when the pod downloads nothing."""
    if not downloads_weights:
        return None
    cache = round_up(int(fetched_bytes * CACHE_HEADROOM) + CACHE_EXTRA_BYTES, GIB)
    return Sized(
        cache,
        Setting(
            "cache-size",
            gib_quantity(cache),
            "Tuner",
            f"the weights downloaded from the Hub ({gib(fetched_bytes)}) plus "
            f"{CACHE_HEADROOM - 1:.0%} for the estimate and the repository's other files "
            f"and {CACHE_EXTRA_BYTES // GIB} GiB for vLLM's and torch's compile caches: "
            "the cache volume's sizeLimit and the ephemeral-storage request, so the pod "
            "lands on a node with that much disk and is not evicted for filling it",
        ),
    )


def interconnect(c: Candidate) -> Setting | None:
    """The interconnect a node must offer: NVLink for a tensor-parallel set on it."""
    if c.tp > 1 and c.link == "NVLink":
        return Setting(
            "interconnect",
            "NVLink",
            "Tuner",
            f"tensor parallel {c.tp} needs its GPUs on NVLink: only nodes labelled nvlink",
        )
    return None


def pod_plan(
    ask: Ask,
    c: Candidate,
    load_seconds: float,
    weights_per_gpu: int,
    *,
    download_bytes: int | None = None,
) -> PodPlan:
    gpus, node = c.gpus_count, ask.node
    shm = shm_size(node, gpus)
    cpus = cpu_count(node, ask.profile, gpus)
    memory = host_memory(ask, c)
    pinning = cpu_pinning(node, ask.profile)
    # What the pod downloads: its GPUs' weights, or the whole checkpoint where it serves
    # one pipeline stage of a multi-node group (every node fetches every file).
    fetched = download_bytes if download_bytes is not None else weights_per_gpu * c.gpus_count
    startup = startup_budget(ask, fetched, load_seconds)
    cache = cache_volume(ask.downloads_weights, fetched)
    link = interconnect(c)
    reasons = [shm.reason, cpus.reason, memory.reason, pinning, startup.reason]
    reasons += [s.reason for s in (cache,) if s is not None]
    reasons += [s for s in (link,) if s is not None]
    return PodPlan(
        shm_bytes=shm.value,
        cpus=cpus.value,
        memory_bytes=memory.value,
        cpu_pinning=node.cpu_pinning,
        startup_seconds=startup.value,
        interconnect="NVLink" if link is not None else None,
        reasons=tuple(reasons),
        cache_bytes=cache.value if cache is not None else None,
    )
