"""The size of a ModelCache's claim when its spec says ``auto``: the checkpoint's weights as
the tuner estimates them, with headroom for the estimate's error and the repository's
other files (tokenizer, configs, README)."""

from __future__ import annotations

from typing import Final

from vllm_operator.models.inference_service import HuggingFaceSource, ModelSource, ModelSpec
from vllm_operator.models.model_cache import ModelCache
from vllm_operator.tuning.memory import GIB, dtype_bytes, weights_bytes
from vllm_operator.tuning.request import resolve_model
from vllm_operator.tuning.results import gib_quantity
from vllm_operator.tuning.units import gib, round_up

# The checkpoint on disk: the estimate plus 10 % and 1 GiB (the download itself checks the
# free space against the Hub's exact file sizes before it writes anything).
CLAIM_HEADROOM: Final = 1.10
CLAIM_EXTRA_BYTES: Final = 1 * GIB


class SizeUnknown(ValueError):
    """Size auto for a model the tuner cannot size; the message says what to set."""


def claim_size(cache: ModelCache) -> tuple[str, str]:
    """The size of the claim to create (a quantity), and why. Raises SizeUnknown when
    ``auto`` has nothing to go on (neither spec.architecture nor a catalog entry)."""
    storage = cache.spec.storage
    if storage.size != "auto":
        return storage.size, "spec.storage.size"
    hub = cache.spec.source.hugging_face
    assert hub is not None  # a pvc source creates no claim
    model = resolve_model(
        ModelSpec(
            source=ModelSource(hugging_face=HuggingFaceSource(repo=hub.repo)),
            architecture=cache.spec.architecture,
        )
    )
    if model is None:
        raise SizeUnknown(
            f"spec.storage.size is auto, but the tuner cannot estimate the weights of "
            f"{hub.repo}: it is not in the tuner's catalog; set spec.storage.size, or "
            "spec.architecture"
        )
    arch = model.architecture
    weights = weights_bytes(
        arch, model.weight_format, activation_dtype_bytes=dtype_bytes(arch.torch_dtype or "")
    )
    size = round_up(int(weights * CLAIM_HEADROOM) + CLAIM_EXTRA_BYTES, GIB)
    return gib_quantity(size), (
        f"the weights of {hub.repo} ({gib(weights)}, from {model.origin}) plus "
        f"{CLAIM_HEADROOM - 1:.0%} and {CLAIM_EXTRA_BYTES // GIB} GiB for the estimate's "
        "error and the repository's other files"
    )
