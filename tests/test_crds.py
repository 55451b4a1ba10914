"""The CRDs are generated, structural, documented, and the committed copies are current."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_operator.cli import crd_files, main
from vllm_operator.render.crds import all_crds

REPO = Path(__file__).parents[1]
CRDS = {c["spec"]["names"]["kind"]: c for c in all_crds()}


def _schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = CRDS[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for name, child in node.get("properties", {}).items():
        found += _walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        found += _walk(node["additionalProperties"], f"{path}{{}}")
    return found


@pytest.mark.parametrize("seed", ["0", "12345"])
def test_generation_is_the_same_in_another_process_and_hash_seed(seed: str) -> None:
    """Set and dict order, hash randomisation, import order: whatever can differ between
    two runs differs between this process and a fresh one with another PYTHONHASHSEED."""
    script = (
        "import json, sys; from vllm_operator.cli import crd_files; "
        "json.dump(crd_files(), sys.stdout)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": seed},
        timeout=120,
    )
    assert json.loads(proc.stdout) == crd_files()


def test_the_committed_crds_are_current() -> None:
    assert main(["crds", "--check", "--out", str(REPO / "crds")]) == 0


def test_check_reports_a_stale_file(tmp_path: Path) -> None:
    assert main(["crds", "--out", str(tmp_path)]) == 0
    victim = next(tmp_path.glob("*.yaml"))
    victim.write_text(victim.read_text() + "# edited by hand\n")
    assert main(["crds", "--check", "--out", str(tmp_path)]) == 1


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_the_schema_is_structural(kind: str) -> None:
    for path, node in _walk(_schema(kind)):
        assert "$ref" not in node and "title" not in node and "$defs" not in node, path
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
            continue
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), (
            f"{kind}{path} has no type"
        )
        assert "anyOf" not in node and "oneOf" not in node, f"{kind}{path} is not structural"
        assert not ("properties" in node and "additionalProperties" in node), path
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound, True) is True, f"{kind}{path}: {bound} must be boolean"
        if node.get("type") == "object" and "properties" in node:
            for req in node.get("required", []):
                assert req in node["properties"], f"{kind}{path} requires unknown {req}"


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_every_field_under_spec_and_status_is_described(kind: str) -> None:
    undocumented = [
        path
        for path, node in _walk(_schema(kind))
        if path.startswith((".spec.", ".status."))
        and not path.endswith(("[]", "{}"))
        and not node.get("description")
    ]
    assert not undocumented, f"{kind} fields without a description: {undocumented}"


def test_status_subresource_on_every_kind_and_scale_on_inference_service() -> None:
    for kind, crd in CRDS.items():
        version = crd["spec"]["versions"][0]
        assert "status" in version["subresources"], kind
    scale = CRDS["InferenceService"]["spec"]["versions"][0]["subresources"]["scale"]
    assert scale == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }


def test_cross_field_rules_are_cel_in_the_schema() -> None:
    rules = [
        rule["rule"]
        for kind in CRDS
        for _, node in _walk(_schema(kind))
        for rule in node.get("x-kubernetes-validations", [])
    ]
    assert any("huggingFace" in r for r in rules)
    assert any("oldSelf" in r for r in rules), "benchmark spec is immutable"
    assert len(rules) >= 20


def test_defaults_reach_nested_objects() -> None:
    spec = _schema("InferenceService")["properties"]["spec"]["properties"]
    assert spec["gpu"]["default"] == {"count": "auto", "products": []}
    assert spec["gpu"]["properties"]["count"]["default"] == "auto"
    assert spec["replicas"]["default"] == 1
    assert "default" not in spec["model"]["properties"]["quantization"], "optional stays unset"


def test_printer_columns_and_names() -> None:
    isvc = CRDS["InferenceService"]
    columns = [c["name"] for c in isvc["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:1] == ["Ready"] and "Model" in columns and "GPUs" in columns
    # isvc is KServe's short name for its own InferenceService (e2e/test_api.py).
    assert isvc["spec"]["names"]["shortNames"] == ["vis"]
    bench = CRDS["InferenceBenchmark"]["spec"]["versions"][0]["additionalPrinterColumns"]
    assert "Phase" in [c["name"] for c in bench]
    assert CRDS["GPUNode"]["spec"]["scope"] == "Cluster"
    # Each column reads a field the status has: a count of GPUs (not the first GPU's
    # index), the name requests give (not spec.model.name, empty when left out).
    for crd, column, path in (
        ("GPUNode", "GPUs", ".status.gpuCount"),
        ("InferenceService", "Model", ".status.servedModelName"),
    ):
        version = CRDS[crd]["spec"]["versions"][0]
        (found,) = [c for c in version["additionalPrinterColumns"] if c["name"] == column]
        assert found["jsonPath"] == path
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
        assert path.split(".")[-1] in status


def test_out_dash_writes_every_crd_to_standard_output(capsys: pytest.CaptureFixture[str]) -> None:
    """`vllm-operator crds --out - | kubectl apply -f -`: one YAML stream, nothing written."""
    import yaml

    assert main(["crds", "--out", "-"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert docs == [yaml.safe_load(text) for text in crd_files().values()]
    assert not Path("-").exists()


@pytest.mark.parametrize(
    ("argv", "said", "code"),
    [
        (["--check", "--out", "{tmp}/none"], "--out {tmp}/none: no such folder", 2),
        (["--check", "--out", "-"], "--check needs a folder to check, not -", 2),
        (["--out", "{tmp}/file/crds"], "--out {tmp}/file/crds: Not a directory", 1),
    ],
    ids=["check a missing folder", "check standard output", "write under a file"],
)
def test_a_folder_it_cannot_use_is_one_line(
    argv: list[str], said: str, code: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    assert main(["crds", *(a.format(tmp=tmp_path) for a in argv)]) == code
    captured = capsys.readouterr()
    assert captured.err == f"vllm-operator crds: {said.format(tmp=tmp_path)}\n"
    assert captured.out == ""


# --------------------------------------------------------------------------- conditions

# The kubebuilder markers metav1.Condition carries and the OpenAPI keys they become.
_MARKERS = {
    "Pattern": "pattern",
    "MaxLength": "maxLength",
    "MinLength": "minLength",
    "Minimum": "minimum",
    "Enum": "enum",
    "Format": "format",
}


def _metav1_condition() -> tuple[dict[str, dict[str, Any]], set[str]]:
    """metav1.Condition's fields as its own source declares them (the kubebuilder markers
    in k8s.io/apimachinery's pkg/apis/meta/v1/types.go, the version tests/kstatus pins,
    from the Go module proxy), and which of them are required."""
    proc = subprocess.run(
        ["go", "mod", "download", "-json", "k8s.io/apimachinery"],
        cwd=REPO / "tests" / "kstatus",
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    source = Path(json.loads(proc.stdout)["Dir"]) / "pkg/apis/meta/v1/types.go"
    body = source.read_text().split("\ntype Condition struct {\n", 1)[1].split("\n}\n", 1)[0]
    fields: dict[str, dict[str, Any]] = {}
    required: set[str] = set()
    markers: dict[str, Any] = {}
    is_required = False
    for line in (raw.strip() for raw in body.splitlines()):
        if line.startswith("// +kubebuilder:validation:"):
            key, _, value = line.removeprefix("// +kubebuilder:validation:").partition("=")
            if key == "Required":
                is_required = True
            elif key == "Enum":
                markers["enum"] = value.split(";")
            elif key in ("MaxLength", "MinLength", "Minimum"):
                markers[_MARKERS[key]] = int(value)
            elif key in _MARKERS:
                markers[_MARKERS[key]] = value.strip("`")
            elif key == "Type":
                markers["type"] = value
        elif line and not line.startswith("//"):
            _, go_type, tag = line.split(None, 2)
            name = tag.split('json:"', 1)[1].split(",", 1)[0].split('"', 1)[0]
            if go_type == "int64":
                markers.update(type="integer", format="int64")
            markers.setdefault("type", "string")
            fields[name] = markers
            if is_required:
                required.add(name)
            markers, is_required = {}, False
    return fields, required


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_status_conditions_are_metav1_conditions_in_a_list_keyed_by_type(kind: str) -> None:
    want, required = _metav1_condition()
    assert set(want) == {
        "type",
        "status",
        "observedGeneration",
        "lastTransitionTime",
        "reason",
        "message",
    }
    assert want["reason"]["minLength"] == 1 and "pattern" in want["type"]  # the parse worked
    conditions = _schema(kind)["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    items = conditions["items"]
    assert set(items["required"]) == required
    for name, rules in want.items():
        got = {k: v for k, v in items["properties"][name].items() if k != "description"}
        assert got == rules, name
