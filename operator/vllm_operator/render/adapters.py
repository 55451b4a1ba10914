"""Where the LoRA adapters of spec.adapters are, as the vLLM server sees them.

An adapter on a claim is in the folder the claim is mounted at (/adapters/<claim>), one
in the image at its path, one on the Hub is its repository id (vLLM downloads it when it
loads it). The sync (reconcile/adapters.py), the warmup Job and the status all use these.
"""

from __future__ import annotations

from vllm_operator.constants import ADAPTER_MOUNT
from vllm_operator.models import InferenceService
from vllm_operator.models.inference_service import Adapter, EffectiveTuning


def adapter_path(adapter: Adapter) -> str:
    """What vLLM loads the adapter from: a folder in the pod, or a Hub repository id."""
    source = adapter.source
    if source.hugging_face is not None:
        return source.hugging_face.repo
    if source.pvc is not None:
        inside = source.pvc.path.strip("/")
        root = f"{ADAPTER_MOUNT}/{source.pvc.claim_name}"
        return f"{root}/{inside}" if inside else root
    assert source.image is not None  # the model validator guarantees exactly one
    return source.image.path.rstrip("/") or "/"


def adapter_claims(isvc: InferenceService) -> list[str]:
    """The claims the adapters are on, each once, in name order (the pod mounts each)."""
    return sorted({a.source.pvc.claim_name for a in isvc.spec.adapters if a.source.pvc})


def max_rank_in_force(tuning: EffectiveTuning) -> int | None:
    """--max-lora-rank as rendered (planned or overridden); None when not readable."""
    for arg in tuning.arguments:
        if arg.name == "max-lora-rank" and arg.value.isdigit():
            return int(arg.value)
    return None


def rank_refusal(adapter: Adapter, max_rank: int | None) -> str | None:
    """Why an adapter is not loaded at all: a declared rank above --max-lora-rank."""
    if max_rank is None or adapter.rank is None or adapter.rank <= max_rank:
        return None
    return (
        f"rank {adapter.rank} exceeds the servers' max-lora-rank {max_rank}; raise it in "
        "spec.tuning.overrides (the pods restart) or use an adapter of a lower rank"
    )


def loadable(isvc: InferenceService, tuning: EffectiveTuning) -> list[tuple[str, str]]:
    """(name, path) of each adapter the servers are to have, in spec order."""
    max_rank = max_rank_in_force(tuning)
    return [
        (a.name, adapter_path(a)) for a in isvc.spec.adapters if rank_refusal(a, max_rank) is None
    ]
