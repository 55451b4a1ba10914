"""Each release's arguments (the table read from vLLM's own source) and the checks made
with them: overrides by name, type, choice and range; the spelling of a switch's off."""

from __future__ import annotations

import pytest

from vllm_operator.releases.arguments import (
    arguments_for,
    override_problems,
    quantization_spelling,
    release_flags,
    releases,
)
from vllm_operator.releases.version import TESTED_VERSION, Version
from vllm_operator.tuning.args import Setting

V = Version.parse


def _args(version: str):  # type: ignore[no-untyped-def]
    table = arguments_for(V(version)).arguments  # type: ignore[arg-type]
    assert table is not None
    return table


def test_the_table_spans_every_minor_release_from_0_10_to_the_tested_one_and_beyond() -> None:
    minors = {(v.major, v.minor) for v in releases()}
    assert {(0, m) for m in range(10, 34)} <= minors
    assert TESTED_VERSION in releases()


def test_a_patch_release_uses_its_minor_release_and_a_newer_one_the_newest_with_a_note() -> None:
    assert arguments_for(V("0.19.1")).arguments is arguments_for(V("0.19.0")).arguments
    newer = arguments_for(Version(9, 0, 0))
    assert newer.arguments is not None and newer.arguments.release == max(releases())
    assert newer.note is not None and "newer than the newest release" in newer.note
    older = arguments_for(V("0.9.2"))
    assert older.arguments is None and older.note is not None and "0.10.0" in older.note


def test_shutdown_timeout_exists_from_0_18() -> None:
    assert _args("0.17.0").get("shutdown-timeout") is None
    assert _args("0.18.0").get("shutdown-timeout") is not None
    assert _args(str(TESTED_VERSION)).get("shutdown-timeout") is not None


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"maxmodellen": "8192"}, "no argument --maxmodellen (did you mean max-model-len?)"),
        ({"gpu-memory-utilization": "1.5"}, "--gpu-memory-utilization must be"),
        ({"gpu-memory-utilization": "0"}, "--gpu-memory-utilization must be"),
        ({"tensor-parallel-size": "-2"}, "--tensor-parallel-size must be at least 1"),
        ({"max-num-seqs": "0"}, "--max-num-seqs must be at least 1"),
        ({"max-num-seqs": "many"}, "--max-num-seqs takes an integer, not 'many'"),
        ({"max-model-len": "true"}, "takes a value"),
        ({"enforce-eager": "4"}, "takes no value"),
        ({"kv-cache-dtype": "fp9"}, "not one of vLLM"),
    ],
)
def test_an_override_the_release_does_not_take_is_refused_naming_the_field(
    overrides: dict[str, str], expected: str
) -> None:
    [problem] = override_problems(overrides, _args(str(TESTED_VERSION)))
    name = next(iter(overrides))
    assert problem.startswith(f"spec.tuning.overrides.{name}: "), problem
    assert expected in problem, problem


@pytest.mark.parametrize(
    "overrides",
    [
        {"max-model-len": "32k"},
        {"max-model-len": "auto"},
        {"gpu-memory-utilization": "0.9"},
        {"enforce-eager": "true"},
        {"enforce-eager": "false"},
        {"enable-prefix-caching": "false"},
        {"max-logprobs": "0"},
        {"kv-cache-dtype": "fp8"},
        {"max-num-seqs": "64"},
        {"device-memory-utilization": "0.8"},
    ],
)
def test_overrides_the_release_takes_pass(overrides: dict[str, str]) -> None:
    assert override_problems(overrides, _args(str(TESTED_VERSION))) == []


def test_the_cli_names_its_flag_instead_of_the_field() -> None:
    [problem] = override_problems(
        {"maxmodellen": "1"}, _args(str(TESTED_VERSION)), where="--set {name}"
    )
    assert problem.startswith("--set maxmodellen: ")


def test_a_switch_is_turned_off_in_the_spelling_of_the_release() -> None:
    off = [Setting("enable-prefix-caching", "false", "Tuner", "x")]
    spelled = release_flags(off, str(TESTED_VERSION))
    assert spelled == [f"--{_args(str(TESTED_VERSION)).get('enable-prefix-caching').negation}"]  # type: ignore[union-attr]
    eager = release_flags([Setting("enforce-eager", "false", "Tuner", "x")], None)
    assert eager == ["--no-enforce-eager"]


def test_0_33_turns_a_switch_off_with_disable_and_still_takes_the_old_spelling() -> None:
    off = [Setting("enable-prefix-caching", "false", "Tuner", "x")]
    assert release_flags(off, "0.33.0") == ["--disable-prefix-caching"]
    assert release_flags(off, "0.32.0") == ["--no-enable-prefix-caching"]
    assert override_problems({"no-enable-prefix-caching": "true"}, _args("0.33.0")) == []


def test_quantization_methods_are_the_releases_own() -> None:
    """mxfp4 (gpt-oss) is a method from 0.11; gguf went in 0.24."""
    [problem] = override_problems({"quantization": "mxfp4"}, _args("0.10.0"))
    assert "'mxfp4' is not one of vLLM 0.10.0's choices for --quantization" in problem
    assert override_problems({"quantization": "mxfp4"}, _args("0.11.0")) == []
    assert override_problems({"quantization": "gguf"}, _args("0.23.0")) == []
    assert override_problems({"quantization": "gguf"}, _args("0.24.0")) != []


@pytest.mark.parametrize("value", ["9" * 5000, "1e999", "nan", "inf"])
def test_poison_numbers_are_refused_not_raised(value: str) -> None:
    """A number of thousands of digits made Python's int() raise inside the tuner."""
    args = _args(str(TESTED_VERSION))
    for name in ("max-num-seqs", "gpu-memory-utilization"):
        [problem] = override_problems({name: value}, args)
        assert problem.startswith(f"spec.tuning.overrides.{name}: ")


@pytest.mark.parametrize(
    ("method", "spelled"),
    [
        ("AWQ", "awq"),
        ("GPTQ", "gptq"),
        ("FP8", "fp8"),
        ("BitsAndBytes", "bitsandbytes"),
        ("GGUF", "gguf"),
        ("CompressedTensors", "compressed-tensors"),
        ("MXFP4", "mxfp4"),
    ],
)
def test_each_quantization_method_is_spelled_as_vllm_spells_it(method: str, spelled: str) -> None:
    """A choice of --quantization in the releases that offer the method: 0.28 on drop
    bitsandbytes and 0.24 on gguf from the choices (vLLM reads those from the model's
    config; the flag is then not rendered, and the plan says why), 0.10 lacks mxfp4."""
    assert quantization_spelling(method) == spelled  # type: ignore[arg-type]
    offered = []
    for version in releases():
        arguments = arguments_for(version).arguments
        assert arguments is not None
        flag = arguments.get("quantization")
        assert flag is not None and flag.choices is not None, version
        if spelled in flag.choices:
            offered.append(version)
    assert offered, f"no release takes --quantization {spelled}"
    if method not in ("BitsAndBytes", "GGUF"):
        assert TESTED_VERSION in offered
