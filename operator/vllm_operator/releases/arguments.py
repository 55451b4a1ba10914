"""The arguments ``vllm serve`` accepts in each vLLM release, and the checks made with
them: a flag the operator renders, and every ``spec.tuning.overrides`` entry, must be an
argument of the release deployed, with a value that release takes.

The table (``vllm_flags.json`` beside this module) is read from each release's own source
by ``scripts/vllm_flags.py`` (docs/vllm-flags.md says how); a release between two in the
table uses the one before it (patch releases add no flags). The value ranges below are
ours, each from the check vLLM itself makes when it builds its config (cited), since
argparse alone lets ``--gpu-memory-utilization 1.5`` through and vLLM fails at start.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from vllm_operator.models.inference_service import NamedValue, QuantizationMethod, command_flags
from vllm_operator.releases.version import TESTED_VERSION, Version

TABLE: Final = Path(__file__).parent / "vllm_flags.json"

# argparse actions that take no value (vLLM's own EnableDisableAction among them: nargs 0).
_NO_VALUE: Final = {
    "store_true",
    "store_false",
    "store_const",
    "_StoreTrueAction",
    "_StoreFalseAction",
    "BooleanOptionalAction",
    "EnableDisableAction",
    "StoreBoolean",
}


# (lowest, highest, lowest allowed itself). From vLLM's config checks: CacheConfig
# (gpu_memory_utilization in (0, 1], swap_space and cpu_offload_gb >= 0), ParallelConfig
# (every parallel size >= 1), SchedulerConfig (max_num_seqs, max_num_batched_tokens >= 1),
# ModelConfig (max_model_len >= 1), LoRAConfig (max_loras, max_lora_rank >= 1).
RANGES: Final[Mapping[str, tuple[float | None, float | None, bool]]] = {
    "gpu-memory-utilization": (0.0, 1.0, False),
    "tensor-parallel-size": (1, None, True),
    "pipeline-parallel-size": (1, None, True),
    "data-parallel-size": (1, None, True),
    "max-num-seqs": (1, None, True),
    "max-num-batched-tokens": (1, None, True),
    "max-model-len": (1, None, True),
    "block-size": (1, None, True),
    "swap-space": (0.0, None, True),
    "cpu-offload-gb": (0.0, None, True),
    "max-loras": (1, None, True),
    "max-lora-rank": (1, None, True),
    "max-cpu-loras": (1, None, True),
    "max-logprobs": (0, None, True),
    "kv-cache-memory-bytes": (1, None, True),
}


@dataclass(frozen=True)
class Flag:
    """One argument of one release, as its parser declares it."""

    name: str  # without the leading dashes
    action: str
    type: str | None = None
    choices: tuple[str, ...] | None = None
    nargs: str | int | None = None
    deprecated: bool = False
    # The spelling that turns a switch off in this release (no-enforce-eager,
    # disable-prefix-caching), when it has one.
    negation: str | None = None
    # Its default as an override spells it ('true', 'false', '0.92', 'auto'); None where the
    # parser has none (vLLM decides at start, from the model and the hardware).
    default: str | None = None

    @property
    def takes_value(self) -> bool:
        return self.nargs != 0 and self.action not in _NO_VALUE

    @property
    def negatable(self) -> bool:
        return self.negation is not None

    @property
    def integer(self) -> bool:
        return self.type is not None and "int" in self.type

    @property
    def real(self) -> bool:
        return self.type is not None and "float" in self.type


@dataclass(frozen=True, eq=False)
class Arguments:
    """The arguments of one release of the table."""

    release: Version
    flags: Mapping[str, Flag]

    def get(self, name: str) -> Flag | None:
        return self.flags.get(name)

    @functools.cached_property
    def negations(self) -> dict[str, str]:
        return {n: f.negation for n, f in self.flags.items() if f.negation is not None}

    def nearest(self, name: str) -> str | None:
        close = difflib.get_close_matches(name, list(self.flags), n=1, cutoff=0.6)
        return close[0] if close else None


# The API's spec.model.quantization.method in vLLM's spelling of --quantization: lower
# case, except these two. Not every release offers each (tests/releases/test_arguments.py);
# where one does not, the flag is left out and the plan says why.
_QUANTIZATION_SPELLING: Final[dict[str, str]] = {
    "BitsAndBytes": "bitsandbytes",
    "CompressedTensors": "compressed-tensors",
}


def quantization_spelling(method: QuantizationMethod) -> str:
    """``--quantization``'s value for the API's quantization method."""
    return _QUANTIZATION_SPELLING.get(method, method.lower())


def _negation(name: str, entry: Mapping[str, Any]) -> str | None:
    aliases = [str(a).lstrip("-") for a in entry.get("aliases") or () if str(a).startswith("--")]
    if entry.get("action") == "BooleanOptionalAction":
        return f"no-{name}"
    for alias in aliases:
        if alias == f"no-{name}" or (
            name.startswith("enable-") and alias == "disable-" + name.removeprefix("enable-")
        ):
            return alias
    return None


def _flag(option: str, entry: Mapping[str, Any]) -> Flag:
    name = option.lstrip("-")
    choices = entry.get("choices")
    nargs = entry.get("nargs")
    return Flag(
        name=name,
        action=str(entry.get("action") or "store"),
        type=entry.get("type"),
        choices=tuple(str(c) for c in choices) if choices else None,
        nargs=nargs if isinstance(nargs, int | str) else None,
        deprecated=bool(entry.get("deprecated")),
        negation=_negation(name, entry),
        default=_default(entry.get("default")),
    )


def _default(value: Any) -> str | None:
    """A parser default as an override spells it; None for none, or a list or mapping."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"{value:g}" if isinstance(value, float) else str(value)
    if isinstance(value, str) and value:
        return value
    return None


