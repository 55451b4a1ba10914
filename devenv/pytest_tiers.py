"""A pytest plugin: one summary line per test tier after every run.

``make test`` runs the unit tier in one pytest process (on pytest-xdist workers: the
reports reach this plugin in the controlling process), the real-vLLM and cluster tiers in
a second and the timing tier in a third; CI's log then shows, per tier, how many tests
passed, failed and were skipped and the seconds they took (setup, call and teardown added
up), so a tier that skipped or slowed down is seen at a glance; and for every tier but
the unit one (whose time is spread over workers), one line per test module, the slowest
first, so that CI's budget can be spent where it goes. A session fixture's setup (the
cluster's start) counts in the module of the first test that asks for it. Registered in
pyproject.toml (``-p``).

A test's tier is its marker: ``timing``, ``cluster`` (every test under e2e/), ``vllm``,
else ``unit``. Markers, not keywords: a test's keywords hold its folders' names too, and
tests/vllm/ holds unit tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

import pytest

TIERS = ("unit", "vllm", "cluster", "timing")
K = TypeVar("K", bound=Hashable)


def tier_of(markers: Iterable[str]) -> str:
    words = set(markers)
    for tier in ("timing", "cluster", "vllm"):
        if tier in words:
            return tier
    return "unit"


@dataclasses.dataclass
class Tally:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0


@dataclasses.dataclass
class _Test:
    tier: str
    module: str = ""
    outcome: str = "passed"
    seconds: float = 0.0


class TierSummary:
    def __init__(self) -> None:
        self.tests: dict[str, _Test] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> None:
        # After collection, so the markers conftests add (e2e/: cluster) are there.
        self.tests[item.nodeid] = _Test(
            tier_of(m.name for m in item.iter_markers()), item.nodeid.split("::")[0]
        )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        test = self.tests.setdefault(report.nodeid, _Test("unit"))
        test.seconds += report.duration
        if report.failed:
            test.outcome = "failed"
        elif report.skipped and test.outcome != "failed":
            test.outcome = "skipped"

    def _tally_by(self, key: Callable[[_Test], K | None]) -> dict[K, Tally]:
        """The tests counted and their seconds added up per ``key`` (None: left out)."""
        out: dict[K, Tally] = {}
        for test in self.tests.values():
            group = key(test)
            if group is None:
                continue
            tally = out.setdefault(group, Tally())
            setattr(tally, test.outcome, getattr(tally, test.outcome) + 1)
            tally.seconds += test.seconds
        return out

    def tallies(self) -> dict[str, Tally]:
        out = self._tally_by(lambda test: test.tier)
        return {tier: out[tier] for tier in TIERS if tier in out}

    def lines(self) -> list[str]:
        return [
            f"== tier {tier} - {t.passed} passed, {t.failed} failed, {t.skipped} skipped; "
            f"{t.seconds:.0f} s"
            for tier, t in self.tallies().items()
        ]

    def module_lines(self) -> list[str]:
        modules = self._tally_by(
            lambda test: (test.tier, test.module) if test.tier != "unit" and test.module else None
        )
        ranked = sorted(modules.items(), key=lambda kv: -kv[1].seconds)
        return [
            f"== module {module} ({tier}) - {t.passed + t.failed + t.skipped} tests; "
            f"{t.seconds:.0f} s"
            for (tier, module), t in ranked
        ]

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        for line in [*self.lines(), *self.module_lines()]:
            terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TierSummary(), "vllm-operator-tier-summary")
