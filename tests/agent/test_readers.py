"""The NVML boundary: the real adapter over a pynvml stand-in, the fixture reader, dry runs."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest

from devenv.fakes import answer_sets
from tests.agent.fake_pynvml import FakePynvml, nvml_names
from vllm_operator.agent.nvml import (
    SET_POWER_LIMIT_CALL,
    FixtureReader,
    PynvmlReader,
    ReadOnlyReader,
    classify,
    cpu_list,
    read_recorded_calls,
    sysfs_numa_node,
)
from vllm_operator.agent.readings import NvmlCallError, NvmlSnapshot, dump_snapshot

FIXTURES = answer_sets.FIXTURES


def test_the_stand_in_uses_only_names_the_real_pynvml_has() -> None:
    missing = [name for name in nvml_names() if not hasattr(pynvml, name)]
    assert missing == []


@pytest.mark.parametrize("name", sorted(answer_sets.ANSWER_SETS))
def test_the_real_adapter_reads_back_exactly_what_nvml_answered(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    snapshot = answer_sets.ANSWER_SETS[name]()
    monkeypatch.setitem(sys.modules, "pynvml", FakePynvml(snapshot))
    assert PynvmlReader(sysfs_pci=tmp_path).snapshot() == snapshot


def test_the_numa_node_falls_back_to_sysfs_when_nvml_does_not_support_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    snapshot = answer_sets.x8_in_x16_slot()
    device = snapshot.devices[0]
    blind = replace(snapshot, devices=(replace(device, numa_node=None),))
    (tmp_path / "0000:01:00.0").mkdir()
    (tmp_path / "0000:01:00.0" / "numa_node").write_text("1\n")
    monkeypatch.setitem(sys.modules, "pynvml", FakePynvml(blind))
    read = PynvmlReader(sysfs_pci=tmp_path).snapshot().devices[0]
    assert read.numa_node == 1
    assert read.errors["numa_node"] == "Not Supported (read from sysfs instead)"


def test_sysfs_minus_one_or_no_file_means_no_numa_node(tmp_path: Path) -> None:
    (tmp_path / "0000:00:06.0").mkdir()
    (tmp_path / "0000:00:06.0" / "numa_node").write_text("-1\n")
    assert sysfs_numa_node("00000000:00:06.0", tmp_path) is None
    assert sysfs_numa_node("00000000:00:07.0", tmp_path) is None


def test_a_missing_nvml_library_is_a_classified_error_not_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(
        sys.modules,
        "pynvml",
        FakePynvml(NvmlSnapshot(), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
    )
    with pytest.raises(NvmlCallError) as raised:
        PynvmlReader().snapshot()
    assert raised.value.reason == "NvmlUnavailable"


def test_the_real_adapter_sets_limits_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakePynvml(answer_sets.capped_300w_of_450w())
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    PynvmlReader().set_power_limit(0, 450000)
    assert fake.set_calls == [(0, 450000)]


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_NO_PERMISSION, "NoPermission"),
        (pynvml.NVML_ERROR_INVALID_ARGUMENT, "OutOfRange"),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, "NotSupported"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NvmlUnavailable"),
        (pynvml.NVML_ERROR_GPU_IS_LOST, "GpuLost"),
        (pynvml.NVML_ERROR_UNKNOWN, "NvmlError"),
    ],
)
def test_nvml_errors_are_classified_once_into_condition_reasons(code: int, reason: str) -> None:
    assert classify(pynvml.NVMLError(code)).reason == reason


def test_cpu_masks_become_cpu_numbers() -> None:
    assert cpu_list([0b1011, 1]) == (0, 1, 3, 64)


def test_the_fixture_reader_answers_from_the_file_and_records_set_calls(tmp_path: Path) -> None:
    record = tmp_path / "calls.jsonl"
    reader = FixtureReader(FIXTURES / "capped-300w-of-450w.yaml", record=record)
    assert reader.snapshot() == answer_sets.capped_300w_of_450w()
    reader.set_power_limit(0, 450000)
    assert reader.snapshot().devices[0].power_limit_mw == 450000
    assert read_recorded_calls(record) == [
        {
            "call": SET_POWER_LIMIT_CALL,
            "index": 0,
            "uuid": answer_sets.capped_300w_of_450w().devices[0].uuid,
            "milliwatts": 450000,
            "error": None,
        }
    ]


def test_the_fixture_reader_refuses_limits_out_of_range_as_nvml_does(tmp_path: Path) -> None:
    reader = FixtureReader(FIXTURES / "capped-300w-of-450w.yaml", record=tmp_path / "r")
    with pytest.raises(NvmlCallError) as raised:
        reader.set_power_limit(0, 900000)
    assert raised.value.reason == "OutOfRange"
    assert reader.snapshot().devices[0].power_limit_mw == 300000


def test_the_fixture_reader_reproduces_a_missing_permission(tmp_path: Path) -> None:
    reader = FixtureReader(FIXTURES / "no-permission.yaml")
    with pytest.raises(NvmlCallError) as raised:
        reader.set_power_limit(0, 450000)
    assert raised.value.reason == "NoPermission"


def test_the_fixture_reader_reproduces_missing_nvml() -> None:
    with pytest.raises(NvmlCallError) as raised:
        FixtureReader(FIXTURES / "nvml-unavailable.yaml").snapshot()
    assert raised.value.reason == "NvmlUnavailable"


def test_a_changed_fixture_file_reads_like_a_driver_reload(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    path.write_text(dump_snapshot(answer_sets.capped_300w_of_450w()))
    reader = FixtureReader(path)
    reader.set_power_limit(0, 450000)
    path.write_text(dump_snapshot(answer_sets.capped_300w_of_450w()))
    os.utime(path, (1, 1))  # surely a different mtime, however coarse the timestamps
    assert reader.snapshot().devices[0].power_limit_mw == 300000


def test_a_dry_run_reader_cannot_set_anything(tmp_path: Path) -> None:
    record = tmp_path / "calls.jsonl"
    reader = ReadOnlyReader(FixtureReader(FIXTURES / "capped-300w-of-450w.yaml", record=record))
    with pytest.raises(RuntimeError):
        reader.set_power_limit(0, 450000)
    assert read_recorded_calls(record) == []
