"""The benchmark's chaos phase (spec.chaos, issue 22): the same load plain and then under a
perturbation, compared; its spec's errors; its place in results, report and status."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from devenv.fakes.openai_server import Config, Delay
from tests.bench.conftest import ServerFactory
from tests.bench.test_result import outcome
from vllm_operator.bench import timing
from vllm_operator.bench.cli import EXIT_FAILED, EXIT_OK, compact_status, main
from vllm_operator.bench.records import Load
from vllm_operator.bench.restart import Eviction
from vllm_operator.bench.result import chaos_verdict
from vllm_operator.bench.run import BenchmarkError, RunOptions, chaos_rate, run_benchmark
from vllm_operator.bench.stats import Slo
from vllm_operator.models.inference_benchmark import (
    ChaosSpec,
    InferenceBenchmarkSpec,
    InferenceBenchmarkStatus,
)


def _spec(**extra: Any) -> dict[str, Any]:
    return {
        "targetRef": {"name": "svc"},
        "workload": {
            "promptTokens": {"type": "Fixed", "value": 8},
            "outputTokens": {"type": "Fixed", "value": 3},
        },
        "arrival": {"process": "Constant", "ratePerSecond": 20},
        "requests": 30,
        **extra,
    }


def _spec_file(tmp_path: Path, spec: dict[str, Any]) -> Path:
    """An InferenceBenchmark manifest with ``spec``, as the load Job's --spec-file."""
    path = tmp_path / "b.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "inference.vllm-operator.dev/v1alpha1",
                "kind": "InferenceBenchmark",
                "metadata": {"name": "b", "namespace": "default"},
                "spec": spec,
            }
        )
    )
    return path


# --- the spec ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("chaos", "words"),
    [
        ({}, "chaos needs a perturbation: network, noisyNeighbour or restart"),
        ({"restart": {"afterSeconds": -1}}, "greater than or equal to 0"),
        ({"network": {}}, "set delayMilliseconds, jitterMilliseconds or loss"),
        ({"network": {"loss": 1}}, "less than 1"),
        ({"network": {"delayMilliseconds": -1}}, "greater than or equal to 0"),
        (
            {"ratePerSecond": 5, "kneeFraction": 0.5, "network": {"delayMilliseconds": 5}},
            "set ratePerSecond or kneeFraction, not both",
        ),
    ],
)
def test_a_chaos_spec_without_sense_is_refused_naming_the_field(
    chaos: dict[str, Any], words: str
) -> None:
    with pytest.raises(ValidationError, match=words):
        InferenceBenchmarkSpec.model_validate(_spec(chaos=chaos))


def test_a_restart_due_after_the_run_ends_is_refused() -> None:
    spec = _spec(durationSeconds=10, requests=None, chaos={"restart": {"afterSeconds": 10}})
    with pytest.raises(ValidationError, match=r"chaos\.restart\.afterSeconds must be below"):
        InferenceBenchmarkSpec.model_validate(spec)
    # Without durationSeconds the run's length is the requests'; nothing to compare.
    InferenceBenchmarkSpec.model_validate(_spec(chaos={"restart": {"afterSeconds": 60}}))


# --- the load of the phase -----------------------------------------------------------------


def test_the_load_is_the_given_rate_or_a_fraction_of_what_the_levels_found() -> None:
    slo = Slo(ttft_s=0.5)
    given = InferenceBenchmarkSpec.model_validate(
        _spec(chaos={"ratePerSecond": 7, "network": {"delayMilliseconds": 5}})
    )
    assert chaos_rate(given, [], None) == (7, None)
    spec = InferenceBenchmarkSpec.model_validate(_spec(chaos={"network": {"loss": 0.1}}))
    # Five levels whose P99 climbs past 3 req/s: the knee is 3, the load 0.8 of it.
    sweep = [
        outcome(Load(r), t, slo=slo)
        for r, t in ((1.0, 0.10), (2.0, 0.11), (3.0, 0.12), (4.0, 0.40), (5.0, 0.90))
    ]
    assert chaos_rate(spec, sweep, None) == (2.4, None)
    half = InferenceBenchmarkSpec.model_validate(
        _spec(chaos={"kneeFraction": 0.5, "network": {"loss": 0.1}})
    )
    assert chaos_rate(half, sweep, None) == (1.5, None)
    # No knee (two levels): the search's best rate, else the highest rate that passed.
    two = sweep[:2]
    assert chaos_rate(spec, two, 30.0) == (24.0, None)
    assert chaos_rate(spec, two, None) == (1.6, None)
    # Nothing passed: no load to take a fraction of, and the note says what to set.
    rate, note = chaos_rate(spec, [outcome(Load(5.0), 0.9, slo=slo)], None)
    assert rate is None and note is not None and "spec.chaos.ratePerSecond" in note


# --- a run -------------------------------------------------------------------------------


