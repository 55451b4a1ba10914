"""``vllm-operator render``: the objects it prints are the reconcile's own.

Each sample and golden service is rendered by the command and, beside it, reconciled
against a recording cluster holding a node of the same GPU shape: the two must apply the
same objects in the same order (ownerReferences aside, which render leaves out), and the
golden files the builders' tests pin must be what render prints for their services.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes import RecordingCluster
from tests.specs import BASE, GOLDEN_CASES, node
from vllm_operator.cli import build_parser
from vllm_operator.constants import DEFAULT_SERVING_IMAGE
from vllm_operator.reconcile.inference_service import reconcile_inference_service
from vllm_operator.render_cli import main
from vllm_operator.settings import OperatorSettings

REPO = Path(__file__).parents[1]
GOLDEN = REPO / "tests" / "golden"
EXAMPLES = REPO / "examples"
IMAGE = "registry.local/vllm:test"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

# A GPU shape: (product, count, memory MiB, interconnect), as the flags give it and as GPU
# Feature Discovery and the node agent label a node of it.
Shape = tuple[str, int, int, str]
H100X8: Shape = ("NVIDIA-H100-80GB-HBM3", 8, 81559, "nvlink")
L40S: Shape = ("NVIDIA-L40S", 1, 46068, "pcie")
L4X4: Shape = ("NVIDIA-L4", 4, 23034, "pcie")
RTX4090X2: Shape = ("NVIDIA-GeForce-RTX-4090", 2, 24564, "pcie")

# Every InferenceService sample of the repo, with a shape it fits (its spec.gpu.products'
# and its node selector's).
SAMPLES: dict[str, Shape] = {
    "inferenceservice-minimal.yaml": L40S,
    "inferenceservice-lora.yaml": L40S,
    "inferenceservice-pvc.yaml": H100X8,
    "inferenceservice-full.yaml": RTX4090X2,
    "dev-sample.yaml": L4X4,
}


def _flags(shape: Shape) -> list[str]:
    product, count, memory, interconnect = shape
    return ["--gpu", product, "--count", str(count), "--gpu-memory", str(memory),
            "--interconnect", interconnect]  # fmt: skip


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own refusals
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _rendered(capsys: pytest.CaptureFixture[str], path: Path, shape: Shape) -> list[Any]:
    code, out, err = run(
        capsys, "-f", str(path), *_flags(shape), "--default-image", IMAGE, "-o", "json"
    )
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["apiVersion"], doc["kind"]) == ("v1", "List")
    items: list[Any] = doc["items"]
    return items


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _service_doc(path: Path) -> dict[str, Any]:
    return next(d for d in _documents(path) if d["kind"] == "InferenceService")


def _in_cluster(body: dict[str, Any]) -> dict[str, Any]:
    """The manifest as the apiserver stores it: in a namespace, with a uid."""
    stored = copy.deepcopy(body)
    stored["metadata"].setdefault("namespace", "team-a")
    stored["metadata"].setdefault("uid", "0a1b2c3d-0000-4000-8000-000000000009")
    stored["metadata"].setdefault("generation", 1)
    return stored


def _without_owner(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` without what render leaves out (its owner) and the fake adds (a uid)."""
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("ownerReferences", None)
    obj["metadata"].pop("uid", None)
    return obj


async def _reconciled(
    body: dict[str, Any], nodes: list[dict[str, Any]], *others: dict[str, Any]
) -> list[dict[str, Any]]:
    """What the reconcile applies, in order, on a cluster of ``nodes`` (and ``others``)."""
    api = RecordingCluster()
    for obj in (*nodes, *others, body):
        api.put(obj)
    await reconcile_inference_service(
        api, body, settings=OperatorSettings(default_image=IMAGE), now=NOW
    )
    applied = [(k, n) for verb, k, n in api.calls if verb == "apply" and "/" not in k]
    ns = body["metadata"]["namespace"]
    found = {(k, n): o for (_, k, o_ns, n), o in api.objects.items() if o_ns == ns}
    return [_without_owner(found[key]) for key in applied]


