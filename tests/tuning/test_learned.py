"""tuning/learned.py: a later plan on the same shape uses the kept measurement (its SLO
answer decided by it, a note with the prediction and the error); a record of another
shape, SLO or arguments does not change it; a broken record is skipped with a note; and
``vllm-operator tune --measurements`` plans what the operator plans from the same
records."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_operator.models.inference_service import InferenceServiceSpec
from vllm_operator.models.workload import SLO, Workload
from vllm_operator.releases.arguments import command_values, release_flags
from vllm_operator.releases.version import TESTED_VERSION, DeployedVersion
from vllm_operator.tune_cli import configure, tune
from vllm_operator.tuning.learned import learn, measured_of, plan_learning
from vllm_operator.tuning.measurements import Measurement, Measurements, compare
from vllm_operator.tuning.plan import plan, plan_service
from vllm_operator.tuning.results import Plan, SloAnswer

from .helpers import as_plan, gpus, model, workload

# Uniform lengths: prompt mean 1,050 tokens, output mean 275.
CHAT = workload(prompt=(100, 2000), output=(50, 500), peak=128)
PROMPT_MEAN, OUTPUT_MEAN = 1050, 275
VERSION = str(TESTED_VERSION)


def raw(**changes: Any) -> dict[str, Any]:
    """A record of Llama-3.1-8B on one H100 under CHAT, measured against TPOT P99 10 ms."""
    record: dict[str, Any] = {
        "model": "meta-llama/Llama-3.1-8B",
        "vllmVersion": VERSION,
        "gpuProduct": "NVIDIA-H100-80GB-HBM3",
        "gpuCount": 1,
        "arguments": {},
        "goodputPerSecond": 10.0,
        "ttft": {"p50": 60, "p99": 200},
        "tpot": {"p50": 7.0, "p99": 9.5},
        "sloAttainment": 0.995,
        "slo": {"tpotP99Milliseconds": 10},
        "workload": {
            "promptTokensMean": PROMPT_MEAN,
            "outputTokensMean": OUTPUT_MEAN,
            "peakConcurrency": 128,
        },
        "predictedGoodputPerSecond": 8.0,
        "measuredAt": "2026-12-07T10:00:00Z",
        "tuning": {"namespace": "team-a", "name": "llama-tune", "trial": "incumbent"},
    }
    record.update(changes)
    return record


def record(**changes: Any) -> Measurement:
    return Measurement.model_validate(raw(**changes))


def in_flight(record: Measurement) -> float:
    """Little's law over the medians, as the module docstring states it."""
    seconds = (record.ttft.p50 + (OUTPUT_MEAN - 1) * record.tpot.p50) / 1000
    return record.goodput_per_second / record.replicas * seconds


def goodput_for(requests_in_flight: float, **changes: Any) -> float:
    """The goodput at which one replica of ``raw(**changes)`` held that many requests."""
    base = record(**changes)
    return requests_in_flight / in_flight(base) * base.goodput_per_second


def planned(
    measurements: Measurements | None,
    *,
    count: int = 1,
    slo: SLO | None = None,
    load: Workload = CHAT,
) -> Plan:
    target = slo or SLO(tpot_p99_milliseconds=10)
    return as_plan(
        plan_learning(
            lambda measured: plan(
                model("Llama-3.1-8B"),
                gpus("H100-80GB", count),
                workload=load,
                slo=target,
                measured=measured,
            ),
            measurements,
            version=VERSION,
        )
    )


def answer(p: Plan) -> SloAnswer:
    assert p.slo is not None
    return p.slo


def measured_notes(p: Plan) -> list[str]:
    return [n for n in p.notes if n.startswith("measured:")]


def test_a_measurement_of_the_shape_meets_the_target_the_roofline_said_it_misses() -> None:
    """One H100: the roofline says TPOT P99 10 ms needs more replicas than the one GPU;
    a replica measured holding more than the peak within the target says it is met."""
    base = planned(None)
    assert not answer(base).met
    held = record(goodputPerSecond=goodput_for(1.2 * 128))
    learned = planned(Measurements.of([held]))
    a = answer(learned)
    assert a.met
    assert (a.replicas, a.gpus_per_replica) == (1, 1)
    assert any("met as measured" in line for line in a.lines)
    assert a.goodput_per_second == pytest.approx(held.goodput_per_second, rel=0.01)
    (note,) = measured_notes(learned)
    assert f"measured: {held.goodput_per_second:,.1f} req/s meeting TPOT P99 10 ms" in note
    assert "tuning team-a/llama-tune trial incumbent, 2026-12-07" in note
    assert "used for the SLO answer" in note
    # The prediction beside it is the roofline's (the plan without the measurement).
    predicted = answer(base).goodput_per_second
    assert predicted is not None
    assert f"predicted {predicted:,.1f}" in note
    error = held.goodput_per_second / predicted - 1
    assert f"(error {error * 100:+.0f} %)" in note


