"""How the weights are stored, what that costs in bytes, and which vLLM kernel runs them.

A checkpoint is either unquantized (stored in its dtype, 2 bytes per parameter for bf16 or
fp16) or quantized by one of the published methods. For the tuner a quantized checkpoint
is three numbers: bits per weight, the group size (one scale and zero point per group of
weights) and whether the format is one vLLM can run through a Marlin kernel.

Marlin (Frantar et al., 2024; vLLM's ``gptq_marlin`` / ``awq_marlin``) is a mixed-precision
int4 x fp16 GEMM that reaches close to the 4x ideal speed-up over fp16 at the batch sizes
of serving; it needs compute capability 8.0 (Ampere) or newer. vLLM picks it by itself when
the quantization method is left to auto-detection, but an explicit ``--quantization gptq``
forces the slow exllama kernel ("Detected that the model can run with gptq_marlin, however
you specified quantization=gptq explicitly, so forcing gptq"); the tuner therefore names the
kernel explicitly and says why. Marlin handles 4- and 8-bit GPTQ (symmetric, group sizes
-1, 32, 64, 128, with or without act-order) and 4-bit AWQ; anything else falls back.

Embeddings, the output head and norms stay in the activation dtype in GPTQ and AWQ
checkpoints (``lm_head`` is not quantized by default), so their bytes are counted apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from vllm_operator.models.inference_service import Quantization, QuantizationMethod

__all__ = [
    "UNQUANTIZED",
    "WeightFormat",
    "from_config",
    "from_name",
    "from_spec",
    "kernel",
]

# vLLM's Marlin kernels: gptq_marlin supports these (vllm/model_executor/layers/
# quantization/utils/marlin_utils.py, MARLIN_SUPPORTED_GROUP_SIZES / quant types).
_MARLIN_GROUP_SIZES: Final = frozenset({-1, 32, 64, 128})
_MARLIN_GPTQ_BITS: Final = frozenset({4, 8})
_MARLIN_AWQ_BITS: Final = frozenset({4})
MARLIN_MIN_CAPABILITY: Final = (8, 0)
# Native FP8 tensor cores: Ada (8.9) and Hopper (9.0) and newer. On 8.0-8.6 vLLM runs FP8
# checkpoints weight-only through the FP8 Marlin kernel.
FP8_NATIVE_MIN_CAPABILITY: Final = (8, 9)

_METHOD_FROM_CONFIG: Final[dict[str, QuantizationMethod]] = {
    "gptq": "GPTQ",
    "gptq_marlin": "GPTQ",
    "marlin": "GPTQ",
    "awq": "AWQ",
    "awq_marlin": "AWQ",
    "fp8": "FP8",
    "fbgemm_fp8": "FP8",
    "bitsandbytes": "BitsAndBytes",
    "gguf": "GGUF",
    "compressed-tensors": "CompressedTensors",
    "compressed_tensors": "CompressedTensors",
}


@dataclasses.dataclass(frozen=True)
class WeightFormat:
    """How the weights are stored. ``method`` uses the API's spelling (None, GPTQ, ...)."""

    method: QuantizationMethod = "None"
    bits: int | None = None
    group_size: int | None = None
    symmetric: bool = True
    act_order: bool = False
    # Where this came from, for the reason lines: "spec", "config.json", "model name".
    origin: str = "given"

    @property
    def quantized(self) -> bool:
        return self.method != "None"

    def bytes_per_quantized_weight(self) -> float:
        """Bytes one weight of a quantized linear layer takes, scales and zeros included."""
        bits = self.effective_bits
        group = self.group_size if self.group_size and self.group_size > 0 else 0
        if self.method in ("GPTQ", "AWQ", "CompressedTensors") and group:
            # One fp16 scale and one packed zero point per group.
            return bits / 8 + (2 + bits / 8) / group
        if self.method == "BitsAndBytes" and bits == 4:
            # NF4 with one absmax per 64 weights, itself 8-bit with double quantization.
            return 0.5 + 1 / 64 + 4 / (64 * 256)
        return bits / 8

    @property
    def effective_bits(self) -> float:
        if self.method == "FP8":
            return 8
        if self.method == "GGUF":
            # K-quants carry about half a bit of scales per weight (Q4_K_M is ~4.85 bpw).
            return (self.bits or 4) + 0.5
        if self.method == "BitsAndBytes":
            return self.bits or 4
        return self.bits or 8

    def describe(self) -> str:
        if not self.quantized:
            return "unquantized"
        parts: list[str] = [self.method]
        if self.bits and self.method not in ("FP8",):
            parts.append(f"{self.bits}-bit")
        if self.group_size:
            parts.append("per-channel" if self.group_size == -1 else f"group {self.group_size}")
        return " ".join(parts)


UNQUANTIZED: Final = WeightFormat()


def from_spec(spec: Quantization | None) -> WeightFormat | None:
    """The format an InferenceService states; None when it states nothing."""
    if spec is None:
        return None
    return WeightFormat(
        method=spec.method,
        bits=spec.bits,
        group_size=spec.group_size,
        origin="spec.model.quantization",
    )


