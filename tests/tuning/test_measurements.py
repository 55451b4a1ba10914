"""tuning/measurements.py: measured records read and written (a list or the ConfigMap),
their keys, lookup by shape, the prediction error, errors that name the record and field;
and ``vllm-operator tune --measurements``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_operator.tune_cli import main
from vllm_operator.tuning.measurements import (
    Measurement,
    Measurements,
    MeasurementsError,
    Shape,
    prediction_error,
    record_key,
)


def raw(**changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "model": "meta-llama/Llama-3.1-8B",
        "vllmVersion": "0.32.0",
        "gpuProduct": "NVIDIA-H100-80GB-HBM3",
        "gpuCount": 1,
        "interconnect": "PCIe",
        "arguments": {"max-num-seqs": "8", "--enforce-eager": ""},
        "goodputPerSecond": 12.5,
        "ttft": {"p50": 40, "p99": 180},
        "tpot": {"p50": 9.5, "p99": 14},
        "sloAttainment": 0.993,
        "slo": {"ttftP99Milliseconds": 500, "tpotP99Milliseconds": 20},
        "workload": {"promptTokensMean": 800, "outputTokensMean": 200, "peakConcurrency": 32},
        "predictedGoodputPerSecond": 10,
        "measuredAt": "2026-12-10T12:00:00Z",
        "tuning": {"namespace": "team-a", "name": "llama-tune", "trial": "seqs-8"},
    }
    record.update(changes)
    return {k: v for k, v in record.items() if v is not None}


def record(**changes: Any) -> Measurement:
    return Measurement.model_validate(raw(**changes))


# --------------------------------------------------------------------------- records


def test_arguments_are_sorted_without_dashes_and_a_bare_flag_is_true() -> None:
    assert list(record().arguments.items()) == [("enforce-eager", "true"), ("max-num-seqs", "8")]


def test_a_list_round_trips_through_yaml_and_json() -> None:
    measurements = Measurements.of([record(), record(gpuCount=2, goodputPerSecond=20)])
    for fmt in ("yaml", "json"):
        again = Measurements.parse(measurements.dump(fmt))  # type: ignore[arg-type]
        assert again == measurements
        assert len(again) == 2


def test_the_config_map_round_trips_with_one_record_per_key() -> None:
    measurements = Measurements.of([record(), record(gpuCount=2)])
    text = measurements.dump("yaml", config_map_namespace="vllm-operator")
    manifest = yaml.safe_load(text)
    assert manifest["metadata"] == {
        "name": "vllm-operator-measurements",
        "namespace": "vllm-operator",
    }
    assert sorted(manifest["data"]) == sorted(record_key(r) for r in measurements)
    assert all(isinstance(v, str) for v in manifest["data"].values())
    assert Measurements.parse(text) == measurements


def test_the_key_ignores_what_was_measured_and_when_but_not_the_arguments_or_slo() -> None:
    base = record_key(record())
    assert record_key(record(goodputPerSecond=3, measuredAt="2027-01-01T00:00:00Z")) == base
    # A flag that does not bear on performance is no new measurement either.
    assert (
        record_key(record(arguments={"max-num-seqs": "8", "enforce-eager": "true", "port": "1"}))
        == base
    )
    assert record_key(record(arguments={"max-num-seqs": "16", "enforce-eager": ""})) != base
    assert record_key(record(slo={"ttftP99Milliseconds": 400})) != base
    assert record_key(record(gpuCount=2)) != base
    assert len(base) == 16 and int(base, 16) >= 0


def test_of_two_records_with_one_key_the_later_measured_stays() -> None:
    old = record(goodputPerSecond=5, measuredAt="2026-01-01T00:00:00Z")
    new = record(goodputPerSecond=7, measuredAt="2026-06-01T00:00:00Z")
    for order in ([old, new], [new, old]):
        (kept,) = Measurements.of(order)
        assert kept.goodput_per_second == 7


def test_the_prediction_error_is_measured_over_predicted_less_one() -> None:
    assert prediction_error(
        record(goodputPerSecond=12.5, predictedGoodputPerSecond=10)
    ) == pytest.approx(0.25)
    assert prediction_error(
        record(goodputPerSecond=6, predictedGoodputPerSecond=8)
    ) == pytest.approx(-0.25)
    assert prediction_error(record(predictedGoodputPerSecond=None)) is None
    assert prediction_error(record(predictedGoodputPerSecond=0)) is None


# --------------------------------------------------------------------------- lookup


@pytest.mark.parametrize(
    ("shape", "found"),
    [
        pytest.param(
            Shape("Llama-3.1-8B", "H100-80GB", 1),
            True,
            id="a catalog name and GPU name find the repo's record on the node's product",
        ),
        pytest.param(
            Shape("meta-llama/llama-3.1-8b", "NVIDIA H100 80GB HBM3", 1, "0.32.0"),
            True,
            id="case and version alike",
        ),
        pytest.param(Shape("Llama-3.1-8B", "H100-80GB", 2), False, id="another GPU count"),
        pytest.param(Shape("Llama-3.1-8B", "A100-80GB", 1), False, id="another GPU"),
        pytest.param(Shape("Llama-3.1-8B-Instruct", "H100-80GB", 1), False, id="another model"),
        pytest.param(
            Shape("Llama-3.1-8B", "H100-80GB", 1, "0.31.0"), False, id="another vLLM version"
        ),
    ],
)
def test_lookup_finds_records_of_the_same_shape(shape: Shape, found: bool) -> None:
    assert bool(Measurements.of([record()]).lookup(shape)) is found


def test_lookup_reads_the_version_from_the_image_when_none_is_given() -> None:
    image_only = record(vllmVersion=None, image="vllm/vllm-openai:v0.31.0")
    measurements = Measurements.of([image_only])
    assert measurements.lookup(Shape("Llama-3.1-8B", "H100-80GB", 1, "0.31.0"))
    assert not measurements.lookup(Shape("Llama-3.1-8B", "H100-80GB", 1, "0.32.0"))


def test_lookup_lists_the_latest_first() -> None:
    older = record(measuredAt="2026-01-01T00:00:00Z", arguments={"max-num-seqs": "4"})
    newer = record(measuredAt="2026-02-01T00:00:00Z", arguments={"max-num-seqs": "16"})
    found = Measurements.of([older, newer]).lookup(Shape("Llama-3.1-8B", "H100", 1))
    assert [r.arguments["max-num-seqs"] for r in found] == ["16", "4"]


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("records", "words"),
    [
        pytest.param(
            [raw(), raw(goodputPerSecond=-1)],
            ["record 1", "goodputPerSecond"],
            id="a negative goodput names record 1 and the field",
        ),
        pytest.param(
            [raw(ttft={"p50": 50, "p99": 10})],
            ["record 0", "ttft", "p99 (10) is below p50 (50)"],
            id="percentiles out of order",
        ),
        pytest.param(
            [raw(sloAttainment=1.5)], ["record 0", "sloAttainment"], id="an attainment above one"
        ),
        pytest.param(
            [raw(vllmVersion=None)], ["record 0", "vllmVersion or image"], id="no release"
        ),
        pytest.param(
            [raw(vllmVersion="latest")], ["record 0", "not a version"], id="a version that is none"
        ),
        pytest.param(
            [raw(workload={"promptTokensMean": 800})],
            ["record 0", "workload.outputTokensMean", "required"],
            id="a missing nested field",
        ),
        pytest.param(
            [raw(colour="blue")], ["record 0", "colour", "Extra inputs"], id="an unknown field"
        ),
        pytest.param(
            [raw(), "text"], ["record 1", "expected a mapping"], id="a record that is no mapping"
        ),
    ],
)
def test_an_invalid_record_names_its_index_and_field(records: list[Any], words: list[str]) -> None:
    with pytest.raises(MeasurementsError) as caught:
        Measurements.parse(json.dumps(records))
    for word in words:
        assert word in str(caught.value)


def test_an_invalid_config_map_record_names_its_key() -> None:
    manifest = {
        "kind": "ConfigMap",
        "data": {"abc": json.dumps(raw()), "bad": json.dumps(raw(gpuCount=0))},
    }
    with pytest.raises(MeasurementsError, match=r"record 1 \(data\.bad\): gpuCount"):
        Measurements.parse(yaml.safe_dump(manifest))


def test_a_document_that_is_neither_a_list_nor_a_config_map_is_refused() -> None:
    with pytest.raises(MeasurementsError, match="a list of measurement records or a ConfigMap"):
        Measurements.parse("kind: Deployment\n")
    assert not Measurements.parse("")


# --------------------------------------------------------------------------- tune


def tune(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, records: list[dict[str, Any]], *extra: str
) -> tuple[int, str, str]:
    path = tmp_path / "measured.yaml"
    path.write_text(yaml.safe_dump(records))
    code = main(["Llama-3.1-8B", "--gpu", "H100-80GB", "--measurements", str(path), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_tune_shows_a_measurement_of_the_shape_beside_the_plan(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    other_gpu = raw(gpuProduct="NVIDIA-A100-SXM4-80GB", goodputPerSecond=99)
    code, out, _ = tune(capsys, tmp_path, [raw(), other_gpu])
    assert code == 0
    measured = out[out.index("\nMeasured (") :]
    assert "1 record(s) of Llama-3.1-8B on 1x H100-80GB" in measured
    assert "12.50/s" in measured and "10.00/s" in measured and "+25%" in measured
    assert "99.00/s" not in measured  # the A100's record is of another shape
    assert "max-num-seqs 8 (plan: 256)" in measured
    assert "team-a/llama-tune seqs-8" in measured


def test_tune_says_when_no_record_is_of_the_shape(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = tune(capsys, tmp_path, [raw(gpuCount=4)])
    assert code == 0
    assert "Measured: no record in" in out and "is of Llama-3.1-8B on 1x H100-80GB" in out


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_tune_yaml_and_json_carry_the_measurement_and_its_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str
) -> None:
    code, out, _ = tune(
        capsys, tmp_path, [raw(goodputPerSecond=6, predictedGoodputPerSecond=8)], "-o", fmt
    )
    assert code == 0
    doc = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    (entry,) = doc["measured"]["records"]
    assert entry["goodputPerSecond"] == 6
    assert entry["predictedGoodputPerSecond"] == 8
    assert entry["predictionError"] == pytest.approx(-0.25)
    assert entry["sameArguments"] is False
    assert entry["differences"]["max-num-seqs"] == {"planned": "256", "measured": "8"}
    assert doc["result"] == "Plan"


def test_tune_marks_a_record_of_the_plans_own_arguments(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = tune(
        capsys,
        tmp_path,
        [raw(arguments={"max-num-seqs": "256", "enable-chunked-prefill": "true"})],
        "-o",
        "json",
    )
    assert code == 0
    (entry,) = json.loads(out)["measured"]["records"]
    assert entry["sameArguments"] is True and "differences" not in entry


def test_tune_refuses_a_bad_file_naming_the_record_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = tune(capsys, tmp_path, [raw(), raw(tpot={"p50": 1})])
    assert code == 2 and out == ""
    assert "--measurements" in err and "record 1" in err and "tpot.p99" in err


def test_tune_refuses_a_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(
        ["Llama-3.1-8B", "--gpu", "H100-80GB", "--measurements", str(tmp_path / "none.yaml")]
    )
    _, err = capsys.readouterr()
    assert code == 2 and "cannot read it" in err
