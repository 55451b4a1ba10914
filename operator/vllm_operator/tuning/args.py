"""vLLM arguments: each with a value, who decided it and why; overrides.

The tuner proposes arguments (source ``Tuner``), carries some straight from the spec
(``Spec``: a stated dtype or GPU count) and states a few of vLLM's own defaults it has
checked and kept (``Default``). A user's ``spec.tuning.overrides`` always win: an
overridden argument keeps the user's value verbatim, is marked ``Override`` and its reason
names what the tuner would have chosen, so the status shows both.

Overrides are also read *before* planning (:func:`read_overrides`): a pinned
``tensor-parallel-size``, ``max-model-len`` or ``gpu-memory-utilization`` changes what
fits, so the planner plans around the pinned value instead of predicting for a value that
is not in force. Numbers are read the way vLLM reads them (``human_readable_int``: ``32k``
is 32,000 and ``32K`` is 32,768; :func:`vllm_operator.releases.arguments.parse_human_int`).

The command line is spelled by :func:`vllm_operator.models.inference_service.command_flags`
after vLLM's argparse: a boolean argument is ``--name`` for ``true`` and ``--no-name`` for
``false`` (``argparse.BooleanOptionalAction``, which vLLM uses for its boolean engine
arguments); anything else is ``--name value``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final

from vllm_operator.models.inference_service import ArgumentSource, EffectiveArgument
from vllm_operator.releases.arguments import parse_human_int

__all__ = [
    "Pins",
    "Setting",
    "apply_overrides",
    "read_overrides",
]


@dataclasses.dataclass(frozen=True)
class Setting:
    """One decided value (a vLLM argument, a pod setting or an environment variable)."""

    name: str
    value: str
    source: ArgumentSource
    reason: str

    def to_effective(self) -> EffectiveArgument:
        return EffectiveArgument(
            name=self.name, value=self.value, source=self.source, reason=self.reason
        )


def _parse_bool(text: str) -> bool | None:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    return None


def _parse_float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True)
class Pins:
    """Override values the planner must plan around (None: not overridden)."""

    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    kv_cache_dtype: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    enforce_eager: bool | None = None
    enable_chunked_prefill: bool | None = None
    block_size: int | None = None
    cpu_offload_gb: float | None = None
    # Overrides whose value the planner could not read (passed to vLLM all the same).
    unreadable: tuple[str, ...] = ()


_INT_PINS: Final = {
    "tensor-parallel-size": "tensor_parallel_size",
    "pipeline-parallel-size": "pipeline_parallel_size",
    "max-model-len": "max_model_len",
    "max-num-seqs": "max_num_seqs",
    "max-num-batched-tokens": "max_num_batched_tokens",
    "kv-cache-memory-bytes": "kv_cache_memory_bytes",
    "block-size": "block_size",
}
_FLOAT_PINS: Final = {
    "gpu-memory-utilization": "gpu_memory_utilization",
    "cpu-offload-gb": "cpu_offload_gb",
}
_BOOL_PINS: Final = {
    "enforce-eager": "enforce_eager",
    "enable-chunked-prefill": "enable_chunked_prefill",
}
_TEXT_PINS: Final = {
    "kv-cache-dtype": "kv_cache_dtype",
    "dtype": "dtype",
    "quantization": "quantization",
}


def read_overrides(overrides: Mapping[str, str]) -> Pins:
    """The overrides that change what fits, read into typed values."""
    values: dict[str, Any] = {}
    unreadable: list[str] = []
    for key, raw in overrides.items():
        if key in _INT_PINS:
            number = parse_human_int(raw)
            if number is None or number < 1:
                unreadable.append(key)
            else:
                values[_INT_PINS[key]] = number
        elif key in _FLOAT_PINS:
            real = _parse_float(raw)
            if real is None or real < 0 or (key == "gpu-memory-utilization" and real > 1):
                unreadable.append(key)
            else:
                values[_FLOAT_PINS[key]] = real
        elif key in _BOOL_PINS:
            flag = _parse_bool(raw)
            if flag is None:
                unreadable.append(key)
            else:
                values[_BOOL_PINS[key]] = flag
        elif key in _TEXT_PINS:
            values[_TEXT_PINS[key]] = raw.strip()
    return dataclasses.replace(Pins(), **values, unreadable=tuple(sorted(unreadable)))


def apply_overrides(proposed: Sequence[Setting], overrides: Mapping[str, str]) -> list[Setting]:
    """The final arguments: ``proposed`` with every override in force, marked ``Override``.

    Overridden arguments keep their place; overrides the tuner did not propose follow in
    name order. Each override's reason records what the tuner would have chosen.
    """
    result: list[Setting] = []
    for setting in proposed:
        if setting.name not in overrides:
            result.append(setting)
            continue
        reason = (
            setting.reason
            if setting.source == "Override"  # planned around the pinned value already
            else f"set in spec.tuning.overrides; the tuner would choose {setting.value} "
            f"({setting.reason})"
        )
        result.append(Setting(setting.name, overrides[setting.name], "Override", reason))
    proposed_names = {s.name for s in proposed}
    for name in sorted(set(overrides) - proposed_names):
        result.append(
            Setting(
                name=name,
                value=overrides[name],
                source="Override",
                reason="set in spec.tuning.overrides; the tuner has no opinion on it",
            )
        )
    return result
