"""Power policy decisions: observed limits + policy + records -> set-calls, records, condition."""

from __future__ import annotations

from dataclasses import replace

import pytest

from devenv.fakes import answer_sets
from vllm_operator.agent.power import outcome, plan
from vllm_operator.agent.readings import DeviceReading, NvmlCallError
from vllm_operator.models.gpu_node import AppliedPower, PowerSpec

CAPPED = answer_sets.capped_300w_of_450w().devices  # 300 W of 450 W default, 150-600 W
UUID = CAPPED[0].uuid


def at(watts: int, device: DeviceReading = CAPPED[0]) -> DeviceReading:
    return replace(device, power_limit_mw=watts * 1000, enforced_power_limit_mw=watts * 1000)


def calls(
    spec: PowerSpec,
    devices: list[DeviceReading] | tuple[DeviceReading, ...],
    recorded: list[AppliedPower] | None = None,
    *,
    dry_run: bool = False,
) -> list[tuple[int, int, str]]:
    p = plan(spec, devices, recorded or [], dry_run=dry_run)
    return [(a.index, a.to_milliwatts, a.purpose) for a in p.actions]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (PowerSpec(policy="Default"), [(0, 450000, "Apply")]),
        (PowerSpec(policy="Max"), [(0, 600000, "Apply")]),
        (PowerSpec(policy="Watts", watts=400), [(0, 400000, "Apply")]),
        (PowerSpec(policy="Watts", watts=900), [(0, 600000, "Apply")]),
        (PowerSpec(policy="Watts", watts=100), [(0, 150000, "Apply")]),
        (PowerSpec(policy="Watts", watts=300), []),
        (PowerSpec(policy="Unmanaged"), []),
    ],
    ids=[
        "Default lifts the 300 W cap to the 450 W default",
        "Max lifts it to the 600 W maximum",
        "Watts 400 sets 400 W",
        "Watts above the maximum is clamped to 600 W",
        "Watts below the minimum is clamped to 150 W",
        "Watts equal to the present limit sets nothing",
        "Unmanaged with nothing recorded sets nothing",
    ],
)
def test_policies_decide_the_set_calls(
    spec: PowerSpec, expected: list[tuple[int, int, str]]
) -> None:
    assert calls(spec, CAPPED) == expected


def test_a_clamp_is_reported() -> None:
    p = plan(PowerSpec(policy="Watts", watts=900), CAPPED, [], dry_run=False)
    assert p.notes == ("GPU 0: 900 W is above the maximum 600 W; using 600 W",)
    _, fact = outcome(p, {})
    assert "using 600 W" in fact.message


def test_the_first_change_records_the_limit_found_as_the_original() -> None:
    p = plan(PowerSpec(policy="Default"), CAPPED, [], dry_run=False)
    records, fact = outcome(p, {})
    assert records == [AppliedPower(uuid=UUID, original_watts=300, applied_watts=450)]
    assert (fact.status, fact.reason) == ("True", "Applied")
    assert fact.message == "changed GPU 0 from 300 W to 450 W"


def test_a_later_policy_keeps_the_first_original() -> None:
    mine = AppliedPower(uuid=UUID, original_watts=300, applied_watts=450)
    p = plan(PowerSpec(policy="Max"), [at(450)], [mine], dry_run=False)
    records, _ = outcome(p, {})
    assert [(a.from_milliwatts, a.to_milliwatts) for a in p.actions] == [(450000, 600000)]
    assert records == [AppliedPower(uuid=UUID, original_watts=300, applied_watts=600)]


def test_a_limit_put_back_by_a_reboot_is_applied_again() -> None:
    mine = AppliedPower(uuid=UUID, original_watts=300, applied_watts=450)
    # After a reboot the board's own 300 W is back; the record still knows the original.
    assert calls(PowerSpec(policy="Default"), [at(300)], [mine]) == [(0, 450000, "Apply")]
    assert calls(PowerSpec(policy="Default"), [at(450)], [mine]) == []