def test_a_chaos_phase_runs_the_load_plain_then_delayed_and_compares(
    fake_server: ServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = fake_server(Config(ttft=Delay(value=0.01), itl=Delay(value=0.005)))
    path = _spec_file(
        tmp_path,
        _spec(
            slo={"ttftP99Milliseconds": 300},
            chaos={"ratePerSecond": 20, "network": {"delayMilliseconds": 30}},
        ),
    )
    out = tmp_path / "out"
    argv = ["--spec-file", str(path), "--endpoint", server.url, "--model", "fake-model"]
    code = main([*argv, "--output-dir", str(out), "--no-progress"])
    assert code == EXIT_OK, capsys.readouterr().err
    printed = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert len(results["levels"]) == 1  # the chaos runs are not levels
    (chaos,) = results["chaos"]
    assert chaos["perturbation"] == "network delay 30 ms each way"
    assert chaos["rate_per_second"] == 20
    base = chaos["baseline"]["stats"]
    hurt = chaos["perturbed"]["stats"]
    assert base["completed"] == hurt["completed"] == 30
    # Two delays of 30 ms on every request, well inside the 300 ms TTFT objective.
    grown = hurt["from_send"]["ttft"]["p50"] - base["from_send"]["ttft"]["p50"]
    assert 0.055 < grown < 0.075
    assert base["slo_attainment"] == hurt["slo_attainment"] == 1.0
    assert chaos["verdict"].startswith("TTFT P99 ")
    assert chaos["verdict"].endswith(": the SLO held")
    assert "SLO attainment" in chaos["verdict"] and "errors 0 -> 0" in chaos["verdict"]
    line = f"Chaos at 20 req/s, network delay 30 ms each way: {chaos['verdict']}"
    assert " ".join(line.split()) in " ".join(printed.split())  # the console wraps it
    # The HTML report shows both runs; the status carries the comparison.
    page = (out / "report.html").read_text()
    assert "<h2>Chaos</h2>" in page and "perturbed" in page
    status = json.loads((out / "status.json").read_text())
    assert status["chaos"][0]["perturbed"]["sloAttainment"] == 1.0
    assert status["chaos"][0]["verdict"] == chaos["verdict"]
    InferenceBenchmarkStatus.model_validate(status)


def test_the_verdict_says_whether_the_slo_held() -> None:
    slo = Slo(ttft_s=0.5)
    plain = outcome(Load(2.0), 0.10, slo=slo).stats
    slow = outcome(Load(2.0), 0.90, slo=slo).stats
    verdict = chaos_verdict(plain, slow, has_slo=True)
    assert verdict.startswith("TTFT P99 100 -> 900 ms (+800%), E2E P99 ")
    assert "SLO attainment 100.0% -> 0.0%" in verdict
    assert verdict.endswith(": the SLO did not hold")
    assert chaos_verdict(plain, plain, has_slo=True).endswith(": the SLO held")
    assert chaos_verdict(plain, slow, has_slo=False).endswith(": no SLO to hold")


def test_chaos_that_finds_no_load_says_why_and_runs_nothing(
    fake_server: ServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A 50 ms TTFT against a 10 ms objective: the single level fails; no load to run at.
    server = fake_server(Config(ttft=Delay(value=0.05)))
    path = _spec_file(
        tmp_path,
        _spec(requests=5, slo={"ttftP99Milliseconds": 10}, chaos={"network": {"loss": 0.2}}),
    )
    out = tmp_path / "out"
    argv = ["--spec-file", str(path), "--endpoint", server.url, "--model", "fake-model"]
    assert main([*argv, "--output-dir", str(out), "--no-progress", "--no-html"]) == EXIT_OK
    results = json.loads((out / "results.json").read_text())
    assert results["chaos"] == []
    assert "spec.chaos.ratePerSecond" in results["chaos_note"]
    assert "the chaos phase did not run" in capsys.readouterr().out
    status = json.loads((out / "status.json").read_text())
    assert status["chaosNote"] == results["chaos_note"]


def test_chaos_against_an_https_endpoint_fails_before_any_level(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _spec_file(
        tmp_path, _spec(chaos={"ratePerSecond": 5, "network": {"delayMilliseconds": 5}})
    )
    # Nothing listens there: the run must stop on the scheme, before it reaches the server.
    argv = ["--spec-file", str(path), "--endpoint", "https://127.0.0.1:9", "--model", "m"]
    assert main([*argv, "--output-dir", str(tmp_path / "out"), "--no-progress"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "spec.chaos.network: network faults need an http:// endpoint" in err


def test_the_termination_message_keeps_the_chaos_verdict_when_space_runs_out() -> None:
    level = {"ratePerSecond": 20, "requests": 30, "sloAttainment": 1.0, "buckets": [{"x": 1}]}
    big = {"fromSend": {"ttft": {"p50": 1.0}}, "note": "x" * 3000}
    status = {
        "levels": [{**level, **big}] * 3,
        "headline": {**level, **big},
        "chaos": [
            {
                "perturbation": "network delay 30 ms each way",
                "ratePerSecond": 20,
                "baseline": {**level, **big},
                "perturbed": {**level, **big},
                "verdict": "TTFT P99 10 -> 70 ms: the SLO did not hold",
            }
        ],
    }
    text = compact_status(status)
    assert len(text.encode()) <= 4096
    kept = json.loads(text)
    assert kept["chaos"][0]["verdict"] == "TTFT P99 10 -> 70 ms: the SLO did not hold"
    assert kept["chaos"][0]["perturbed"]["sloAttainment"] == 1.0
    assert "buckets" not in kept["chaos"][0]["baseline"]
    # Slimmed, a phase keeps the median it is compared by.
    assert "note" not in kept["chaos"][0]["perturbed"]
    assert kept["chaos"][0]["perturbed"]["fromSend"] == {"ttft": {"p50": 1.0}}


def test_a_chaos_spec_round_trips_in_the_api_shape() -> None:
    chaos = ChaosSpec.model_validate(
        {"network": {"delayMilliseconds": 20, "jitterMilliseconds": 5, "loss": 0.01}}
    )
    assert chaos.to_wire() == {
        "network": {
            "delayMilliseconds": 20,
            "jitterMilliseconds": 5,
            "loss": 0.01,
            "retransmitMilliseconds": 200,
        }
    }


# --- the restart ---------------------------------------------------------------------------


class _Evictions:
    """Stands in for the Eviction API (bench/restart.py, run for real in
    e2e/test_benchmark.py): records each call, and answers as told."""

    def __init__(self, outcome: str = "pod svc-b evicted") -> None:
        self.calls: list[tuple[tuple[str, ...], str, float]] = []
        self.outcome = outcome

    async def __call__(self, pods: Sequence[str], namespace: str, at_s: float) -> Eviction:
        self.calls.append((tuple(pods), namespace, at_s))
        return Eviction("svc-b", at_s, self.outcome)


def _run(server_url: str, spec: dict[str, Any], evictor: _Evictions, **options: Any) -> Any:
    return timing.run(
        run_benchmark(
            InferenceBenchmarkSpec.model_validate(spec),
            RunOptions(endpoint=server_url, model="fake-model", **options),
            evictor=evictor,
        )
    )


def test_a_restart_evicts_a_pod_mid_run_after_every_other_perturbation(
    fake_server: ServerFactory,
) -> None:
    server = fake_server(Config(ttft=Delay(value=0.01), itl=Delay(value=0.005)))
    spec = _spec(
        arrival={"process": "Constant", "ratePerSecond": 20},
        requests=20,
        chaos={
            "ratePerSecond": 20,
            "restart": {"afterSeconds": 0.3},
            "network": {"delayMilliseconds": 5},
        },
    )
    evictions = _Evictions()
    result = _run(
        server.url,
        spec,
        evictions,
        restart_pods=("svc-a", "svc-b"),
        restart_namespace="team",
    )
    network, restart = result.chaos
    assert network.perturbation.startswith("network ")
    assert restart.perturbation == "restart: pod svc-b evicted"
    ((pods, namespace, at_s),) = evictions.calls
    assert pods == ("svc-a", "svc-b") and namespace == "team"
    # 20 requests at 20 req/s: the eviction 0.3 s into the perturbed run, before its end
    # (relative to the run, not a wall-clock bound a loaded machine could break).
    assert 0.3 <= at_s < restart.perturbed.stats.duration_s
    assert restart.perturbed.stats.completed == 20
    assert "errors 0 -> 0" in restart.verdict


def test_a_run_that_ends_before_the_restart_is_due_says_so_and_evicts_nothing(
    fake_server: ServerFactory,
) -> None:
    server = fake_server(Config(ttft=Delay(value=0.01), itl=Delay(value=0.005)))
    spec = _spec(requests=4, chaos={"ratePerSecond": 20, "restart": {"afterSeconds": 30}})
    evictions = _Evictions()
    result = _run(server.url, spec, evictions, restart_pods=("svc-a",))
    (restart,) = result.chaos
    assert evictions.calls == []
    assert restart.perturbation.startswith("restart: no pod evicted: the run ended ")
    assert restart.perturbation.endswith("before the eviction was due at 30 s")


def test_a_restart_without_pods_to_evict_fails_before_any_level(
    fake_server: ServerFactory,
) -> None:
    server = fake_server(Config())
    spec = _spec(chaos={"ratePerSecond": 20, "restart": {}})
    with pytest.raises(BenchmarkError, match=r"spec.chaos.restart: no pod to evict"):
        _run(server.url, spec, _Evictions())
    assert server.take_stats()["requests"] == 0


def test_the_restart_flags_reach_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    async def fake_run(spec: Any, options: RunOptions, *args: Any, **kwargs: Any) -> Any:
        seen["options"] = options
        raise BenchmarkError("stop here")

    monkeypatch.setattr("vllm_operator.bench.run.run_benchmark", fake_run)
    path = _spec_file(tmp_path, _spec(chaos={"ratePerSecond": 5, "restart": {}}))
    argv = ["--spec-file", str(path), "--endpoint", "http://127.0.0.1:9", "--no-progress"]
    argv += ["--restart-pod", "a", "--restart-pod", "b", "--restart-namespace", "team"]
    assert main([*argv, "--output-dir", str(tmp_path / "out")]) == EXIT_FAILED
    assert seen["options"].restart_pods == ("a", "b")
    assert seen["options"].restart_namespace == "team"
