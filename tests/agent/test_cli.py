"""`vllm-operator agent` on the command line: the no-apiserver mode and argument checks."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from devenv.fakes import answer_sets
from vllm_operator.agent.cli import add_parser, main
from vllm_operator.agent.readings import load_answer_file, snapshot_from_data

FIXTURES = answer_sets.FIXTURES


def test_print_shows_the_gpunode_and_dumps_the_raw_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump = tmp_path / "nvml.json"
    code = main(
        [
            "--print",
            "--node-name=n1",
            f"--nvml-fixture={FIXTURES / 'rtx4090x2-phb.yaml'}",
            "--policy=Watts",
            "--watts=350",
            f"--dump-nvml={dump}",
        ]
    )
    assert code == 0
    obj = json.loads(capsys.readouterr().out)
    assert (obj["kind"], obj["metadata"]["name"]) == ("GPUNode", "n1")
    assert obj["spec"]["power"] == {"policy": "Watts", "watts": 350}
    assert obj["status"]["links"] == [{"a": 0, "b": 1, "kind": "PHB"}]
    fact = next(c for c in obj["status"]["conditions"] if c["type"] == "PowerPolicyApplied")
    assert fact["reason"] == "DryRun"  # --print is always a dry run
    assert snapshot_from_data(load_answer_file(dump)) == answer_sets.rtx4090x2_phb()


def test_print_never_sets_a_limit_even_without_dry_run(tmp_path: Path) -> None:
    record = tmp_path / "calls.jsonl"
    fixture = f"--nvml-fixture={FIXTURES / 'capped-300w-of-450w.yaml'}"
    assert main(["--print", fixture, f"--nvml-record={record}", "--policy=Max"]) == 0
    assert not record.exists()


def test_watts_without_a_value_is_a_usage_error() -> None:
    fixture = f"--nvml-fixture={FIXTURES / 'capped-300w-of-450w.yaml'}"
    assert main(["--print", fixture, "--policy=Watts"]) == 2


def test_the_cluster_mode_needs_a_node_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main([f"--nvml-fixture={FIXTURES / 'capped-300w-of-450w.yaml'}"]) == 2


def test_a_record_needs_a_fixture() -> None:
    assert main(["--node-name=n1", "--nvml-record=x.jsonl"]) == 2


def test_the_node_name_comes_from_the_downward_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")
    parser = argparse.ArgumentParser(prog="vllm-operator")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["agent", "--dry-run"])
    assert (args.node_name, args.dry_run, args.interval) == ("gpu-node-7", True, 30.0)
    assert callable(args.func)


def test_missing_nvml_prints_a_status_that_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--print", f"--nvml-fixture={FIXTURES / 'nvml-unavailable.yaml'}"]) == 0
    status = json.loads(capsys.readouterr().out)["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NvmlUnavailable")
