"""devenv.pytest_tiers: the per-tier summary line, from a real pytest run of a small suite."""

from __future__ import annotations

import pytest

from devenv.pytest_tiers import tier_of

pytest_plugins = ["pytester"]

SUITE = """
import pytest

def test_unit_passes():
    pass

def test_unit_fails():
    assert False

@pytest.mark.vllm
def test_vllm_skips():
    pytest.skip("no vLLM")

@pytest.mark.cluster
def test_cluster_passes():
    pass

@pytest.fixture
def broken():
    yield
    raise RuntimeError("teardown")

@pytest.mark.cluster
def test_cluster_fails_in_teardown(broken):
    pass
"""


def test_one_line_per_tier_with_its_counts(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
        "markers =\n  vllm: x\n  cluster: x\n  timing: x\n"
    )
    pytester.makepyfile(SUITE)
    # A folder named like a marker holds no test of that tier by its name alone.
    pytester.mkpydir("vllm").joinpath("test_in_folder.py").write_text("def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "devenv.pytest_tiers")
    lines = [line for line in result.outlines if line.startswith("== tier ")]
    assert [line.split(";")[0] for line in lines] == [
        "== tier unit - 2 passed, 1 failed, 0 skipped",
        "== tier vllm - 0 passed, 0 failed, 1 skipped",
        "== tier cluster - 1 passed, 1 failed, 0 skipped",
    ]
    assert all(line.endswith(" s") for line in lines)
    # One line per module of the tiers other than unit; the tests here share one module.
    modules = [line for line in result.outlines if line.startswith("== module ")]
    assert sorted(line.split(";")[0] for line in modules) == [
        "== module test_one_line_per_tier_with_its_counts.py (cluster) - 2 tests",
        "== module test_one_line_per_tier_with_its_counts.py (vllm) - 1 tests",
    ], modules
    seconds = [float(line.rsplit(";", 1)[1].removesuffix(" s")) for line in modules]
    assert seconds == sorted(seconds, reverse=True), modules  # the slowest first


@pytest.mark.parametrize(
    ("keywords", "tier"),
    [
        (set(), "unit"),
        ({"parametrize"}, "unit"),
        ({"vllm"}, "vllm"),
        ({"cluster", "vllm"}, "cluster"),
        ({"timing", "vllm"}, "timing"),
    ],
)
def test_tier_of(keywords: set[str], tier: str) -> None:
    assert tier_of(keywords) == tier
