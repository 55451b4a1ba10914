"""How the weights are stored, what that costs in bytes, and which vLLM kernel runs them.

A checkpoint is either unquantized (stored in its dtype, 2 bytes per parameter for bf16 or
fp16) or quantized by one of the published methods. For the tuner a quantized checkpoint
is its method, the bits per weight, the group (or block) that shares one scale, and the
``quant_method`` its config.json names, because that name bounds what ``--quantization``
vLLM accepts for it (below). The bytes per weight of a quantized layer, scales included:

============================  =====================================================  ======
format (config.json)          layout                                                 bits
============================  =====================================================  ======
GPTQ / AWQ 4-bit, group 128   int4 + one fp16 scale and one packed zero per group    4.16
compressed-tensors W4A16      int4 + one bf16 scale per group (zero only if asym.)   4.13
compressed-tensors W8A8       int8 (or fp8) + one scale per output channel           8
FP8 (``fp8``, per tensor)     fp8 e4m3 + one fp32 scale per tensor                   8
FP8 block (``fp8`` + 128x128) fp8 e4m3 + one fp32 scale per 128 x 128 block          8.002
bitsandbytes NF4              nf4 + absmax per 64 (8-bit with double quantization)   4.13
bitsandbytes 8-bit            int8 + one fp32 scale per row                          8
GGUF Q4_K_M (bits 4)          llama.cpp's mix of k-quants, embeddings included       4.84
MXFP4 (gpt-oss)               fp4 e2m1 + one e8m0 scale per 32, experts only         4.25
============================  =====================================================  ======

GGUF's figures per bits are llama.cpp's own (tools/quantize/README.md, Llama 2 7B: Q2_K
3.35, Q3_K_M 3.91, Q4_K_M 4.84, Q5_K_M 5.68, Q6_K 6.56 bits per weight; Q8_0 is 34 bytes
per 32 weights, 8.5); they cover the whole file, embeddings and output head included.
MXFP4 (OCP Microscaling) applies to the mixture-of-experts weights alone: gpt-oss's
``quantization_config.modules_to_not_convert`` keeps attention, the router, the
embeddings and ``lm_head`` in bf16, and vLLM runs every other linear layer unquantized
(``Mxfp4Config.get_quant_method``). vLLM's MoE kernels also pad the expert matrices
(``mxfp4_round_up_hidden_size_and_intermediate_size``): the intermediate size per GPU to
a multiple of 64 on Hopper (the Triton kernel), else to 128 with the hidden size to 256
(Marlin on Ampere, Ada and consumer Blackwell; FlashInfer TRT-LLM on B200), which
:func:`for_gpu` records and :func:`mxfp4_expert_parameters` applies. On Hopper the Triton
kernel swizzles the block scales into new tensors, and vLLM 0.11-0.24 keep the originals
too (0.25 frees them): one more byte per 32 expert weights, counted so that the estimate
holds for every release. Checked against vLLM's own "Model loading took" lines in
``tests/tuning/test_quantization.py`` (gpt-oss-20b on an A100, -120b on an H100).

A method the tuner does not know (``modelopt``, ``quark``, ...) is carried as
``Unknown`` with its name: no ``--quantization`` is passed (vLLM detects the method from
config.json itself), and the weights are the checkpoint's own size when the caller read
it (``model.safetensors.index.json``'s ``metadata.total_size``), else an upper bound of
8 bits per weight of every layer but the embeddings and norms. The description says which.

``--quantization`` is never guessed. vLLM refuses a value that differs from the
checkpoint's ``quant_method`` unless that method converts itself to it
(``override_quantization_method``): ``gptq`` to ``gptq_marlin``, ``awq`` to
``awq_marlin``; every other name, ``gptq_marlin`` and ``fbgemm_fp8`` included, is passed
as config.json spells it. Marlin (Frantar et al., 2024; vLLM's ``gptq_marlin`` /
``awq_marlin``) is a mixed-precision int4 x fp16 GEMM that reaches close to the 4x ideal
speed-up over fp16 at the batch sizes of serving; it needs compute capability 8.0 (Ampere)
or newer. vLLM picks it by itself when the quantization method is left to
auto-detection, but an explicit ``--quantization gptq`` forced the slow exllama kernel
before 0.22 ("Detected that the model can run with gptq_marlin, however you specified
quantization=gptq explicitly, so forcing gptq"; from 0.22 both names go to auto_gptq,
which picks the kernel); the tuner therefore names the kernel explicitly and says why.
Marlin handles 4- and 8-bit GPTQ (symmetric, group sizes -1, 32, 64, 128, with or without
act-order) and 4-bit AWQ; anything else falls back. On a GPU of unknown compute capability
nothing is passed.

Embeddings, the output head and norms stay in the activation dtype in GPTQ, AWQ, FP8 and
compressed-tensors checkpoints (``lm_head`` is not quantized by default), so their bytes
are counted apart (:func:`vllm_operator.tuning.memory.weights_bytes`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Final, Literal

from vllm_operator.models.inference_service import Quantization, QuantizationMethod

__all__ = [
    "MXFP4_BITS",
    "UNKNOWN_BOUND_BITS",
    "UNQUANTIZED",
    "FormatMethod",
    "WeightFormat",
    "for_gpu",
    "from_config",
    "from_name",
    "from_spec",
    "kernel",
    "mxfp4_expert_parameters",
]

# The API's methods plus one the tuner cannot read: a checkpoint whose quant_method it
# does not know. Never written to a spec; only read from config.json.
FormatMethod = QuantizationMethod | Literal["Unknown"]

# vLLM's Marlin kernels: gptq_marlin supports these (vllm/model_executor/layers/
# quantization/utils/marlin_utils.py, MARLIN_SUPPORTED_GROUP_SIZES / quant types).
_MARLIN_GROUP_SIZES: Final = frozenset({-1, 32, 64, 128})
_MARLIN_GPTQ_BITS: Final = frozenset({4, 8})
_MARLIN_AWQ_BITS: Final = frozenset({4})
MARLIN_MIN_CAPABILITY: Final = (8, 0)
# Native FP8 tensor cores: Ada (8.9) and Hopper (9.0) and newer. On 8.0-8.6 vLLM runs FP8
# checkpoints weight-only through the FP8 Marlin kernel.
FP8_NATIVE_MIN_CAPABILITY: Final = (8, 9)
# int8 tensor-core GEMMs (CUTLASS scaled_mm) need Turing or newer.
INT8_MIN_CAPABILITY: Final = (7, 5)
# Mxfp4Config.get_min_capability: 80.
MXFP4_MIN_CAPABILITY: Final = (8, 0)

# MXFP4 (OCP Microscaling Formats v1.0): 4-bit E2M1 elements, one 8-bit E8M0 scale per
# block of 32: 4 + 8 / 32 bits per weight.
MXFP4_BLOCK: Final = 32
MXFP4_BITS: Final = 4 + 8 / MXFP4_BLOCK
# The stated bound for a method the tuner does not know and a checkpoint of unknown size.
UNKNOWN_BOUND_BITS: Final = 8

# llama.cpp's bits per weight of its usual mix per bit width (see the module docstring).
_GGUF_BITS: Final[Mapping[int, float]] = {2: 3.35, 3: 3.91, 4: 4.84, 5: 5.68, 6: 6.56, 8: 8.5}
_GGUF_MIX: Final[Mapping[int, str]] = {
    2: "Q2_K",
    3: "Q3_K_M",
    4: "Q4_K_M",
    5: "Q5_K_M",
    6: "Q6_K",
    8: "Q8_0",
}

# config.json's quant_method -> the API's method.
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
    "mxfp4": "MXFP4",
}
# MXFP4 expert padding of vLLM's MoE kernels: (hidden multiple, intermediate multiple per
# GPU). Hopper: the Triton (triton_kernels matmul_ogs) backend rounds the intermediate
# size to 64. Others: Marlin (Ampere, Ada, consumer Blackwell) and FlashInfer TRT-LLM
# (B200) round the intermediate size to 128 and the hidden size to 256; it is also the
# bound taken for a GPU of unknown capability.
_MXFP4_PADDING_HOPPER: Final = (1, 64)
_MXFP4_PADDING_OTHER: Final = (256, 128)
# Hopper's Triton path before vLLM 0.25 keeps the unswizzled e8m0 scales beside the
# swizzled ones (fused_moe/oracle/mxfp4.py frees them from 0.25 on).
MXFP4_RETAINED_SCALE_BITS: Final = 8 / MXFP4_BLOCK


@dataclasses.dataclass(frozen=True)
class WeightFormat:
    """How the weights are stored. ``method`` uses the API's spelling (None, GPTQ, ...),
    or ``Unknown`` for a config.json method the tuner does not know."""

    method: FormatMethod = "None"
    bits: int | None = None
    group_size: int | None = None
    symmetric: bool = True
    act_order: bool = False
    # Where this came from, for the reason lines: "spec", "config.json", "model name".
    origin: str = "given"
    # config.json's quant_method as vLLM normalizes it (lower case, compressed-tensors);
    # None when the format was not read from a config.json. It is the checkpoint's name
    # for the format, not the format: two that store the weights alike compare equal.
    checkpoint_method: str | None = dataclasses.field(default=None, compare=False)
    # Elements are floats (FP8, NVFP4 in compressed-tensors) rather than integers.
    float_weights: bool = False
    # Bits of the quantized activations (W8A8: 8); None when only the weights are.
    activation_bits: int | None = None
    # FP8 block-wise scales: one fp32 scale per (rows, columns) block.
    block: tuple[int, int] | None = None
    # bitsandbytes 4-bit: the absmax of each 64 weights itself quantized to 8 bits.
    double_quant: bool = True
    # The checkpoint's weights in bytes (model.safetensors.index.json total_size) when
    # the caller read it; it sizes an Unknown method's weights.
    checkpoint_bytes: int | None = None
    # MXFP4: the padding vLLM's MoE kernel on the chosen GPU applies to the experts
    # (hidden multiple, intermediate multiple per GPU), and whether a second copy of the
    # scales stays resident (Hopper's Triton path before 0.25); set by for_gpu.
    moe_padding: tuple[int, int] | None = None
    retained_scales: bool = False

    @property
    def quantized(self) -> bool:
        return self.method != "None"

    @property
    def known(self) -> bool:
        return self.method != "Unknown"

    def bytes_per_quantized_weight(self) -> float:
        """Bytes one weight of a quantized layer takes, scales and zeros included."""
        bits = self.effective_bits
        group = self.group_size if self.group_size and self.group_size > 0 else 0
        if self.method in ("GPTQ", "AWQ") and group:
            # One fp16 scale and one packed zero point per group (qzeros are stored even
            # for symmetric GPTQ).
            return bits / 8 + (2 + bits / 8) / group
        if self.method == "CompressedTensors":
            if self.block:
                return bits / 8 + 4 / (self.block[0] * self.block[1])
            if group:
                # bf16 scales (fp8 e4m3 for NVFP4's float 4-bit); zero points only when
                # asymmetric.
                scale = 1 if self.float_weights and bits <= 4 else 2
                zero = 0 if self.symmetric else bits / 8
                return bits / 8 + (scale + zero) / group
            return bits / 8
        if self.method == "FP8" and self.block:
            return 1 + 4 / (self.block[0] * self.block[1])
        if self.method == "BitsAndBytes" and bits == 4:
            # NF4: one absmax per 64 weights, itself 8-bit with one fp32 per 256 blocks
            # under double quantization, else fp32.
            absmax = 1 / 64 + 4 / (64 * 256) if self.double_quant else 4 / 64
            return 0.5 + absmax
        return bits / 8

    @property
    def effective_bits(self) -> float:
        if self.method == "FP8":
            return 8
        if self.method == "MXFP4":
            return MXFP4_BITS + (MXFP4_RETAINED_SCALE_BITS if self.retained_scales else 0)
        if self.method == "GGUF":
            bits = self.bits or 4
            return _GGUF_BITS.get(bits, bits + 0.5)
        if self.method == "BitsAndBytes":
            return self.bits or 4
        if self.method == "Unknown":
            return UNKNOWN_BOUND_BITS
        return self.bits or 8

    def describe(self) -> str:
        if not self.quantized:
            return "unquantized"
        if self.method == "Unknown":
            return self._unknown_note()
        if self.method == "MXFP4":
            return f"MXFP4 experts ({MXFP4_BITS:g} bits per weight; the other layers unquantized)"
        if self.method == "GGUF":
            bits = self.bits or 4
            mix = f", {_GGUF_MIX[bits]}" if bits in _GGUF_MIX else ""
            return f"GGUF {bits}-bit (~{self.effective_bits:g} bits per weight{mix})"
        if self.method == "BitsAndBytes":
            return "BitsAndBytes 8-bit" if self.bits == 8 else "BitsAndBytes 4-bit NF4"
        parts: list[str] = [self.method]
        if self.method == "CompressedTensors" and self.bits:
            kind = "fp" if self.float_weights else "int"
            acts = f"A{self.activation_bits}" if self.activation_bits else "A16"
            parts.append(f"W{self.bits}{acts} ({kind}{self.bits})")
        elif self.bits and self.method not in ("FP8",):
            parts.append(f"{self.bits}-bit")
        if self.block:
            parts.append(f"block {self.block[0]}x{self.block[1]}")
        if self.group_size:
            parts.append("per-channel" if self.group_size == -1 else f"group {self.group_size}")
        return " ".join(parts)

    def _unknown_note(self) -> str:
        name = self.checkpoint_method or "?"
        if self.checkpoint_bytes:
            sized = (
                f"as the checkpoint's own {self.checkpoint_bytes / 1e9:.2f} GB "
                "(model.safetensors.index.json total_size)"
            )
        else:
            sized = (
                f"at an upper bound of {UNKNOWN_BOUND_BITS} bits per weight of every layer "
                "but the embeddings and norms (the checkpoint's size was not read)"
            )
        return (
            f"the tuner does not know quantization method {name!r}; vLLM will detect it "
            f"from config.json, so no --quantization is passed; weights sized {sized}"
        )


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


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _compressed_tensors(qc: Mapping[str, Any], **common: Any) -> WeightFormat:
    """compressed-tensors: the first config group's ``weights`` and ``input_activations``
    (``num_bits``, ``type``, ``strategy``, ``group_size``, ``block_structure``)."""
    groups = qc.get("config_groups")
    weights: Mapping[str, Any] = {}
    acts: Mapping[str, Any] | None = None
    if isinstance(groups, Mapping):
        for group in groups.values():
            w = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(w, Mapping) and _int(w.get("num_bits")):
                weights = w
                a = group.get("input_activations")
                acts = a if isinstance(a, Mapping) else None
                break
    bits = _int(weights.get("num_bits")) or 8
    strategy = str(weights.get("strategy") or "").lower()
    group = _int(weights.get("group_size"))
    if group is None and strategy == "channel":
        group = -1
    block = weights.get("block_structure")
    block_shape = (
        (int(block[0]), int(block[1]))
        if isinstance(block, list | tuple) and len(block) == 2 and all(_int(b) for b in block)
        else None
    )
    return WeightFormat(
        method="CompressedTensors",
        bits=bits,
        group_size=group,
        symmetric=bool(weights.get("symmetric", True)),
        float_weights=str(weights.get("type") or "int").lower() == "float",
        activation_bits=_int(acts.get("num_bits")) if acts else None,
        block=block_shape,
        **common,
    )


def _quantization_config(config: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for holder in (config, config.get("text_config")):
        if not isinstance(holder, Mapping):
            continue
        # compressed-tensors' older checkpoints call it compression_config (vLLM reads both).
        for key in ("quantization_config", "compression_config"):
            qc = holder.get(key)
            if isinstance(qc, Mapping):
                return qc
    return None


def from_config(
    config: Mapping[str, Any], *, checkpoint_bytes: int | None = None
) -> WeightFormat | None:
    """The format stated in a config.json's ``quantization_config``; None if unquantized.

    ``checkpoint_bytes``: the checkpoint's size when the caller read it (the index's
    ``metadata.total_size``); kept for a method the tuner does not know.
    """
    qc = _quantization_config(config)
    if qc is None:
        return None
    # vLLM's own normalization (transformers_utils/model_arch_config_convertor.py).
    raw = str(qc.get("quant_method") or qc.get("quant_type") or "").lower()
    raw = raw.replace("compressed_tensors", "compressed-tensors")
    method = _METHOD_FROM_CONFIG.get(raw)
    common: dict[str, Any] = {"origin": f"config.json ({raw})", "checkpoint_method": raw}
    if method is None:
        return WeightFormat(method="Unknown", checkpoint_bytes=checkpoint_bytes, **common)
    if method == "CompressedTensors":
        return _compressed_tensors(qc, **common)
    if method == "FP8":
        block = qc.get("weight_block_size")
        shape = (
            (int(block[0]), int(block[1]))
            if isinstance(block, list | tuple) and len(block) == 2 and all(_int(b) for b in block)
            else None
        )
        return WeightFormat(method="FP8", bits=8, block=shape, float_weights=True, **common)
    if method == "BitsAndBytes":
        eight = bool(qc.get("load_in_8bit") or qc.get("_load_in_8bit"))
        return WeightFormat(
            method="BitsAndBytes",
            bits=8 if eight else 4,
            double_quant=bool(qc.get("bnb_4bit_use_double_quant", False)),
            **common,
        )
    if method == "MXFP4":
        return WeightFormat(method="MXFP4", bits=4, float_weights=True, **common)
    bits = _int(qc.get("bits", qc.get("w_bit")))
    group = _int(qc.get("group_size", qc.get("q_group_size")))
    return WeightFormat(
        method=method,
        bits=bits,
        group_size=group,
        symmetric=bool(qc.get("sym", True)),
        act_order=bool(qc.get("desc_act", False)),
        **common,
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


def for_gpu(fmt: WeightFormat, capability: tuple[int, int] | None) -> WeightFormat:
    """``fmt`` as vLLM lays it out on a GPU of ``capability``: for MXFP4, the padding
    its MoE kernel applies to the experts (see the module docstring); others unchanged."""
    if fmt.method != "MXFP4":
        return fmt
    hopper = capability is not None and capability[0] == 9
    return dataclasses.replace(
        fmt,
        moe_padding=_MXFP4_PADDING_HOPPER if hopper else _MXFP4_PADDING_OTHER,
        retained_scales=hopper,
    )


def _round_up(value: int, multiple: int) -> int:
    return math.ceil(value / multiple) * multiple


def mxfp4_expert_parameters(
    expert_parameters: int,
    *,
    hidden_size: int,
    intermediate_size: int,
    padding: tuple[int, int] | None,
    tensor_parallel: int = 1,
) -> int:
    """Expert weights as vLLM allocates them: each expert's gate-up (2 x intermediate x
    hidden) and down (hidden x intermediate) matrices with the hidden size rounded up to
    ``padding[0]`` and each GPU's share of the intermediate size to ``padding[1]``."""
    if not padding or not expert_parameters:
        return expert_parameters
    hidden_multiple, inter_multiple = padding
    tp = max(1, tensor_parallel)
    hidden = _round_up(hidden_size, hidden_multiple)
    inter = _round_up(math.ceil(intermediate_size / tp), inter_multiple) * tp
    return math.ceil(expert_parameters * hidden * inter / (hidden_size * intermediate_size))