def test_unmanaged_restores_the_original_and_forgets_it() -> None:
    mine = AppliedPower(uuid=UUID, original_watts=300, applied_watts=450)
    p = plan(PowerSpec(), [at(450)], [mine], dry_run=False)
    assert [(a.to_milliwatts, a.purpose) for a in p.actions] == [(300000, "Restore")]
    records, fact = outcome(p, {})
    assert records == []
    assert (fact.status, fact.reason) == ("True", "Restored")
    assert fact.message == "restored GPU 0 from 450 W to 300 W"


def test_unmanaged_forgets_an_original_already_in_place() -> None:
    mine = AppliedPower(uuid=UUID, original_watts=300, applied_watts=450)
    p = plan(PowerSpec(), [at(300)], [mine], dry_run=False)
    assert p.actions == ()
    assert outcome(p, {})[0] == []


def test_a_dry_run_reports_what_it_would_do() -> None:
    p = plan(PowerSpec(policy="Default"), CAPPED, [], dry_run=True)
    records, fact = outcome(p, {})
    assert [(a.to_milliwatts, a.purpose) for a in p.actions] == [(450000, "Apply")]
    assert records == [AppliedPower(uuid=UUID, original_watts=300, applied_watts=450, dry_run=True)]
    assert (fact.status, fact.reason) == ("False", "DryRun")
    assert fact.message == "dry run: would set GPU 0 from 300 W to 450 W"


def test_a_dry_run_never_rewrites_what_a_real_run_recorded() -> None:
    mine = AppliedPower(uuid=UUID, original_watts=300, applied_watts=450)
    p = plan(PowerSpec(policy="Max"), [at(450)], [mine], dry_run=True)
    assert outcome(p, {})[0] == [mine]
    restore = plan(PowerSpec(), [at(450)], [mine], dry_run=True)
    records, fact = outcome(restore, {})
    assert records == [mine]
    assert fact.message == "dry run: would restore GPU 0 from 450 W to 300 W"


def test_a_dry_runs_record_is_never_restored() -> None:
    theirs = AppliedPower(uuid=UUID, original_watts=300, applied_watts=450, dry_run=True)
    assert calls(PowerSpec(), [at(450)], [theirs]) == []


@pytest.mark.parametrize("reason", ["NoPermission", "OutOfRange", "NotSupported"])
def test_a_failed_set_is_a_condition_with_its_reason_and_changes_no_record(reason: str) -> None:
    p = plan(PowerSpec(policy="Default"), CAPPED, [], dry_run=False)
    records, fact = outcome(p, {0: NvmlCallError(reason, f"set failed: {reason}")})
    assert records == []
    assert (fact.status, fact.reason) == ("False", reason)
    assert "GPU 0: set failed" in fact.message


def test_a_failed_restore_keeps_the_original_for_the_next_try() -> None:
    mine = AppliedPower(uuid=UUID, original_watts=300, applied_watts=450)
    p = plan(PowerSpec(), [at(450)], [mine], dry_run=False)
    records, fact = outcome(p, {0: NvmlCallError("NoPermission", "no")})
    assert records == [mine]
    assert fact.reason == "NoPermission"


def test_a_gpu_gone_from_nvml_keeps_its_record() -> None:
    mine = AppliedPower(uuid="GPU-gone", original_watts=300, applied_watts=450)
    p = plan(PowerSpec(policy="Default"), CAPPED, [mine], dry_run=False)
    assert mine in p.records


def test_every_gpu_is_managed_on_a_multi_gpu_node() -> None:
    devices = answer_sets.h100x8_nvlink().devices
    assert calls(PowerSpec(policy="Watts", watts=500), devices) == [
        (i, 500000, "Apply") for i in range(8)
    ]


def test_a_gpu_without_readable_limits_is_left_as_found() -> None:
    blind = replace(CAPPED[0], power_limit_mw=None)
    p = plan(PowerSpec(policy="Max"), [blind], [], dry_run=False)
    assert p.actions == ()
    assert p.notes == ("GPU 0: power limit not readable; left as found",)
