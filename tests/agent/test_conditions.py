"""Conditions for the field's classic faults, and their transition times."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from devenv.fakes import answer_sets
from vllm_operator.agent import conditions as cond
from vllm_operator.models.gpu_node import AppliedPower

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
T1 = datetime(2026, 11, 29, 12, 5, tzinfo=UTC)


def test_a_450_w_card_capped_at_300_w_is_power_capped_with_both_values() -> None:
    fact = cond.power_capped(answer_sets.capped_300w_of_450w().devices)
    assert (fact.status, fact.reason) == ("True", "LimitBelowDefault")
    assert "limit 300 W, default 450 W" in fact.message


def test_a_cap_the_agent_set_itself_says_so() -> None:
    device = answer_sets.capped_300w_of_450w().devices[0]
    ours = AppliedPower(uuid=device.uuid, original_watts=450, applied_watts=300)
    assert cond.power_capped([device], [ours]).reason == "CappedByPowerPolicy"


def test_cards_at_their_default_are_not_power_capped() -> None:
    assert cond.power_capped(answer_sets.rtx4090x2_phb().devices).status == "False"


def test_a_x8_link_in_a_x16_slot_is_degraded() -> None:
    fact = cond.link_degraded(answer_sets.x8_in_x16_slot().devices)
    assert (fact.status, fact.reason) == ("True", "PCIeWidthReduced")
    assert "x8 of x16" in fact.message


def test_an_idle_gpu_at_a_lower_pcie_generation_is_saving_power_not_degraded() -> None:
    devices = answer_sets.rtx4090x2_phb().devices
    assert devices[0].pcie_generation == 1 and devices[0].pcie_max_generation == 4
    assert cond.link_degraded(devices).status == "False"


def test_a_busy_gpu_at_a_lower_pcie_generation_is_degraded() -> None:
    busy = replace(answer_sets.rtx4090x2_phb().devices[0], clock_event_reasons=0)
    fact = cond.link_degraded([busy])
    assert (fact.status, fact.reason) == ("True", "PCIeGenerationReduced")
    assert "gen 1 of gen 4" in fact.message


def test_clocks_held_by_the_power_cap_are_throttled() -> None:
    fact = cond.clocks_throttled(answer_sets.capped_300w_of_450w().devices)
    assert (fact.status, fact.reason) == ("True", "SwPowerCap")


def test_the_most_severe_throttle_names_the_reason() -> None:
    hot = replace(answer_sets.x8_in_x16_slot().devices[0], clock_event_reasons=0x4 | 0x40)
    assert cond.clocks_throttled([hot]).reason == "HwThermalSlowdown"


def test_idle_clocks_are_not_throttled() -> None:
    assert cond.clocks_throttled(answer_sets.h100x8_nvlink().devices).status == "False"


def test_no_gpus_is_not_ready() -> None:
    assert cond.ready([], None).reason == "NoGPUs"
    assert cond.ready([], ("NvmlUnavailable", "gone")).status == "False"


def test_a_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    first = cond.merge([], [cond.Fact("Ready", "True", "A", "a")], now=T0, generation=1)
    again = cond.merge(first, [cond.Fact("Ready", "True", "B", "b")], now=T1, generation=2)
    flipped = cond.merge(again, [cond.Fact("Ready", "False", "C", "c")], now=T1, generation=2)
    assert again[0].last_transition_time == T0
    assert (again[0].reason, again[0].observed_generation) == ("B", 2)
    assert flipped[0].last_transition_time == T1