def _checkpoint_flag(fmt: WeightFormat, *variants: str) -> str | None:
    """The checkpoint's own quant_method when it is not one of ``variants`` (the names
    vLLM converts to each other): then that spelling is the only one vLLM accepts."""
    raw = fmt.checkpoint_method
    return raw if raw and raw not in variants else None


def kernel(fmt: WeightFormat, capability: tuple[int, int] | None) -> tuple[str | None, str]:
    """The ``--quantization`` value for ``fmt`` on a GPU of ``capability``, and why.

    None means "pass nothing" (unquantized; a method the tuner does not know; or a GPU too
    unknown to choose for it): vLLM then detects the method from config.json and picks the
    kernel itself.
    """
    if not fmt.quantized:
        return None, "weights are not quantized"
    if not fmt.known:
        return None, fmt.describe()
    cc = f"compute capability {capability[0]}.{capability[1]}" if capability else None
    if capability is None:
        return None, f"{fmt.describe()} on a GPU of unknown compute capability: vLLM detects it"
    marlin_ok = _at_least(capability, MARLIN_MIN_CAPABILITY)
    group_ok = fmt.group_size is None or fmt.group_size in _MARLIN_GROUP_SIZES
    if fmt.method in ("GPTQ", "AWQ") and (own := _checkpoint_flag(fmt, "gptq", "awq")):
        refuse = (
            "" if marlin_ok else "; Marlin needs compute capability >= 8.0: expect vLLM to refuse"
        )
        return own, (
            f"{fmt.describe()}: config.json names {own}, the only spelling vLLM accepts for "
            f"it (only gptq and awq convert to their Marlin kernels){refuse}"
        )
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
        flag = _checkpoint_flag(fmt) or "fp8"
        if _at_least(capability, FP8_NATIVE_MIN_CAPABILITY):
            return flag, f"{fmt.describe()} weights on {cc}: native FP8 tensor cores"
        if marlin_ok:
            return (
                flag,
                f"{fmt.describe()} weights on {cc}: no FP8 tensor cores, weight-only FP8 Marlin",
            )
        return (
            flag,
            f"{fmt.describe()} weights on {cc}: unsupported below 8.0; expect vLLM to refuse",
        )
    if fmt.method == "MXFP4":
        if capability[0] == 9:
            why = (
                "the Triton MoE kernel (triton_kernels); vLLM before 0.25 keeps a second copy "
                "of the scales, counted"
            )
        elif capability[0] == 10:
            why = "FlashInfer's MXFP4 MoE kernel"
        elif marlin_ok:
            why = "no FP4 tensor cores: weight-only MXFP4 through the Marlin MoE kernel"
        else:
            why = "unsupported below 8.0; expect vLLM to refuse"
        return "mxfp4", f"{fmt.describe()} on {cc}: {why}"
    if fmt.method == "BitsAndBytes":
        return "bitsandbytes", f"{fmt.describe()}: the bitsandbytes kernels (slow at batch > 1)"
    if fmt.method == "GGUF":
        return "gguf", f"{fmt.describe()}: vLLM's GGUF kernels"
    return (
        "compressed-tensors",
        f"{fmt.describe()} on {cc}: {_compressed_tensors_kernel(fmt, capability)}",
    )


def _compressed_tensors_kernel(fmt: WeightFormat, capability: tuple[int, int]) -> str:
    if fmt.activation_bits and fmt.activation_bits <= 8 and fmt.float_weights:
        if _at_least(capability, FP8_NATIVE_MIN_CAPABILITY):
            return "FP8 x FP8 on native FP8 tensor cores"
        return "no FP8 tensor cores: weights through weight-only FP8 Marlin, activations bf16"
    if fmt.activation_bits and fmt.activation_bits <= 8:
        if _at_least(capability, INT8_MIN_CAPABILITY):
            return "int8 x int8 tensor-core GEMMs (CUTLASS scaled_mm)"
        return "int8 GEMMs need compute capability >= 7.5; expect vLLM to refuse"
    if _at_least(capability, MARLIN_MIN_CAPABILITY):
        return "weight-only, the Marlin/Machete mixed-precision kernels"
    return "weight-only kernels below Marlin's 8.0; expect vLLM to refuse"