def _pool(shape: Shape, size: int = 1) -> list[dict[str, Any]]:
    """``size`` nodes of ``shape``, named unlike render's own."""
    return [node(f"pool-{index}", *shape) for index in range(size)]


@pytest.mark.parametrize("sample", sorted(SAMPLES))
async def test_each_sample_renders_what_the_reconcile_applies(
    sample: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = _in_cluster(_service_doc(EXAMPLES / sample))
    path = tmp_path / sample
    path.write_text(yaml.safe_dump(body))
    rendered = _rendered(capsys, path, SAMPLES[sample])
    assert [o["kind"] for o in rendered][-1] == "Deployment"
    assert rendered == await _reconciled(body, _pool(SAMPLES[sample]))


def test_every_inference_service_sample_is_rendered() -> None:
    samples = {
        p.name
        for p in EXAMPLES.glob("*.yaml")
        if any(d.get("kind") == "InferenceService" for d in _documents(p))
    }
    assert samples == set(SAMPLES)


# The golden cases whose plan on the golden nodes (tests/specs.py NODES) is the H100 node's
# and whose strategy is a first apply's (the full-pool case resolves Auto on live pods).
ON_H100 = ["single-gpu-hf", "tp2-with-shm", "cpu-pinning", "hf-token", "pvc", "rollout-surge",
           "rollout-replace"]  # fmt: skip


@pytest.mark.parametrize("case", ON_H100)
def test_render_prints_the_golden_children(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = copy.deepcopy(BASE)
    body["spec"].update(GOLDEN_CASES[case])
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump(body))
    code, out, err = run(
        capsys, "-f", str(path), *_flags(H100X8), "--default-image", DEFAULT_SERVING_IMAGE
    )
    assert code == 0, err
    rendered = {d["kind"]: d for d in yaml.safe_load_all(out) if d is not None}
    golden = {d["kind"]: _without_owner(d) for d in _documents(GOLDEN / f"{case}.yaml")}
    assert rendered == golden


LLAMA_405B = {"huggingFace": {"repo": "meta-llama/Llama-3.1-405B-Instruct"}}


def test_a_multi_node_plan_renders_the_golden_leaderworkerset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = copy.deepcopy(BASE)
    body["spec"].update({"model": {"source": LLAMA_405B}, "warmup": {"enabled": False}})
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump(body))
    code, out, err = run(
        capsys, "-f", str(path), *_flags(H100X8), "--default-image", DEFAULT_SERVING_IMAGE
    )
    assert code == 0, err
    docs = [d for d in yaml.safe_load_all(out) if d is not None]
    assert [d["kind"] for d in docs] == ["Service", "PodDisruptionBudget", "LeaderWorkerSet"]
    assert docs[-1] == _without_owner(
        yaml.safe_load((GOLDEN / "lws-405b-ethernet.yaml").read_text())
    )
    assert "nodes: 2 alike" in out


async def test_a_multi_node_plan_renders_what_the_reconcile_applies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = _in_cluster(
        {**BASE, "spec": {"model": {"source": LLAMA_405B}, "replicas": 2,
                          "autoscaling": {"enabled": True, "mode": "HPA", "minReplicas": 2,
                                          "maxReplicas": 4}}}
    )  # fmt: skip
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump(body))
    rendered = _rendered(capsys, path, H100X8)
    kinds = [o["kind"] for o in rendered]
    assert kinds == ["Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "LeaderWorkerSet"]
    assert rendered == await _reconciled(body, _pool(H100X8, 2))


CACHE = {
    "apiVersion": "inference.vllm-operator.dev/v1alpha1",
    "kind": "ModelCache",
    "metadata": {"name": "qwen", "namespace": "team-a"},
    "spec": {"source": {"huggingFace": {"repo": "Qwen/Qwen2.5-0.5B-Instruct"}},
             "storage": {"size": "5Gi"}},
}  # fmt: skip


async def test_a_service_on_a_model_cache_is_served_from_its_claim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = _in_cluster({**BASE, "spec": {"model": {"source": {"cache": {"name": "qwen"}}}}})
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump_all([CACHE, body]))
    rendered = _rendered(capsys, path, L40S)
    pod = rendered[-1]["spec"]["template"]["spec"]
    claim = {"claimName": "qwen-weights", "readOnly": True}
    assert {"name": "model", "persistentVolumeClaim": claim} in pod["volumes"]
    # The cluster's cache as its reconcile leaves it once the download is verified.
    done = {**CACHE, "status": {"phase": "Ready", "claimName": "qwen-weights", "path": "/model"}}
    assert rendered == await _reconciled(body, _pool(L40S), done)


