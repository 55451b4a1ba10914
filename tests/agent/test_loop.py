"""The agent's loop against a recording GPUNode store and a fixture-backed NVML."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from devenv.fakes import answer_sets
from tests.agent.fake_store import RecordingStore
from vllm_operator.agent.loop import Agent, AgentConfig
from vllm_operator.agent.nvml import FixtureReader, NvmlReader, ReadOnlyReader, read_recorded_calls
from vllm_operator.agent.probe import Measurement, ProbeRun
from vllm_operator.agent.readings import dump_snapshot
from vllm_operator.agent.store import StoreError

NODE = "gpu-4090"


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class Probe:
    def __init__(self) -> None:
        self.calls: list[Mapping[str, int]] = []

    def __call__(self, bus_ids: Mapping[str, int]) -> ProbeRun:
        self.calls.append(dict(bus_ids))
        return ProbeRun(measurements=(Measurement("DeviceCopy", 0, 0, 2**30, 10, 0.025),))


@pytest.fixture
def fixture_file(tmp_path: Path) -> Path:
    path = tmp_path / "node.yaml"
    shutil.copy(answer_sets.FIXTURES / "capped-300w-of-450w.yaml", path)
    return path


@pytest.fixture
def record(tmp_path: Path) -> Path:
    return tmp_path / "calls.jsonl"


def rewrite(path: Path, text: str) -> None:
    """Rewrite a fixture file with a surely newer mtime (timestamps can be coarse)."""
    before = path.stat().st_mtime_ns
    path.write_text(text)
    os.utime(path, ns=(before + 10**9, before + 10**9))


async def until(predicate: Callable[[], object], seconds: float = 5.0) -> None:
    """Wait for a condition the agent's task brings about, failing after ``seconds``."""
    for _ in range(int(seconds / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


def make_agent(
    reader: NvmlReader,
    store: RecordingStore,
    clock: Clock,
    *,
    dry_run: bool = False,
    probe: Probe | None = None,
    label_node: bool = False,
) -> Agent:
    config = AgentConfig(
        node_name=NODE, interval=0.01, refresh=300, dry_run=dry_run, label_node=label_node
    )
    return Agent(config, reader, store, prober=probe or Probe(), clock=clock)


def condition(store: RecordingStore, kind: str) -> dict[str, str]:
    status = store.objects[NODE]["status"]
    return next(c for c in status["conditions"] if c["type"] == kind)


async def test_the_first_pass_creates_the_gpunode_owned_by_the_node_and_publishes_status(
    fixture_file: Path, record: Path
) -> None:
    store = RecordingStore()
    await make_agent(FixtureReader(fixture_file, record=record), store, Clock()).step()
    obj = store.objects[NODE]
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-1"}
    ]
    assert obj["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-GeForce-RTX-4090"
    assert obj["status"]["gpus"][0]["power"]["current"] == 300.0
    assert condition(store, "PowerCapped")["status"] == "True"
    assert condition(store, "PowerPolicyApplied")["reason"] == "Unmanaged"
    assert obj["status"]["observedGeneration"] == 1
    assert read_recorded_calls(record) == []


async def test_an_unchanged_node_is_not_written_again(fixture_file: Path) -> None:
    store, clock = RecordingStore(), Clock()
    agent = make_agent(FixtureReader(fixture_file), store, clock)
    await agent.step()
    clock.advance(30)
    await agent.step()
    assert len(store.writes("status")) == 1
    assert len(store.writes("metadata")) == 2  # create, then the labels once GPUs were read


async def test_moving_readings_alone_are_written_only_after_the_refresh_interval(
    fixture_file: Path,
) -> None:
    store, clock = RecordingStore(), Clock()
    agent = make_agent(FixtureReader(fixture_file), store, clock)
    await agent.step()
    snapshot = answer_sets.capped_300w_of_450w()
    warmer = replace(snapshot.devices[0], temperature_c=71, power_usage_mw=280000)
    rewrite(fixture_file, dump_snapshot(replace(snapshot, devices=(warmer,))))
    clock.advance(60)
    await agent.step()
    assert len(store.writes("status")) == 1
    clock.advance(300)
    await agent.step()
    assert len(store.writes("status")) == 2
    assert store.objects[NODE]["status"]["gpus"][0]["temperatureCelsius"] == 71


async def test_a_power_policy_flows_to_nvml_and_unmanaged_restores_the_original(
    fixture_file: Path, record: Path
) -> None:
    store, clock = RecordingStore(), Clock()
    agent = make_agent(FixtureReader(fixture_file, record=record), store, clock)
    await agent.step()
    store.set_spec(NODE, {"power": {"policy": "Default"}, "probe": {}})
    await agent.step()
    assert [c["milliwatts"] for c in read_recorded_calls(record)] == [450000]
    status = store.objects[NODE]["status"]
    assert status["power"] == [
        {
            "uuid": status["gpus"][0]["uuid"],
            "originalWatts": 300.0,
            "appliedWatts": 450.0,
            "dryRun": False,
        }
    ]
    assert status["gpus"][0]["power"]["current"] == 450.0
    assert condition(store, "PowerCapped")["status"] == "False"
    assert condition(store, "PowerPolicyApplied")["message"] == "changed GPU 0 from 300 W to 450 W"
    assert status["observedGeneration"] == 2

    await agent.step()  # nothing left to do
    assert len(read_recorded_calls(record)) == 1

    store.set_spec(NODE, {"power": {"policy": "Unmanaged"}, "probe": {}})
    await agent.step()
    assert [c["milliwatts"] for c in read_recorded_calls(record)] == [450000, 300000]
    assert store.objects[NODE]["status"]["power"] == []
    assert condition(store, "PowerPolicyApplied")["reason"] == "Restored"


async def test_a_limit_reset_by_a_driver_reload_is_applied_again(
    fixture_file: Path, record: Path
) -> None:
    store = RecordingStore()
    agent = make_agent(FixtureReader(fixture_file, record=record), store, Clock())
    await agent.step()
    store.set_spec(NODE, {"power": {"policy": "Max"}, "probe": {}})
    await agent.step()
    # The driver reloads: the board's 300 W is back (the reader re-reads a rewritten file).
    rewrite(fixture_file, dump_snapshot(answer_sets.capped_300w_of_450w()))
    await agent.step()
    assert [c["milliwatts"] for c in read_recorded_calls(record)] == [600000, 600000]
    assert store.objects[NODE]["status"]["power"][0]["originalWatts"] == 300.0


async def test_a_restarted_agent_restores_the_original_recorded_on_the_status(
    fixture_file: Path, record: Path
) -> None:
    store = RecordingStore()
    reader = FixtureReader(fixture_file, record=record)
    await make_agent(reader, store, Clock()).step()
    store.set_spec(NODE, {"power": {"policy": "Default"}, "probe": {}})
    await make_agent(reader, store, Clock()).step()
    store.set_spec(NODE, {"power": {"policy": "Unmanaged"}, "probe": {}})
    await make_agent(reader, store, Clock()).step()  # a new process: memory is the status
    assert [c["milliwatts"] for c in read_recorded_calls(record)] == [450000, 300000]


async def test_a_dry_run_changes_nothing_and_says_what_it_would_do(
    fixture_file: Path, record: Path
) -> None:
    store = RecordingStore()
    reader = ReadOnlyReader(FixtureReader(fixture_file, record=record))
    agent = make_agent(reader, store, Clock(), dry_run=True)
    await agent.step()
    store.set_spec(NODE, {"power": {"policy": "Max"}, "probe": {}})
    await agent.step()
    assert read_recorded_calls(record) == []
    fact = condition(store, "PowerPolicyApplied")
    assert (fact["status"], fact["reason"]) == ("False", "DryRun")
    assert fact["message"] == "dry run: would set GPU 0 from 300 W to 600 W"
    assert store.objects[NODE]["status"]["power"][0]["dryRun"] is True


async def test_no_permission_becomes_a_condition_not_a_crash(tmp_path: Path) -> None:
    store = RecordingStore()
    agent = make_agent(FixtureReader(answer_sets.FIXTURES / "no-permission.yaml"), store, Clock())
    await agent.step()
    store.set_spec(NODE, {"power": {"policy": "Default"}, "probe": {}})
    await agent.step()
    fact = condition(store, "PowerPolicyApplied")
    assert (fact["status"], fact["reason"]) == ("False", "NoPermission")
    assert store.objects[NODE]["status"]["power"] == []


async def test_missing_nvml_is_a_condition_and_keeps_the_last_inventory(
    fixture_file: Path,
) -> None:
    store, clock = RecordingStore(), Clock()
    agent = make_agent(FixtureReader(fixture_file), store, clock)
    await agent.step()
    shutil.copy(answer_sets.FIXTURES / "nvml-unavailable.yaml", fixture_file)
    clock.advance(30)
    await agent.step()
    status = store.objects[NODE]["status"]
    ready = condition(store, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NvmlUnavailable")
    assert "inventory below is from 2026-11-29T12:00:00+00:00" in ready["message"]
    assert len(status["gpus"]) == 1
    assert status["lastUpdated"] == "2026-11-29T12:00:00Z"


async def test_the_probe_runs_once_per_request(fixture_file: Path) -> None:
    store, probe = RecordingStore(), Probe()
    agent = make_agent(FixtureReader(fixture_file), store, Clock(), probe=probe)
    await agent.step()
    assert probe.calls == []
    store.set_spec(NODE, {"power": {"policy": "Unmanaged"}, "probe": {"requestId": "a"}})
    await agent.step()
    await agent.step()
    assert probe.calls == [{"00000000:01:00.0": 0}]
    bandwidth = store.objects[NODE]["status"]["bandwidth"]
    assert bandwidth["requestId"] == "a"
    assert bandwidth["results"][0]["gigabytesPerSecond"] == pytest.approx(858.99, abs=0.1)
    store.set_spec(NODE, {"power": {"policy": "Unmanaged"}, "probe": {"requestId": "b"}})
    await agent.step()
    assert len(probe.calls) == 2


async def test_stopping_restores_limits_and_marks_the_status_stale(
    fixture_file: Path, record: Path
) -> None:
    store = RecordingStore()
    agent = make_agent(FixtureReader(fixture_file, record=record), store, Clock())
    await agent.step()
    store.set_spec(NODE, {"power": {"policy": "Max"}, "probe": {}})
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await until(lambda: read_recorded_calls(record))
    stop.set()
    await asyncio.wait_for(task, 5)
    assert [c["milliwatts"] for c in read_recorded_calls(record)] == [600000, 300000]
    status = store.objects[NODE]["status"]
    assert status["power"] == []
    ready = condition(store, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "AgentStopped")


async def test_api_errors_are_retried_on_the_next_pass(fixture_file: Path) -> None:
    store = RecordingStore()
    agent = make_agent(FixtureReader(fixture_file), store, Clock())
    store.fail_next = StoreError(503, "apiserver unavailable")
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await until(lambda: store.writes("status"))
    stop.set()
    await asyncio.wait_for(task, 5)
    assert store.objects[NODE]["status"]["gpus"]


async def test_node_labels_are_set_only_when_asked(fixture_file: Path) -> None:
    store = RecordingStore()
    await make_agent(FixtureReader(fixture_file), store, Clock()).step()
    assert store.writes("node-labels") == []
    await make_agent(FixtureReader(fixture_file), store, Clock(), label_node=True).step()
    assert store.node_labels[NODE]["nvidia.com/gpu.count"] == "1"


async def test_a_stopped_dry_run_agent_marks_the_status_stale_and_sets_nothing(
    fixture_file: Path, record: Path
) -> None:
    store = RecordingStore()
    reader = ReadOnlyReader(FixtureReader(fixture_file, record=record))
    agent = make_agent(reader, store, Clock(), dry_run=True)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await until(lambda: store.writes("status"))
    stop.set()
    await asyncio.wait_for(task, 5)
    assert read_recorded_calls(record) == []
    ready = condition(store, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "AgentStopped")