def test_a_measurement_below_the_peak_refutes_a_met_target_and_buys_gpus() -> None:
    """Eight H100s and a loose target: the roofline meets it with one GPU; a replica
    measured holding a tenth of the peak does not, and the plan takes more GPUs."""
    loose = SLO(tpot_p99_milliseconds=40)
    base = planned(None, count=8, slo=loose)
    assert answer(base).met and answer(base).gpus == 1
    slow = record(slo={"tpotP99Milliseconds": 40}, goodputPerSecond=goodput_for(12.8))
    learned = planned(Measurements.of([slow]), count=8, slo=loose)
    assert answer(learned).gpus > 1
    assert not any("as measured" in line for line in answer(base).lines)
    (note,) = measured_notes(learned)
    assert "used for the SLO answer" in note


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"gpuProduct": "NVIDIA-A100-SXM4-80GB"}, None),  # another GPU: not of the shape
        ({"gpuCount": 2}, None),  # another GPUs per replica
        ({"model": "Qwen/Qwen2.5-7B-Instruct"}, None),  # another model
        ({"vllmVersion": "0.9.0"}, None),  # another vLLM release
        ({"slo": {"tpotP99Milliseconds": 25}}, "measured against another SLO"),
        ({"arguments": {"max-num-seqs": "8"}}, "measured with other arguments"),
        (
            {"workload": {"promptTokensMean": 300, "outputTokensMean": 900}},
            "measured under another workload",
        ),
    ],
)
def test_a_record_of_another_shape_or_question_leaves_the_answer_as_predicted(
    changes: dict[str, Any], why: str | None
) -> None:
    base = planned(None)
    other = record(goodputPerSecond=goodput_for(1.2 * 128), **changes)
    learned = planned(Measurements.of([other]))
    assert learned.slo == base.slo
    assert learned.command_args() == base.command_args()
    notes = measured_notes(learned)
    if why is None:
        assert notes == []  # not of the shape: not even shown
    else:
        (note,) = notes
        assert f"not used: {why}" in note


def test_the_latest_applying_record_is_used_and_the_older_noted() -> None:
    old = record(goodputPerSecond=1.0, measuredAt="2026-11-01T00:00:00Z", modelRevision="older")
    new = record(goodputPerSecond=goodput_for(1.2 * 128))
    learned = learn(planned(None), Measurements.of([old, new]), version=VERSION)
    assert learned.measured is not None
    assert learned.measured.goodput_per_second == pytest.approx(new.goodput_per_second)
    assert len(learned.notes) == 2
    assert "used for the SLO answer" in learned.notes[0]
    assert "not used: the later measurement" in learned.notes[1]


def test_what_a_record_becomes() -> None:
    busy = record(replicas=2, goodputPerSecond=20.0)
    m = measured_of(busy)
    assert m.goodput_per_second == 10.0  # one replica's
    assert m.tensor_parallel == 1
    assert m.concurrency == pytest.approx(10.0 * (60 + 274 * 7.0) / 1000)
    assert m.decode_tokens_per_second is None  # many in flight: the TPOT is a batch's
    alone = measured_of(record(goodputPerSecond=0.5, tpot={"p50": 8.0, "p99": 9.0}))
    assert alone.concurrency is not None and alone.concurrency <= 1.5
    assert alone.decode_tokens_per_second == pytest.approx(125.0)


def test_a_broken_record_is_skipped_with_a_note_naming_its_key() -> None:
    good = record(goodputPerSecond=goodput_for(1.2 * 128))
    data = Measurements.of([good]).data()
    data["0badc0ffee000000"] = '{"model": "x", "gpuCount": 0}'
    measurements, skipped = Measurements.readable({"data": data})
    assert list(measurements) == [good]
    (line,) = skipped
    assert "data.0badc0ffee000000" in line and "gpuCount" in line
    learned = as_plan(
        plan_learning(
            lambda measured: plan(
                model("Llama-3.1-8B"),
                gpus("H100-80GB", 1),
                workload=CHAT,
                slo=SLO(tpot_p99_milliseconds=10),
                measured=measured,
            ),
            measurements,
            version=VERSION,
            unread=skipped,
        )
    )
    assert answer(learned).met  # the good record is still used
    assert any(n.startswith("measurements: ") and "0badc0ffee000000" in n for n in learned.notes)


def test_the_tune_command_plans_what_the_operator_plans_from_the_same_records(
    tmp_path: Path,
) -> None:
    held = record(goodputPerSecond=goodput_for(1.2 * 128))
    spec: dict[str, Any] = {
        "model": {
            "name": "Llama-3.1-8B",
            "source": {"huggingFace": {"repo": "meta-llama/Llama-3.1-8B"}},
        },
        "vllmVersion": VERSION,
        "workload": CHAT.to_wire(),
        "slo": {"tpotP99Milliseconds": 10},
    }
    service = tmp_path / "isvc.yaml"
    service.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "inference.vllm-operator.dev/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": "chat", "namespace": "team-a"},
                "spec": spec,
            }
        )
    )
    args = configure(argparse.ArgumentParser()).parse_args(
        ["--service", str(service), "--gpu", "H100-80GB", "--count", "1"]
    )
    measurements = Measurements.of([held])
    from_cli, _ = tune(args, measurements)
    from_operator = plan_service(
        InferenceServiceSpec.model_validate(spec),
        [gpus("H100-80GB", 1)],
        version=DeployedVersion(TESTED_VERSION, "Spec"),
        measurements=measurements,
    )
    cli, operator = as_plan(from_cli), as_plan(from_operator)
    assert answer(cli).met and answer(operator).met
    assert cli.slo == operator.slo
    assert cli.command_args() == operator.command_args()
    assert measured_notes(cli) == measured_notes(operator) != []
    without, _ = tune(args)
    assert not answer(as_plan(without)).met


def test_a_record_of_the_operators_own_command_line_counts_as_the_plans_arguments() -> None:
    """What a tuning run files for its incumbent is the command line the operator rendered
    (render/deployment.py: the model, the address, the served name, the revision, then the
    plan's flags as the release spells them, negations included): it must read back as the
    plan's own arguments, or no plan would ever use an incumbent's measurement."""
    base = planned(None)
    argv = [
        "meta-llama/Llama-3.1-8B", "--host", "0.0.0.0", "--port", "8000",
        "--served-model-name", "llama", "--revision", "main",
        *release_flags(base.arguments, VERSION), "--shutdown-timeout", "30",
    ]  # fmt: skip
    kept = Measurements.of([record(arguments=command_values(argv))])
    (found,) = compare(base, kept)
    assert found.same_arguments, found.differences
