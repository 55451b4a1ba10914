"""Real H200 machines: the agent's captured NVML answers against nvidia-smi, field by field.

The captures under fixtures/h200/ were taken on lent H200 machines (one with two GPUs,
one with one) by tests/agent/h200/capture.sh, changing nothing there: the agent ran with
--print (always a dry run) beside nvidia-smi, its probe, and a PyTorch copy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.agent.h200.compare import agent_status, compare, snapshot, table
from tests.agent.nvidia_smi import read_xml
from vllm_operator.agent.inventory import inventory, node_labels
from vllm_operator.agent.readings import dump_snapshot

CAPTURES_DIR = Path(__file__).parent / "fixtures" / "h200"
CAPTURES = sorted(p for p in CAPTURES_DIR.iterdir() if (p / "nvml.json").is_file())


def test_both_machine_shapes_were_captured() -> None:
    assert {p.name for p in CAPTURES} >= {"x1", "x2"}


@pytest.fixture(params=CAPTURES, ids=[p.name for p in CAPTURES])
def capture(request: pytest.FixtureRequest) -> Path:
    folder: Path = request.param
    return folder


def test_the_gpunode_matches_nvidia_smi_field_by_field(capture: Path) -> None:
    rows = compare(capture)
    assert all(r.ok for r in rows), "\n" + table(rows)
    assert (
        len([r for r in rows if r.field == "uuid"])
        == read_xml(capture / "nvidia-smi-q.xml").attached_gpus
    )


def test_the_recorded_answers_are_what_the_agent_published_then(capture: Path) -> None:
    # gpunode.json and nvml.json come from one read in one process: mapping the dump again
    # must give the very inventory the agent printed.
    published = agent_status(capture)
    inv = inventory(snapshot(capture))
    assert published.gpus == inv.gpus
    assert published.links == inv.links
    assert published.interconnect == inv.interconnect
    assert published.driver_version == inv.driver_version
    labels = json.loads((capture / "gpunode.json").read_text())["metadata"]["labels"]
    assert labels == node_labels(inv)


def test_the_recorded_answers_round_trip(capture: Path) -> None:
    text = (capture / "nvml.json").read_text()
    assert dump_snapshot(snapshot(capture)) == text


def test_h200s_read_as_h200s(capture: Path) -> None:
    status = agent_status(capture)
    assert {g.product for g in status.gpus} == {"NVIDIA H200"}
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert ready.status == "True"
    for gpu in status.gpus:
        assert gpu.memory_bytes == 150_754_820_096
        assert gpu.power and (gpu.power.default, gpu.power.min, gpu.power.max) == (700, 200, 700)
    if len(status.gpus) == 2:
        # NVML's common ancestor says host bridge; the per-link reading says NV18. NVLink wins.
        assert snapshot(capture).pairs[0].common_ancestor == 30
        assert [(link.kind, link.nvlinks) for link in status.links] == [("NVLink", 18)]
        assert status.interconnect == "NVLink"
    else:
        assert status.interconnect == "None"


def _policy(capture: Path, name: str) -> dict[str, Any]:
    status = json.loads((capture / f"gpunode-policy-{name}.json").read_text())["status"]
    return next(c for c in status["conditions"] if c["type"] == "PowerPolicyApplied")


def test_power_policies_ran_as_dry_runs_and_changed_nothing(capture: Path) -> None:
    before = (capture / "limits-before.csv").read_text()
    assert before == (capture / "limits-after.csv").read_text()
    n = len(agent_status(capture).gpus)
    # 700 W is both the default and the maximum: Default and Max have nothing to do.
    for name in ("default", "max"):
        assert _policy(capture, name)["reason"] == "Applied"
        assert _policy(capture, name)["message"].startswith("dry run: every GPU is at the limit")
    assert _policy(capture, "watts-500")["message"] == "dry run: " + "; ".join(
        f"would set GPU {i} from 700 W to 500 W" for i in range(n)
    )
    assert (
        "900 W is above the maximum 700 W; using 700 W" in _policy(capture, "watts-900")["message"]
    )
    low = _policy(capture, "watts-100")
    assert low["reason"] == "DryRun"
    assert "would set GPU 0 from 700 W to 200 W" in low["message"]
    assert "100 W is below the minimum 200 W; using 200 W" in low["message"]
    log = (capture / "agent.log").read_text()
    assert "Applied power limit" not in log and "Restored power limit" not in log


def _probe_results(capture: Path) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for path in sorted(capture.glob("gpunode-probe-*.json")):
        probe = json.loads(path.read_text())["status"]["bandwidth"]
        assert probe.get("error") is None, probe["error"]
        results.extend(probe["results"])
    return results


def test_the_probes_device_copy_is_within_ten_percent_of_a_framework_copy(capture: Path) -> None:
    framework = json.loads((capture / "framework-copy.json").read_text())
    reference = {
        r["source"].removeprefix("cuda"): r["gigabytes_per_second"]
        for r in framework["results"]
        if r["kind"] == "DeviceCopy"
    }
    copies = [r for r in _probe_results(capture) if r["kind"] == "DeviceCopy"]
    assert len(copies) == 2 * len(reference)  # two probe runs
    for r in copies:
        torch_rate = reference[r["source"].removeprefix("gpu")]
        assert abs(r["gigabytesPerSecond"] - torch_rate) <= 0.10 * torch_rate, (r, torch_rate)
        # And below what HBM3e can deliver at all.
        assert r["gigabytesPerSecond"] < r["expectedGigabytesPerSecond"] == 4800.0


def test_every_copy_the_probe_makes_was_measured(capture: Path) -> None:
    n = len(agent_status(capture).gpus)
    kinds = [r["kind"] for r in _probe_results(capture)]
    per_run = {"DeviceCopy": n, "HostToDevice": n, "DeviceToHost": n, "PeerToPeer": n * (n - 1)}
    for kind, count in per_run.items():
        assert kinds.count(kind) == 2 * count
    for r in _probe_results(capture):
        assert 0 < r["gigabytesPerSecond"] < r["expectedGigabytesPerSecond"]