@functools.cache
def _table() -> dict[Version, Arguments]:
    data = json.loads(TABLE.read_text())
    table: dict[Version, Arguments] = {}
    for text, release in data["versions"].items():
        version = Version.parse(text)
        assert version is not None, text
        flags: dict[str, Flag] = {}
        # Values vLLM checks after parsing (the --quantization methods of its registry):
        # to an override they are choices all the same.
        values = release.get("values") or {}
        for option, entry in release["flags"].items():
            if not entry.get("choices") and values.get(option):
                entry = {**entry, "choices": values[option]}
            flag = _flag(option, entry)
            flags[flag.name] = flag
        # Other spellings of a flag (--device-memory-utilization) are names too; a
        # negation (--no-enforce-eager) is reached through its flag, not on its own.
        for option, entry in release["flags"].items():
            flag = flags[option.lstrip("-")]
            for alias in [*(entry.get("aliases") or ()), *(entry.get("hidden_aliases") or ())]:
                short = alias.lstrip("-")
                if alias.startswith("--") and short != flag.negation and short not in flags:
                    flags[short] = flag
        table[version] = Arguments(version, flags)
    return dict(sorted(table.items()))


def releases() -> list[Version]:
    """The releases the table holds, oldest first."""
    return list(_table())


@dataclass(frozen=True)
class ReleaseArguments:
    """The arguments a deployed version is checked against, or why there are none."""

    arguments: Arguments | None
    note: str | None = None


def arguments_for(version: Version) -> ReleaseArguments:
    """The table's release for ``version``: the newest one not after it. A version older
    than the table has none (the operator does not deploy it); one newer than the table
    is checked against the newest release, and the note says so."""
    table = _table()
    known = [v for v in table if v <= version]
    if not known:
        return ReleaseArguments(
            None,
            f"vLLM {version} is older than the oldest release the operator supports "
            f"({min(table)}); use vLLM {min(table)} or newer, or set spec.vllmVersion to the "
            "version the image runs.",
        )
    release = known[-1]
    newest = max(table)
    note = None
    if version.minor_release > newest:
        note = (
            f"vLLM {version} is newer than the newest release the operator knows ({newest}); "
            f"its arguments are checked against {newest}'s."
        )
    return ReleaseArguments(table[release], note)


_HUMAN_INT: Final = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)")
_MAX_DIGITS: Final = 30
_DECIMAL: Final = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY: Final = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_human_int(text: str) -> int | None:
    """An integer as vLLM's ``human_readable_int`` reads it (``32k`` is 32,000 and ``32K``
    32,768); None when it is not one. Hand-written: the pure layers cannot import vLLM."""
    match = _HUMAN_INT.fullmatch(text.strip())
    if match is None or len(text) > _MAX_DIGITS:
        return None  # Python refuses to read integers of thousands of digits anyway
    number, suffix = match.groups()
    if not suffix:
        return int(number) if number.isdigit() else None
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if not number.isdigit():  # vLLM refuses decimals with binary suffixes
        return None
    return int(number) * _BINARY[suffix]


def _number(flag: Flag, text: str) -> float | None:
    if flag.integer:
        stripped = text.strip()
        value = parse_human_int(stripped.lstrip("-"))
        if value is None:
            return None
        return -value if stripped.startswith("-") else value
    try:
        real = float(text)
    except ValueError:
        return None
    return real if math.isfinite(real) else None