def _compressed_tensors_bits(qc: Mapping[str, Any]) -> tuple[int | None, int | None]:
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping):
        return None, None
    for group in groups.values():
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if isinstance(weights, Mapping) and isinstance(weights.get("num_bits"), int):
            size = weights.get("group_size")
            return int(weights["num_bits"]), size if isinstance(size, int) else None
    return None, None


def from_config(config: Mapping[str, Any]) -> WeightFormat | None:
    """The format stated in a config.json's ``quantization_config``; None if unquantized."""
    qc = config.get("quantization_config")
    if not isinstance(qc, Mapping):
        text = config.get("text_config")
        qc = text.get("quantization_config") if isinstance(text, Mapping) else None
    if not isinstance(qc, Mapping):
        return None
    raw = str(qc.get("quant_method") or qc.get("quant_type") or "").lower()
    method = _METHOD_FROM_CONFIG.get(raw)
    if method is None:
        # Unknown to the tuner (modelopt, mxfp4, ...): count it as 8-bit, a safe upper
        # bound for every published method but bitsandbytes' 8-bit with outliers.
        return WeightFormat(method="CompressedTensors", bits=8, origin=f"config.json ({raw})")
    bits = qc.get("bits", qc.get("w_bit"))
    group = qc.get("group_size", qc.get("q_group_size"))
    if method == "CompressedTensors":
        bits, group = _compressed_tensors_bits(qc)
        bits = bits or 8
    if method == "BitsAndBytes":
        bits = 8 if qc.get("load_in_8bit") else 4
    if method == "FP8":
        bits, group = 8, None
    return WeightFormat(
        method=method,
        bits=int(bits) if isinstance(bits, int) else None,
        group_size=int(group) if isinstance(group, int) else None,
        symmetric=bool(qc.get("sym", True)),
        act_order=bool(qc.get("desc_act", False)),
        origin="config.json quantization_config",
    )


def from_name(name: str) -> WeightFormat | None:
    """A hint from a repository name such as ``TheBloke/Llama-2-7B-GPTQ``; None if none.

    Only the common suffixes are read; it is a guess and the reasons say so.
    """
    tokens = {t for t in name.lower().replace("_", "-").replace("/", "-").split("-") if t}
    if "gptq" in tokens:
        bits = 8 if {"8bit", "int8", "w8a16"} & tokens else 4
        return WeightFormat(method="GPTQ", bits=bits, group_size=128, origin="model name")
    if "awq" in tokens:
        return WeightFormat(method="AWQ", bits=4, group_size=128, origin="model name")
    if "fp8" in tokens:
        return WeightFormat(method="FP8", bits=8, origin="model name")
    return None


def _at_least(capability: tuple[int, int] | None, minimum: tuple[int, int]) -> bool:
    return capability is not None and capability >= minimum


def kernel(fmt: WeightFormat, capability: tuple[int, int] | None) -> tuple[str | None, str]:
    """The ``--quantization`` value for ``fmt`` on a GPU of ``capability``, and why.

    None means "pass nothing" (unquantized, or a GPU too unknown to choose for it: vLLM
    then detects the method from config.json and picks the kernel itself).
    """
    if not fmt.quantized:
        return None, "weights are not quantized"
    cc = f"compute capability {capability[0]}.{capability[1]}" if capability else None
    if capability is None:
        return None, f"{fmt.describe()} on a GPU of unknown compute capability: vLLM detects it"
    marlin_ok = _at_least(capability, MARLIN_MIN_CAPABILITY)
    group_ok = fmt.group_size is None or fmt.group_size in _MARLIN_GROUP_SIZES
    if fmt.method == "GPTQ":
        if marlin_ok and fmt.bits in _MARLIN_GPTQ_BITS and group_ok and fmt.symmetric:
            return "gptq_marlin", (
                f"{fmt.describe()} on {cc}: the Marlin int{fmt.bits} kernel, several times "
                "faster than the exllama kernel that --quantization gptq would force"
            )
        why = "needs compute capability >= 8.0" if not marlin_ok else "unsupported by Marlin"
        return "gptq", f"{fmt.describe()}: Marlin {why}; the exllama GPTQ kernel"
    if fmt.method == "AWQ":
        if marlin_ok and fmt.bits in _MARLIN_AWQ_BITS and group_ok:
            return "awq_marlin", f"{fmt.describe()} on {cc}: the Marlin kernel for AWQ"
        return "awq", f"{fmt.describe()}: Marlin needs compute capability >= 8.0 and 4 bits"
    if fmt.method == "FP8":
        if _at_least(capability, FP8_NATIVE_MIN_CAPABILITY):
            return "fp8", f"FP8 weights on {cc}: native FP8 tensor cores"
        if marlin_ok:
            return "fp8", f"FP8 weights on {cc}: no FP8 tensor cores, weight-only FP8 Marlin"
        return "fp8", f"FP8 weights on {cc}: unsupported below 8.0; expect vLLM to refuse"
    if fmt.method == "BitsAndBytes":
        return "bitsandbytes", f"{fmt.describe()}: the bitsandbytes kernels (slow at batch > 1)"
    if fmt.method == "GGUF":
        return "gguf", f"{fmt.describe()}: vLLM's GGUF kernels"
    return "compressed-tensors", f"{fmt.describe()} ({fmt.origin}): compressed-tensors kernels"
