"""The run's named steps on their own (bench/run.py): the checks before a run starts, the
target every request goes to, how levels are judged, and the load a rate becomes."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_operator.bench.records import Load
from vllm_operator.bench.run import (
    BenchmarkError,
    RunInputs,
    RunOptions,
    check_inputs,
    judging_of,
    rated,
    target_of,
)
from vllm_operator.bench.stats import Slo
from vllm_operator.bench.workload import DatasetEntry, TraceEntry
from vllm_operator.models.inference_benchmark import InferenceBenchmarkSpec

ENDPOINT = "http://svc:8000"


def _spec(**extra: Any) -> InferenceBenchmarkSpec:
    return InferenceBenchmarkSpec.model_validate(
        {
            "targetRef": {"name": "svc"},
            "workload": {
                "promptTokens": {"type": "Fixed", "value": 8},
                "outputTokens": {"type": "Fixed", "value": 3},
            },
            "arrival": {"process": "Constant", "ratePerSecond": 20},
            "requests": 30,
            **extra,
        }
    )


DATASET = {"dataset": {"name": "prompts", "key": "data.jsonl"}}
TRACE = {"process": "Trace", "trace": {"name": "trace", "key": "t.jsonl"}}


@pytest.mark.parametrize(
    ("spec", "options", "inputs", "board", "refused"),
    [
        pytest.param(_spec(), RunOptions(ENDPOINT), RunInputs(), False, None, id="a plain run"),
        pytest.param(
            _spec(workload=DATASET),
            RunOptions(ENDPOINT),
            RunInputs(),
            False,
            "names a dataset",
            id="a dataset named but not passed",
        ),
        pytest.param(
            _spec(workload=DATASET),
            RunOptions(ENDPOINT),
            RunInputs(dataset=(DatasetEntry(prompt="hi"),)),
            False,
            None,
            id="a dataset named and passed",
        ),
        pytest.param(
            _spec(arrival=TRACE),
            RunOptions(ENDPOINT),
            RunInputs(),
            False,
            "needs the trace",
            id="a trace named but not passed",
        ),
        pytest.param(
            _spec(arrival=TRACE),
            RunOptions(ENDPOINT),
            RunInputs(trace=(TraceEntry(0.0, 8, 3),)),
            False,
            None,
            id="a trace named and passed",
        ),
        pytest.param(
            _spec(chaos={"network": {"loss": 0.1}}),
            RunOptions("https://svc:8443"),
            RunInputs(),
            False,
            "spec.chaos.network",
            id="a network relay in front of HTTPS",
        ),
        pytest.param(
            _spec(chaos={"restart": {"afterSeconds": 5}}),
            RunOptions(ENDPOINT),
            RunInputs(),
            False,
            "no pod to evict",
            id="a restart with no pod named",
        ),
        pytest.param(
            _spec(chaos={"restart": {"afterSeconds": 5}}),
            RunOptions(ENDPOINT, restart_pods=("svc-0",)),
            RunInputs(),
            False,
            None,
            id="a restart with a pod named",
        ),
        pytest.param(
            _spec(chaos={"noisyNeighbour": {}}),
            RunOptions(ENDPOINT),
            RunInputs(),
            False,
            "no neighbour to order",
            id="a neighbour with no ConfigMap",
        ),
        pytest.param(
            _spec(chaos={"noisyNeighbour": {}}),
            RunOptions(ENDPOINT),
            RunInputs(),
            True,
            None,
            id="a neighbour with a board passed",
        ),
    ],
)
def test_check_inputs(
    spec: InferenceBenchmarkSpec,
    options: RunOptions,
    inputs: RunInputs,
    board: bool,
    refused: str | None,
) -> None:
    if refused is None:
        check_inputs(spec, options, inputs, options.endpoint, has_board=board)
        return
    with pytest.raises(BenchmarkError, match=refused):
        check_inputs(spec, options, inputs, options.endpoint, has_board=board)


@pytest.mark.parametrize(
    ("spec", "options", "api", "stream"),
    [
        pytest.param(_spec(), RunOptions(ENDPOINT), "chat", True, id="chat, streamed by default"),
        pytest.param(
            _spec(endpoint={"api": "Completions", "stream": False}),
            RunOptions(ENDPOINT, ignore_eos=False, headers={"x": "y"}),
            "completions",
            False,
            id="completions, not streamed",
        ),
    ],
)
def test_target_of(
    spec: InferenceBenchmarkSpec, options: RunOptions, api: str, stream: bool
) -> None:
    target = target_of(spec, options, ENDPOINT, "m")
    assert (target.api, target.stream, target.model, target.endpoint) == (
        api,
        stream,
        "m",
        ENDPOINT,
    )
    assert (target.ignore_eos, target.headers) == (options.ignore_eos, dict(options.headers))


@pytest.mark.parametrize(
    ("spec", "slo", "has_slo", "first_edge"),
    [
        pytest.param(_spec(), Slo(), False, (1, 127), id="no objective, powers of two"),
        pytest.param(
            _spec(slo={"ttftP99Milliseconds": 250, "e2eP99Milliseconds": 4000}),
            Slo(ttft_s=0.25, e2e_s=4.0),
            True,
            (1, 127),
            id="objectives in seconds",
        ),
        pytest.param(
            _spec(
                workload={
                    "promptTokens": {
                        "type": "Buckets",
                        "buckets": [
                            {"min": 500, "max": 900, "weight": 1},
                            {"min": 10, "max": 99, "weight": 2},
                        ],
                    },
                    "outputTokens": {"type": "Fixed", "value": 3},
                }
            ),
            Slo(),
            False,
            (10, 99),
            id="the workload's own buckets, sorted",
        ),
    ],
)
def test_judging_of(
    spec: InferenceBenchmarkSpec, slo: Slo, has_slo: bool, first_edge: tuple[int, int]
) -> None:
    judging = judging_of(spec)
    assert (judging.slo, judging.has_slo, judging.edges[0]) == (slo, has_slo, first_edge)
    assert (judging.deadlines.ttft_s, judging.deadlines.e2e_s) == (slo.ttft_s, slo.e2e_s)
    assert judging.attainment == spec.target_attainment()


@pytest.mark.parametrize(
    ("arrival", "load"),
    [
        pytest.param(
            {"process": "Constant", "ratePerSecond": 20},
            Load(rate_per_second=5.0, process="Constant"),
            id="the spec's process",
        ),
        pytest.param(
            {"process": "ClosedLoop", "concurrency": 4},
            Load(rate_per_second=5.0, process="Poisson"),
            id="a closed loop's rate runs Poisson",
        ),
        pytest.param(
            {"process": "Gamma", "ratePerSecond": 20, "burstiness": 0.5},
            Load(rate_per_second=5.0, process="Gamma"),
            id="a bursty process stays bursty",
        ),
    ],
)
def test_rated(arrival: dict[str, Any], load: Load) -> None:
    assert rated(_spec(arrival=arrival), 5.0) == load