def _bounds(name: str) -> str:
    low, high, low_ok = RANGES[name]
    lower = f"at least {low:g}" if low_ok else f"greater than {low:g}"
    return f"{lower} and at most {high:g}" if high is not None else lower


def value_problem(flag: Flag, value: str, release: Version) -> str | None:
    """Why ``value`` is not one ``flag`` takes in ``release``; None when it is."""
    text = value.strip()
    if not flag.takes_value:
        if text == "true" or (text == "false" and flag.negatable):
            return None
        if text == "false":
            return (
                f"vLLM {release}'s --{flag.name} cannot be negated: set 'true' or remove "
                "the override"
            )
        return f"vLLM {release}'s --{flag.name} takes no value: set 'true' or 'false'"
    if text in ("true", "false") and (flag.integer or flag.real):
        return f"vLLM {release}'s --{flag.name} takes a value, not {text!r}"
    if flag.choices is not None and text not in flag.choices:
        shown = ", ".join(flag.choices[:12])
        more = f" and {len(flag.choices) - 12} more" if len(flag.choices) > 12 else ""
        return f"{text!r} is not one of vLLM {release}'s choices for --{flag.name}: {shown}{more}"
    numeric = flag.integer or flag.real or flag.name in RANGES
    if not numeric:
        return None
    if flag.type is not None and "or_auto" in flag.type and text in ("auto", "-1"):
        return None  # vLLM picks the largest that fits
    number = _number(flag, text)
    if number is None:
        kind = "an integer" if flag.integer else "a number"
        return f"--{flag.name} takes {kind}, not {text!r}"
    if flag.name in RANGES:
        low, high, low_ok = RANGES[flag.name]
        if (low is not None and (number < low or (number == low and not low_ok))) or (
            high is not None and number > high
        ):
            return f"--{flag.name} must be {_bounds(flag.name)}, not {text}"
    return None


def override_problems(
    overrides: Mapping[str, str],
    arguments: Arguments,
    *,
    where: str = "spec.tuning.overrides.{name}",
) -> list[str]:
    """One sentence per override that is not an argument of the release or whose value
    that release does not take, each naming the field (``where``, formatted with the
    override's name: the spec's field, or the command line's ``--set NAME``)."""
    problems: list[str] = []
    for name in sorted(overrides):
        field = where.format(name=name)
        flag = arguments.get(name)
        if flag is None:
            near = arguments.nearest(name)
            hint = f" (did you mean {near}?)" if near else ""
            problems.append(f"{field}: vLLM {arguments.release} has no argument --{name}{hint}")
            continue
        why = value_problem(flag, overrides[name], arguments.release)
        if why is not None:
            problems.append(f"{field}: {why}")
    return problems


def release_flags(arguments: Iterable[NamedValue], version: str | None) -> list[str]:
    """The command-line flags of ``arguments`` as the release ``version`` spells them
    (the tested release when the version is not known)."""
    known = Version.parse(version or "") or TESTED_VERSION
    table = arguments_for(known).arguments
    return command_flags(arguments, table.negations if table is not None else None)


def command_values(argv: Iterable[str], version: Version | None = None) -> dict[str, str]:
    """The flags of a ``vllm serve`` command line as name → value, the inverse of
    :func:`~vllm_operator.models.inference_service.command_flags`: a switch ``true``, its
    negation (``--no-enforce-eager``, ``--disable-log-requests``'s kin) ``false``, any
    other flag its value, ``--name=value`` and ``--name value`` alike; an alias under its
    flag's name. Only the release's own arguments are read (``version``: the tested
    release when None): a positional (the model), an unknown flag and the value after it
    are skipped, as are the leading ``serve``."""
    table = arguments_for(version or TESTED_VERSION).arguments
    flags = table.flags if table is not None else {}
    negated = {negation: name for name, negation in (table.negations if table else {}).items()}
    tokens = list(argv)
    values: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--"):
            continue
        name, sep, inline = token[2:].partition("=")
        if name in negated:
            values[negated[name]] = "false"
            continue
        flag = flags.get(name)
        if flag is None:
            continue
        if not flag.takes_value:
            values[flag.name] = "true" if not sep else inline
        elif sep:
            values[flag.name] = inline
        elif i < len(tokens) and not tokens[i].startswith("--"):
            values[flag.name] = tokens[i]
            i += 1
        else:
            values[flag.name] = ""
    return dict(sorted(values.items()))
