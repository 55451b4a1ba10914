"""The docs stay true to the code: the API reference is what the generator writes today,
the troubleshooting page lists every condition reason the code sets, and the README's
Helm quickstart names a chart, values and manifests that exist and validate.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from vllm_operator.models import InferenceService
from vllm_operator.render.reference import render_reference

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "operator" / "vllm_operator"
TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"
README = REPO / "README.md"
CONDITION_TYPES = {
    "Ready", "Reconciling", "Stalled", "WarmedUp", "ScaleDownBlocked", "ContainersReady",
    "PowerCapped", "LinkDegraded", "ClocksThrottled", "PowerPolicyApplied",
}  # fmt: skip


def test_the_reference_documents_every_spec_field_with_a_description() -> None:
    text = render_reference()
    for field in ("spec.model.source.huggingFace.repo", "spec.gpu.count", "spec.replicas",
                  "status.observedGeneration", "spec.targetRef", "spec.power"):  # fmt: skip
        assert f"`{field}" in text, field
    rows = [line for line in text.splitlines() if line.startswith("| `spec.")]
    undocumented = [r.split("|")[1] for r in rows if not r.split("|")[5].strip()]
    assert not undocumented, f"fields without a description: {undocumented[:10]}"


def _strings(path: Path, pattern: str) -> set[str]:
    return set(re.findall(pattern, path.read_text(), flags=re.S | re.M))


def reasons_in_code() -> set[str]:
    """Condition reasons the operator, the tuner, warmup and the agent set."""
    out: set[str] = set()
    for path in (PKG / "reconcile").glob("*.py"):
        out |= _strings(path, r'Problem\(\s*"([A-Z]\w+)"')
        out |= _strings(path, r'reason="([A-Z]\w+)"')
        out |= _strings(path, r'\bcond\(\s*"\w+",[^"()]*?"([A-Z]\w+)"')
        # Reasons chosen by a conditional expression inside cond(...).
        out |= _strings(path, r'\(\s*"([A-Z][a-z]\w+)"\s+if\b')
        out |= _strings(path, r'\belse\s+"([A-Z][a-z]\w+)"')
        # InferenceBenchmark phases: status("Phase", "Reason", ...)
        out |= _strings(path, r'\bstatus\(\s*"[A-Z]\w+",\s*"([A-Z]\w+)"')
        # The phased kinds' steps: _status(obj, ..., "Phase", "Reason", ...), and a
        # ("Phase", "Reason", message) a helper returns.
        out |= _strings(path, r'\b_status\([^"]*?"[A-Z]\w+",\s*"([A-Z]\w+)"')
        out |= _strings(path, r'\(\s*"(?:Pending|Downloading)",\s*"([A-Z]\w+)",')
        # A step's events: Event("Reason", ...)
        out |= _strings(path, r'\bEvent\(\s*"([A-Z]\w+)"')
        # Reasons named once as constants (a missing dataset or trace).
        out |= _strings(path, r'REASON_\w+: Final = "([A-Z]\w+)"')
        # The stalls written without a pass (an invalid spec, the operator's own failure).
        out |= _strings(path, r'_write_stalled\(\s*api,\s*body,\s*"([A-Z]\w+)"')
    # The pods' failures: the causes read from a log tail, and the (reason, message) pairs.
    pods = PKG / "reconcile" / "pods.py"
    out |= _strings(pods, r'^\s+\(\s*"([A-Z]\w+)",\s*$')
    out |= _strings(pods, r'return\s+\(?\s*"([A-Z]\w+)",')
    for path in (PKG / "tuning").glob("*.py"):
        out |= _strings(path, r'DoesNotFit\(\s*"([A-Z]\w+)"')
        out |= _strings(path, r'reason(?:: FitReason)? = "([A-Z]\w+)"')
    for path in (PKG / "agent").glob("*.py"):
        out |= _strings(path, r'Fact\(\s*[\w.]+,\s*"(?:True|False|Unknown)",\s*"([A-Z]\w+)"')
        out |= _strings(path, r'REASON_\w+: Final = "([A-Z]\w+)"')
        out |= _strings(path, r'\(0x[0-9a-f]+, "([A-Z]\w+)"\)')
        # reason = "A" if x else "B", and the same inside a Fact(...)
        out |= _strings(path, r'reason = "([A-Z]\w+)" if \w+ else "[A-Z]\w+"')
        out |= _strings(path, r'reason = "[A-Z]\w+" if \w+ else "([A-Z]\w+)"')
        out |= _strings(path, r'"[A-Z]\w+" if by_policy else "([A-Z]\w+)"')
        out |= _strings(path, r'cond\.READY, "False", "([A-Z]\w+)"')
    out |= _strings(PKG / "warmup" / "report.py", r'^\s+[A-Z_]+ = "([A-Z]\w+)"$')
    # WarmedUp is a condition type and also the pod gate's reason once warmup succeeded.
    return out - CONDITION_TYPES - {"True", "False", "Unknown"} | {"WarmedUp"} & out


def test_the_reason_finder_finds_the_known_ones() -> None:
    found = reasons_in_code()
    for known in ("NoNodeHasEnoughGPUs", "SecretNotFound", "WeightsDoNotFit", "WarmupFailed",
                  "LimitBelowDefault", "PCIeWidthReduced", "NvmlUnavailable", "TooSlow",
                  "AllReplicasReady", "ScaledToZero", "BenchmarkRunning", "DryRun",
                  "DatasetNotFound", "TraceKeyNotFound"):  # fmt: skip
        assert known in found, known
    assert len(found) >= 50


@pytest.mark.parametrize("reason", sorted(reasons_in_code()))
def test_the_troubleshooting_page_explains_the_reason(reason: str) -> None:
    assert f"| `{reason}` |" in TROUBLESHOOTING.read_text(), (
        f"{reason} is set by the code but not explained in docs/troubleshooting.md"
    )


# --------------------------------------------------------------------------- README


def _helm_section() -> str:
    text = README.read_text()
    start = text.index("## Install with Helm")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_the_readme_helm_quickstart_uses_the_chart_and_real_values() -> None:
    section = _helm_section()
    assert "charts/vllm-operator" in section
    values = yaml.safe_load((REPO / "charts" / "vllm-operator" / "values.yaml").read_text())
    for key in re.findall(r"--set ([\w.]+)=", section):
        node = values
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"--set {key}: no such value"
            node = node[part]


def test_the_readme_helm_quickstart_manifests_validate() -> None:
    section = _helm_section()
    blocks = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)
    isvcs = [
        d for b in blocks for d in yaml.safe_load_all(b) if d and d["kind"] == "InferenceService"
    ]
    assert isvcs
    for doc in isvcs:
        doc.setdefault("metadata", {}).setdefault("namespace", "default")
        InferenceService.model_validate(doc)


def test_the_argocd_docs_name_the_keys_argocd_reads() -> None:
    text = (REPO / "deploy" / "argocd" / "README.md").read_text()
    from vllm_operator.render.crds import all_crds

    kinds = [crd["spec"]["names"]["kind"] for crd in all_crds()]
    assert len(kinds) == 5
    for kind in kinds:
        assert f"resource.customizations.health.inference.vllm-operator.dev_{kind}" in text


def test_the_measurements_page_lists_every_calibration_point_with_its_use() -> None:
    """docs/measurements.md's table of the memory model's calibration points is the data
    file's, each with the use tests/tuning/test_memory_calibration.py makes of it."""
    from tests.tuning.test_memory_calibration import EXCLUDED, FAILED, POINTS, POINTS_YAML, WSL2

    uses = {
        **{i: "not used" for i in EXCLUDED},
        **{i: "apart (WSL2)" for i in WSL2},
        **{i: "failed to start" for i in FAILED},
        **{i: "checked" for i in POINTS},
    }
    text = (REPO / "docs" / "measurements.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \|.*\| ([^|]+?) \|$", text, flags=re.M)
    assert [point for point, _ in rows] == [p["id"] for p in POINTS_YAML]
    assert {point: use for point, use in rows} == {p["id"]: uses[p["id"]] for p in POINTS_YAML}
