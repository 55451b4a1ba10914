"""The status is computed whole, and written only when it changed in a way that matters."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from devenv.fakes import answer_sets
from vllm_operator.agent.readings import NvmlCallError, NvmlSnapshot
from vllm_operator.agent.status import compute_status, needs_write, stable_view
from vllm_operator.models.gpu_node import GPUNodeStatus

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
REFRESH = timedelta(minutes=5)


def status_of(
    snapshot: NvmlSnapshot | None = None,
    previous: GPUNodeStatus | None = None,
    now: datetime = T0,
) -> GPUNodeStatus:
    return compute_status(
        snapshot=snapshot or answer_sets.capped_300w_of_450w(),
        nvml_error=None,
        previous=previous,
        power_records=[],
        power_fact=None,
        bandwidth=None,
        generation=1,
        now=now,
    )


def test_a_first_status_is_always_written() -> None:
    assert needs_write(status_of(), None, written_at=None, now=T0, refresh=REFRESH)


def test_the_gpu_count_is_in_the_status_for_kubectls_column() -> None:
    """The GPUs column printed the first GPU's index (0 for an 8-GPU node)."""
    status = status_of()
    assert status.gpu_count == len(status.gpus) > 0
    assert status.to_wire()["gpuCount"] == len(status.gpus)


def test_temperature_draw_and_current_clocks_alone_wait_for_the_refresh() -> None:
    first = status_of()
    snap = answer_sets.capped_300w_of_450w()
    moved = replace(snap.devices[0], temperature_c=80, power_usage_mw=1000, clock_sm_mhz=900)
    later = T0 + timedelta(seconds=30)
    second = status_of(replace(snap, devices=(moved,)), first, later)
    assert stable_view(second) == stable_view(first)
    assert not needs_write(second, first, written_at=T0, now=later, refresh=REFRESH)
    assert needs_write(second, first, written_at=T0, now=T0 + REFRESH, refresh=REFRESH)


def test_a_changed_limit_is_written_at_once() -> None:
    first = status_of()
    snap = answer_sets.capped_300w_of_450w()
    lifted = replace(snap.devices[0], power_limit_mw=450000, enforced_power_limit_mw=450000)
    later = T0 + timedelta(seconds=30)
    second = status_of(replace(snap, devices=(lifted,)), first, later)
    assert needs_write(second, first, written_at=T0, now=later, refresh=REFRESH)


def test_nvml_failing_keeps_the_inventory_and_its_time() -> None:
    first = status_of()
    later = T0 + timedelta(minutes=1)
    failed = compute_status(
        snapshot=None,
        nvml_error=NvmlCallError("GpuLost", "GPU is lost"),
        previous=first,
        power_records=None,
        power_fact=None,
        bandwidth=None,
        generation=1,
        now=later,
    )
    assert failed.gpus == first.gpus
    assert failed.last_updated == T0
    ready = next(c for c in failed.conditions if c.type == "Ready")
    assert (ready.status, ready.reason, ready.last_transition_time) == ("False", "GpuLost", later)
    assert needs_write(failed, first, written_at=T0, now=later, refresh=REFRESH)
