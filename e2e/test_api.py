"""The API on a real apiserver: CRDs install, examples are accepted, invalid manifests are
rejected at admission naming the field, and kubectl shows descriptions and columns."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from tests.catalog import InvalidCase, invalid_cases

from devenv.cluster.cluster import ClusterHandle

REPO = Path(__file__).parents[1]
GROUP = "inference.vllm-operator.dev"
EXAMPLES = sorted((REPO / "examples").rglob("*.yaml"))
EXAMPLE_IDS = [str(p.relative_to(REPO / "examples")) for p in EXAMPLES]
CASES = invalid_cases()


def test_the_crds_are_established(crds: ClusterHandle) -> None:
    names = crds.kubectl(
        "get", "crd", "-l", "app.kubernetes.io/part-of=vllm-operator", "-o", "name"
    ).stdout.split()
    assert sorted(names) == [
        "customresourcedefinition.apiextensions.k8s.io/gpunodes.inference.vllm-operator.dev",
        "customresourcedefinition.apiextensions.k8s.io/inferencebenchmarks.inference.vllm-operator.dev",
        "customresourcedefinition.apiextensions.k8s.io/inferenceservices.inference.vllm-operator.dev",
        "customresourcedefinition.apiextensions.k8s.io/inferencetunings.inference.vllm-operator.dev",
        "customresourcedefinition.apiextensions.k8s.io/modelcaches.inference.vllm-operator.dev",
    ]


@pytest.mark.parametrize("path", EXAMPLES, ids=EXAMPLE_IDS)
def test_every_example_is_accepted(crds: ClusterHandle, namespace: str, path: Path) -> None:
    crds.kubectl("apply", "-n", namespace, "-f", str(path))
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc["kind"] == "GPUNode":
            crds.kubectl("delete", "gpunode", doc["metadata"]["name"], "--wait=false")


def _reject(cluster: ClusterHandle, namespace: str, case: InvalidCase, *dry: str) -> str:
    proc = cluster.kubectl(
        "apply", *dry, "-n", namespace, "-f", "-", input=json.dumps(case.manifest), check=False
    )
    assert proc.returncode != 0, f"accepted: {case.id}\n{proc.stdout}"
    return proc.stderr


@pytest.fixture(scope="module")
def shared_namespace(crds: ClusterHandle) -> Iterator[str]:
    """One namespace for the whole catalog: nothing is created in it, so nothing can leak
    from one case into the next, and 50 namespaces need not come and go."""
    name = f"e2e-catalog-{secrets.token_hex(3)}"
    crds.kubectl("create", "namespace", name)
    yield name
    crds.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_invalid_manifest_is_rejected_naming_the_field(
    crds: ClusterHandle,
    shared_namespace: str,
    case: InvalidCase,
) -> None:
    namespace = shared_namespace
    for mode in ((), ("--dry-run=server",)):
        err = _reject(crds, namespace, case, *mode)
        assert case.field in err, f"{case.id}: error does not name {case.field}:\n{err}"
    kind = case.kind.lower() + "s.inference.vllm-operator.dev"
    name = case.manifest["metadata"]["name"]
    got = crds.kubectl("get", kind, name, "-n", namespace, check=False)
    assert "NotFound" in got.stderr, "a rejected object must not exist"


def test_benchmark_spec_is_immutable(crds: ClusterHandle, namespace: str) -> None:
    path = REPO / "examples" / "inferencebenchmark.yaml"
    crds.kubectl("apply", "-n", namespace, "-f", str(path))
    proc = crds.kubectl(
        "patch",
        "inferencebenchmark",
        "llama-chat-bursts",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec": {"seed": 7}}',
        check=False,
    )
    assert proc.returncode != 0 and "immutable" in proc.stderr


def test_kubectl_explain_shows_field_descriptions(crds: ClusterHandle) -> None:
    out = crds.kubectl("explain", "inferenceservice.spec.gpu.count").stdout
    assert "auto (the tuner's choice)" in out
    out = crds.kubectl("explain", "inferencebenchmark.spec.arrival").stdout
    assert "ratePerSecond" in out and "Mean request rate" in out


def test_kubectl_get_shows_the_printer_columns(crds: ClusterHandle, namespace: str) -> None:
    crds.kubectl(
        "apply", "-n", namespace, "-f", str(REPO / "examples" / "inferenceservice-full.yaml")
    )
    header = crds.kubectl("get", "vis", "-n", namespace).stdout.splitlines()[0].split()
    assert header[:2] == ["NAME", "READY"]
    for column in ("DESIRED", "MODEL", "GPUS", "AGE"):
        assert column in header
    crds.kubectl("apply", "-n", namespace, "-f", str(REPO / "examples" / "inferencebenchmark.yaml"))
    header = crds.kubectl("get", "ibench", "-n", namespace).stdout.splitlines()[0].split()
    assert "PHASE" in header and "TARGET" in header


KSERVE_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "inferenceservices.serving.kserve.io"},
    "spec": {
        "group": "serving.kserve.io",
        "scope": "Namespaced",
        "names": {"kind": "InferenceService", "plural": "inferenceservices",
                  "singular": "inferenceservice", "shortNames": ["isvc"]},
        "versions": [{"name": "v1beta1", "served": True, "storage": True,
                      "schema": {"openAPIV3Schema": {"type": "object",
                                 "x-kubernetes-preserve-unknown-fields": True}}}],
    },
}  # fmt: skip


def test_beside_kserve_each_short_name_means_one_kind(
    crds: ClusterHandle, namespace: str, tmp_path: Path
) -> None:
    """KServe's InferenceService (its CRD's names, no controller) and ours on one
    apiserver: isvc is KServe's, vis and the full plural are ours."""
    crds.apply(KSERVE_CRD)
    try:
        crds.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                     "crd/inferenceservices.serving.kserve.io")  # fmt: skip
        crds.apply(_sample("theirs", "serving.kserve.io/v1beta1"), namespace=namespace)
        crds.apply(_sample("ours", f"{GROUP}/v1alpha1", ours=True), namespace=namespace)
        cache = f"--cache-dir={tmp_path}"  # discovery as a fresh kubectl sees it
        for name, ours in (("isvc", False), ("vis", True),
                           (f"inferenceservices.{GROUP}", True)):  # fmt: skip
            got = crds.kubectl_json("get", name, "-n", namespace, cache)["items"]
            assert [i["metadata"]["name"] for i in got] == ["ours" if ours else "theirs"], name
    finally:
        crds.kubectl("delete", "crd", "inferenceservices.serving.kserve.io", "--wait=false")