def test_a_service_on_a_model_cache_not_in_the_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = {**BASE, "spec": {"model": {"source": {"cache": {"name": "qwen"}}}}}
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump(body))
    code, out, err = run(capsys, "-f", str(path), *_flags(L40S))
    assert (code, out) == (2, "")
    assert "spec.model.source.cache names ModelCache qwen" in err


async def test_a_tuning_given_renders_its_winner_as_the_reconcile_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.reconcile.test_measured import WIN, tuning

    spec = {**BASE["spec"], "tuning": {"overrides": {"max-num-seqs": "64"}}}
    body = _in_cluster(
        {**BASE, "spec": {**spec, "tuning": {**spec["tuning"], "measuredRef": {"name": "tune"}}}}
    )
    result = tuning(winner=WIN, namespace="elsewhere")
    (tmp_path / "isvc.yaml").write_text(yaml.safe_dump(body))
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(result))
    argv = ["-f", str(tmp_path / "isvc.yaml"), *_flags(L40S), "--default-image", IMAGE]
    code, out, err = run(capsys, *argv, "--tuning", str(tmp_path / "tune.yaml"), "-o", "json")
    assert code == 0, err
    rendered = json.loads(out)["items"]
    args = rendered[-1]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == "8"
    # The cluster's tuning is in the service's namespace (the file's is taken as such).
    assert rendered == await _reconciled(body, _pool(L40S), tuning(winner=WIN))
    code, out, _ = run(capsys, *argv, "--tuning", str(tmp_path / "tune.yaml"))
    head = out.split("\n---\n")[0]
    assert "measured winner seqs-8" in head.replace("\n#   ", " ")
    assert "--max-num-seqs 8 [Measured]" in out
    code, out, _ = run(capsys, *argv)
    assert "InferenceTuning tune, which does not exist" in out.replace("\n#   ", " ")


def test_measurements_given_are_learned_from_as_the_operator_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.reconcile.test_measurements_plan import RECORD

    (tmp_path / "isvc.yaml").write_text(yaml.safe_dump(_in_cluster(BASE)))
    argv = ["-f", str(tmp_path / "isvc.yaml"), *_flags(RTX4090X2), "--default-image", IMAGE]
    records = tmp_path / "measured.yaml"
    records.write_text(yaml.safe_dump([RECORD]))
    code, out, err = run(capsys, *argv, "--measurements", str(records))
    assert code == 0, err
    text = out.replace("\n#   ", " ")
    assert "measured: 13.5 req/s meeting TTFT P99 300 ms with max-num-seqs 8" in text
    assert "(error +48 %)" in text
    code, out, _ = run(capsys, *argv)
    assert "measured: " not in out
    records.write_text(yaml.safe_dump([{**RECORD, "gpuCount": 0}]))
    code, out, err = run(capsys, *argv, "--measurements", str(records))
    assert (code, out) == (2, "")
    assert "record 0" in err and "gpuCount" in err


def test_a_tuning_file_without_a_tuning_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty.yaml").write_text(yaml.safe_dump(BASE))
    path = EXAMPLES / "inferenceservice-minimal.yaml"
    code, out, err = run(
        capsys, "-f", str(path), *_flags(L40S), "--tuning", str(tmp_path / "empty.yaml")
    )
    assert (code, out) == (2, "")
    assert "empty.yaml: the file holds no InferenceTuning" in err


