"""The children of an InferenceBenchmark: golden YAML for a benchmark with a dataset and a
trace, and the load Job's arguments read back by the load generator's own parser (so a
flag the Job passes is one that ``vllm-operator bench`` has).

Set UPDATE_GOLDEN=1 to rewrite the golden file after an intended change, then review it.
"""

from __future__ import annotations

import argparse
import copy
import os
from pathlib import Path
from typing import Any

import yaml

from vllm_operator.bench.cli import configure
from vllm_operator.models import InferenceBenchmark
from vllm_operator.render.benchmark import (
    build_load_job,
    build_load_role,
    build_load_role_binding,
    build_load_service_account,
    build_results_config_map,
    build_spec_config_map,
)
from vllm_operator.settings import DEFAULT_LOAD_RESOURCES

GOLDEN = Path(__file__).parents[1] / "golden" / "benchmark-dataset-trace.yaml"
BENCH: dict[str, Any] = {
    "apiVersion": "inference.vllm-operator.dev/v1alpha1",
    "kind": "InferenceBenchmark",
    "metadata": {"name": "replay", "namespace": "team-a", "uid": "b-1", "generation": 1},
    "spec": {
        "targetRef": {"name": "chat"},
        "workload": {"dataset": {"name": "prompts", "key": "chat.jsonl"}},
        "arrival": {"process": "Trace", "trace": {"name": "traffic", "key": "monday"}},
        "requests": 200,
    },
}


def _bench(**spec: Any) -> InferenceBenchmark:
    body = copy.deepcopy(BENCH)
    body["spec"].update(spec)
    return InferenceBenchmark.model_validate(body)


def _job(bench: InferenceBenchmark) -> dict[str, Any]:
    return build_load_job(
        bench,
        image="op:1",
        resources=DEFAULT_LOAD_RESOURCES.to_wire(),
        endpoint="http://chat.team-a.svc:8000",
        model="m",
    )


def _render() -> str:
    bench = _bench()
    docs = [
        build_spec_config_map(bench),
        build_results_config_map(bench),
        build_load_service_account(bench),
        build_load_role(bench),
        build_load_role_binding(bench),
        _job(bench),
    ]
    return yaml.safe_dump_all(docs, sort_keys=True)


def test_the_children_of_a_benchmark_with_a_dataset_and_a_trace_match_the_golden_file() -> None:
    text = _render()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), f"no golden file {GOLDEN.name}; run with UPDATE_GOLDEN=1"
    assert text == GOLDEN.read_text(), f"the benchmark renders differently from {GOLDEN.name}"


def _parsed(job: dict[str, Any]) -> argparse.Namespace:
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["vllm-operator", "bench"]
    return configure(argparse.ArgumentParser(exit_on_error=False)).parse_args(container["args"])


def _mounted_file(job: dict[str, Any], path: str) -> tuple[str, str]:
    """The (ConfigMap, key) behind a file path in the load container."""
    pod = job["spec"]["template"]["spec"]
    mounts = pod["containers"][0]["volumeMounts"]
    mount = next(m for m in mounts if path.startswith(m["mountPath"] + "/"))
    assert mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    file = path.removeprefix(mount["mountPath"] + "/")
    item = next(i for i in volume["configMap"]["items"] if i["path"] == file)
    return volume["configMap"]["name"], item["key"]


def test_the_dataset_and_the_trace_reach_the_load_generator_as_files() -> None:
    job = _job(_bench())
    args = _parsed(job)
    assert _mounted_file(job, args.dataset_file) == ("prompts", "chat.jsonl")
    assert _mounted_file(job, args.trace_file) == ("traffic", "monday")
    assert args.spec_file and args.results_config_map == "replay-results"
    assert args.results_namespace == "team-a"


def test_a_benchmark_without_inputs_mounts_only_its_spec() -> None:
    spec = {
        "workload": {
            "promptTokens": {"type": "Fixed", "value": 8},
            "outputTokens": {"type": "Fixed", "value": 8},
        },
        "arrival": {"process": "Poisson", "ratePerSecond": 2},
    }
    job = _job(_bench(**spec))
    args = _parsed(job)
    assert args.dataset_file is None and args.trace_file is None
    volumes = job["spec"]["template"]["spec"]["volumes"]
    assert [v["name"] for v in volumes] == ["spec", "results"]


def test_the_load_job_runs_as_an_account_that_may_only_write_its_results() -> None:
    bench = _bench()
    pod = _job(bench)["spec"]["template"]["spec"]
    account = build_load_service_account(bench)["metadata"]["name"]
    assert pod["serviceAccountName"] == account and pod["automountServiceAccountToken"] is True
    role = build_load_role(bench)
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [build_results_config_map(bench)["metadata"]["name"]],
            "verbs": ["get", "update", "patch"],
        }
    ]
    binding = build_load_role_binding(bench)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": "team-a"}
    ]
    for child in (
        role,
        binding,
        build_load_service_account(bench),
        build_results_config_map(bench),
    ):
        owner = child["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == (
            "InferenceBenchmark",
            "replay",
            True,
        )


def test_the_results_config_map_carries_no_data_the_job_could_lose_to_a_reapply() -> None:
    cm = build_results_config_map(_bench())
    assert "data" not in cm and "binaryData" not in cm