def _sample(name: str, api_version: str, *, ours: bool = False) -> dict[str, object]:
    spec = (
        {"model": {"source": {"huggingFace": {"repo": "Qwen/Qwen2.5-0.5B-Instruct"}}}}
        if ours
        else {"predictor": {"model": {"modelFormat": {"name": "huggingface"}}}}
    )
    return {"apiVersion": api_version, "kind": "InferenceService",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def test_defaults_are_filled_in_by_the_apiserver(crds: ClusterHandle, namespace: str) -> None:
    crds.kubectl(
        "apply", "-n", namespace, "-f", str(REPO / "examples" / "inferenceservice-minimal.yaml")
    )
    spec = crds.kubectl_json("get", "vis", "qwen-small", "-n", namespace)["spec"]
    assert spec["replicas"] == 1
    assert spec["gpu"]["count"] == "auto"
    assert spec["tuning"] == {"profile": "Balanced", "overrides": {}}
    assert spec["warmup"]["enabled"] is True


GOLDEN_FILES = [
    pytest.param(p, id=p.stem) for p in sorted((REPO / "tests" / "golden").glob("*.yaml"))
]


@pytest.mark.parametrize("path", GOLDEN_FILES)
def test_the_rendered_children_pass_the_apiservers_own_validation(
    crds: ClusterHandle, lws_crds: ClusterHandle, shared_namespace: str, path: Path
) -> None:
    """The pinned renderings (tests/render/test_golden.py), the podTemplate's affinity,
    spread, RuntimeClass and pull secrets among them, as the apiserver validates them; the
    multi-node plans' LeaderWorkerSets against LWS's CRD (e2e/lws_fixtures.py)."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        doc["metadata"].pop("namespace", None)
        doc["metadata"].pop("ownerReferences", None)  # the owner does not exist here
    proc = crds.kubectl(
        "apply", "--dry-run=server", "-n", shared_namespace, "-f", "-",
        input=yaml.safe_dump_all(docs), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(server dry run)") == len(docs)
