"""Probe results: timed copies -> GB/s on the status, beside what the hardware should do."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from devenv.fakes import answer_sets
from vllm_operator.agent.probe import (
    Measurement,
    ProbeRun,
    gigabytes_per_second,
    memory_bandwidth,
    probe_status,
    results,
)
from vllm_operator.agent.topology import links

GIB = 1024**3


def test_a_device_copy_counts_bytes_read_and_written() -> None:
    # 10 copies of 1 GiB in 5 ms: 10.7 GB moved each way, 4295 GB/s read plus write.
    m = Measurement("DeviceCopy", 0, 0, GIB, 10, 0.005)
    assert gigabytes_per_second(m) == pytest.approx(2 * 10 * GIB / 0.005 / 1e9)


def test_host_and_peer_copies_count_bytes_once() -> None:
    m = Measurement("HostToDevice", None, 0, GIB, 10, 0.2)
    assert gigabytes_per_second(m) == pytest.approx(10 * GIB / 0.2 / 1e9)


def test_eight_h100_results_come_with_hbm_pcie_and_nvlink_expectations() -> None:
    snapshot = answer_sets.h100x8_nvlink()
    run = ProbeRun(
        measurements=(
            Measurement("DeviceCopy", 0, 0, GIB, 10, 0.0072),
            Measurement("HostToDevice", None, 3, 256 * 2**20, 10, 0.05),
            Measurement("DeviceToHost", 3, None, 256 * 2**20, 10, 0.05),
            Measurement("PeerToPeer", 0, 7, 512 * 2**20, 10, 0.0140),
        )
    )
    got = {(r.kind, r.source): r for r in results(run, snapshot, links(snapshot))}
    copy = got[("DeviceCopy", "gpu0")]
    assert copy.expected_gigabytes_per_second == 3350.0
    assert copy.gigabytes_per_second == pytest.approx(2982.6, abs=0.1)
    assert got[("HostToDevice", "host->gpu3")].expected_gigabytes_per_second == 63.0
    assert got[("DeviceToHost", "gpu3->host")].expected_gigabytes_per_second == 63.0
    # 18 NVLink 4.0 links at 25 GB/s each way.
    assert got[("PeerToPeer", "gpu0->gpu7")].expected_gigabytes_per_second == 450.0


def test_a_phb_pair_expects_the_pcie_link_not_nvlink() -> None:
    snapshot = answer_sets.rtx4090x2_phb()
    run = ProbeRun(measurements=(Measurement("PeerToPeer", 0, 1, 2**29, 10, 0.25),))
    (result,) = results(run, snapshot, links(snapshot))
    assert result.expected_gigabytes_per_second == 31.5  # gen 4 x16
    assert result.gigabytes_per_second == pytest.approx(21.5, abs=0.1)


def test_a_degraded_link_is_measured_against_what_the_slot_allows() -> None:
    snapshot = answer_sets.x8_in_x16_slot()
    run = ProbeRun(measurements=(Measurement("HostToDevice", None, 0, 2**28, 10, 0.2),))
    (result,) = results(run, snapshot, links(snapshot))
    assert result.expected_gigabytes_per_second == 31.5  # x16, although it runs at x8


def test_products_not_in_the_table_expect_bus_width_times_memory_clock() -> None:
    card = replace(answer_sets.x8_in_x16_slot().devices[0], name="NVIDIA Future Card")
    assert memory_bandwidth(card) == pytest.approx(384 / 8 * 10501 * 2 / 1000)


@pytest.mark.parametrize(
    ("name", "rate"),
    [
        ("NVIDIA H200", 4800.0),
        ("NVIDIA H100 80GB HBM3", 3350.0),
        ("NVIDIA H100 PCIe", 2000.0),
        ("NVIDIA H100 NVL", 3900.0),
        ("NVIDIA A100-SXM4-80GB", 2039.0),
        ("NVIDIA A100 80GB PCIe", 1935.0),
        ("NVIDIA A100-SXM4-40GB", 1555.0),
        ("NVIDIA L40S", 864.0),
        ("NVIDIA L4", 300.0),
        ("NVIDIA GeForce RTX 4090", 1008.0),
    ],
)
def test_memory_bandwidth_by_product(name: str, rate: float) -> None:
    card = replace(answer_sets.x8_in_x16_slot().devices[0], name=name)
    assert memory_bandwidth(card) == rate


def test_the_probe_status_answers_its_request_and_keeps_errors() -> None:
    snapshot = answer_sets.rtx4090x2_phb()
    when = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    run = ProbeRun(
        measurements=(Measurement("DeviceCopy", 1, 1, GIB, 10, 0.025),),
        errors=("gpu0 device copy: too little free GPU memory (512 MiB) for the probe",),
    )
    status = probe_status("r1", run, snapshot, links(snapshot), measured_at=when)
    assert status.request_id == "r1"
    assert status.measured_at == when
    assert [r.source for r in status.results] == ["gpu1"]
    assert status.error is not None and "too little free GPU memory" in status.error