def test_json_and_yaml_hold_the_same_objects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = EXAMPLES / "inferenceservice-full.yaml"
    code, out, _ = run(capsys, "-f", str(path), *_flags(RTX4090X2), "--default-image", IMAGE)
    assert code == 0
    from_yaml = [d for d in yaml.safe_load_all(out) if d is not None]
    listed = _rendered(capsys, path, RTX4090X2)
    assert [o["kind"] for o in listed] == ["Service", "PodDisruptionBudget", "Deployment"]
    assert listed == from_yaml


def test_the_yaml_explains_the_plan_and_what_was_assumed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = EXAMPLES / "inferenceservice-minimal.yaml"
    code, out, _ = run(capsys, "-f", str(path), *_flags(L40S))
    assert code == 0
    head, *docs = out.split("\n---\n")
    assert "# vllm-operator render: InferenceService qwen-small" in head
    assert "rollout: Surge (Auto: the first pods, nothing to replace; first apply" in head
    assert "ownerReferences: left out" in head
    assert "namespace: none given" in head
    deployment = docs[-1]
    assert deployment.startswith("# Deployment qwen-small\n")
    assert "#   --tensor-parallel-size 1 [Tuner]: " in deployment
    assert "ownerReferences" not in yaml.safe_load(deployment)["metadata"]
    assert "namespace" not in yaml.safe_load(deployment)["metadata"]


def test_the_namespace_flag_fills_a_manifest_without_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = EXAMPLES / "inferenceservice-minimal.yaml"
    code, out, _ = run(capsys, "-f", str(path), *_flags(L40S), "-n", "team-b", "-o", "json")
    assert code == 0
    assert {o["metadata"]["namespace"] for o in json.loads(out)["items"]} == {"team-b"}


def test_nothing_fits_exits_1_with_the_tuners_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = {**BASE, "spec": {"model": {"source": LLAMA_405B}}}
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump(body))
    code, out, err = run(capsys, "-f", str(path), "--gpu", "L4")
    assert (code, out) == (1, "")
    assert "nothing fits (WeightsDoNotFit)" in err
    assert "[Quantize]" in err


def test_a_model_of_unknown_shape_is_rendered_from_the_spec_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = {**BASE, "spec": {"model": {"source": {"huggingFace": {"repo": "acme/private"}}},
                             "gpu": {"count": 2}}}  # fmt: skip
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump(body))
    code, out, err = run(capsys, "-f", str(path), *_flags(H100X8))
    assert code == 0
    assert "not planned: the model's architecture is unknown" in err
    assert "planned by the spec alone" in out
    container = [d for d in yaml.safe_load_all(out) if d][-1]["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["args"][container["args"].index("--tensor-parallel-size") + 1] == "2"


def test_a_node_selector_the_shape_contradicts_is_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = EXAMPLES / "inferenceservice-full.yaml"  # selects gpu-interconnect=pcie
    code, _, err = run(capsys, "-f", str(path), "--gpu", "NVIDIA-GeForce-RTX-4090",
                       "--count", "2", "--interconnect", "nvlink")  # fmt: skip
    assert code == 1
    assert "gpu-interconnect=pcie where the GPU shape's node has nvlink" in err


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param({"replicas": -1}, "spec.replicas", id="negative replicas"),
        pytest.param({"gpu": {"count": "lots"}}, "spec.gpu.count", id="a GPU count in words"),
        pytest.param({"rollout": "Sideways"}, "spec.rollout", id="an unknown rollout"),
    ],
)
def test_a_bad_field_exits_2_naming_it(
    spec: dict[str, Any], field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = copy.deepcopy(BASE)
    body["spec"].update(spec)
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump(body))
    code, out, err = run(capsys, "-f", str(path), *_flags(L40S))
    assert (code, out) == (2, "")
    assert err.startswith(f"vllm-operator render: {path} is not an InferenceService: ")
    # The field's path and what is wrong, on one line: not the validation library's own
    # report (its error codes, the input echoed, a documentation link per error).
    assert f": {field}: " in err and err.count("\n") == 1, err
    assert "Traceback" not in err and "[type=" not in err and "pydantic.dev" not in err, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["-f", "/nonexistent.yaml", "--gpu", "L4"], "cannot read /nonexistent.yaml",
                     id="a missing manifest"),
        pytest.param(["-f", str(EXAMPLES / "inferenceservice-minimal.yaml")], "give --gpu",
                     id="no GPUs"),
        pytest.param(["-f", str(EXAMPLES / "inferenceservice-minimal.yaml"), "--gpu", "L4",
                      "--gpu-node", "/nonexistent.yaml"], "cannot read /nonexistent.yaml",
                     id="a missing GPUNode file"),
        pytest.param(["-f", str(EXAMPLES / "inferenceservice-minimal.yaml"), "--gpu", "Acme-X1"],
                     "give its memory", id="an unknown GPU"),
        pytest.param(["-f", str(EXAMPLES / "inferenceservice-minimal.yaml"), "--gpu", "L4",
                      "--interconnect", "warp"], "--interconnect 'warp' is not one",
                     id="an unknown interconnect"),
        pytest.param(["-f", str(EXAMPLES / "dev-sample.yaml"), "--gpu", "L4", "-n", "other"],
                     "metadata.namespace", id="a namespace the manifest contradicts"),
        pytest.param(["--gpu", "L4"], "the following arguments are required: --service/-f",
                     id="no manifest"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_with_a_message(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if "-n" in argv:
        body = {**_service_doc(EXAMPLES / "dev-sample.yaml")}
        body["metadata"] = {**body["metadata"], "namespace": "team-a"}
        (tmp_path / "ns.yaml").write_text(yaml.safe_dump(body))
        argv = ["-f", str(tmp_path / "ns.yaml"), *argv[2:]]
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert message in err
    assert "Traceback" not in err


async def test_a_gpunode_manifest_gives_the_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two L40S cards whose links the agent read: PCIe through a switch, better than the
    # host bridge a label would say.
    gpus = [
        {
            "index": i,
            "uuid": f"GPU-{i}",
            "product": "NVIDIA L40S",
            "memoryBytes": 48305799168,
            "computeCapability": "8.9",
        }
        for i in range(2)
    ]
    gpunode = {
        "apiVersion": "inference.vllm-operator.dev/v1alpha1",
        "kind": "GPUNode",
        "metadata": {"name": "l40s-a"},
        "status": {"gpus": gpus, "links": [{"a": 0, "b": 1, "kind": "PIX"}],
                   "interconnect": "PCIe"},
    }  # fmt: skip
    path = tmp_path / "gpunode.yaml"
    path.write_text(yaml.safe_dump(gpunode))
    body = _in_cluster(_service_doc(EXAMPLES / "inferenceservice-minimal.yaml"))
    isvc = tmp_path / "isvc.yaml"
    isvc.write_text(yaml.safe_dump(body))
    code, out, err = run(capsys, "-f", str(isvc), "--gpu-node", str(path),
                         "--default-image", IMAGE, "-o", "json")  # fmt: skip
    assert code == 0, err
    labelled = node("l40s-a", "NVIDIA-L40S", 2, 46068, "pcie")
    assert json.loads(out)["items"] == await _reconciled(body, [labelled], gpunode)


def test_render_is_a_subcommand() -> None:
    args = build_parser().parse_args(["render", "-f", "x.yaml", "--gpu", "L4"])
    assert args.func.__module__ == "vllm_operator.render_cli"


_OFFLINE = """
import socket, sys
def refuse(*args, **kwargs):
    raise SystemExit("render tried to connect: " + repr(args))
socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse
from vllm_operator.cli import main
sys.exit(main(["render", "-f", sys.argv[1], "--gpu", "L40S", "-o", "json"]))
"""


def test_nothing_is_contacted(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _OFFLINE, str(EXAMPLES / "inferenceservice-lora.yaml")],
        capture_output=True, text=True, check=False, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["kind"] == "List"
    assert list(tmp_path.iterdir()) == []  # nothing written either
