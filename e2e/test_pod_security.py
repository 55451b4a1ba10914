"""Every pod the golden manifests describe passes `restricted` Pod Security, judged by the
apiserver's own Pod Security admission (a server-side dry run: nothing is created).

The golden files (tests/golden/, checked against the renderer by tests/render) hold the
pods the operator renders: the vLLM server's Deployment, a LeaderWorkerSet's leader and
worker, a benchmark's load and neighbour Jobs. Each pod template becomes a Pod created with
`--dry-run=server` in a namespace that enforces `restricted`; a pod that breaks the level
must be refused there, or the check proves nothing. The warmup and download Jobs, which no
golden file holds, run for real in the real node's restricted namespaces
(e2e/test_real_node.py, e2e/test_model_cache.py).
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.cluster.cluster import ClusterHandle
from e2e.framework import create_namespace

GOLDEN = Path(__file__).parents[1] / "tests" / "golden"
# Fields that name other objects, which admission plugins other than Pod Security look up
# (the RuntimeClass, PriorityClass and ServiceAccount must exist). None of them is judged
# by Pod Security, so they are left out rather than created.
ELSEWHERE = ("runtimeClassName", "priorityClassName", "serviceAccountName")


def _templates(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    kind = doc.get("kind")
    spec = doc.get("spec", {})
    if kind in ("Deployment", "Job"):
        yield kind.lower(), spec["template"]
    elif kind == "LeaderWorkerSet":
        group = spec["leaderWorkerTemplate"]
        yield "leader", group["leaderTemplate"]
        yield "worker", group["workerTemplate"]


def _golden_pods() -> list[Any]:
    params = []
    for path in sorted(GOLDEN.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for role, template in _templates(doc or {}):
                name = f"{path.stem}-{role}-{doc['metadata']['name']}"[:63].rstrip("-")
                params.append(pytest.param(name, template, id=f"{path.stem} {role}"))
    return params


GOLDEN_PODS = _golden_pods()


def _pod(name: str, template: dict[str, Any]) -> dict[str, Any]:
    spec = {k: v for k, v in copy.deepcopy(template["spec"]).items() if k not in ELSEWHERE}
    labels = template.get("metadata", {}).get("labels", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }


@pytest.fixture(scope="module")
def restricted_ns(cluster: ClusterHandle) -> Iterator[str]:
    name = f"e2e-psa-{secrets.token_hex(3)}"
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    create_namespace(cluster, name, labels=labels)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _dry_run(cluster: ClusterHandle, ns: str, pod: dict[str, Any]) -> Any:
    return cluster.kubectl(
        "create", "--dry-run=server", "-n", ns, "-f", "-", "-o", "name",
        input=yaml.safe_dump(pod), check=False,
    )  # fmt: skip


def test_every_kind_of_rendered_pod_is_covered() -> None:
    roles = {p.id.rsplit(" ", 1)[1] for p in GOLDEN_PODS}
    assert roles == {"deployment", "leader", "worker", "job"}, roles


@pytest.mark.parametrize(("name", "template"), GOLDEN_PODS)
def test_the_rendered_pod_passes_restricted(
    cluster: ClusterHandle, restricted_ns: str, name: str, template: dict[str, Any]
) -> None:
    done = _dry_run(cluster, restricted_ns, _pod(name, template))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"pod/{name}"


def test_a_pod_that_breaks_restricted_is_refused(
    cluster: ClusterHandle, restricted_ns: str
) -> None:
    """The control: the same check refuses the first golden pod once it may run as root."""
    name, template = GOLDEN_PODS[0].values
    pod = _pod(str(name), template)  # type: ignore[arg-type]
    for container in pod["spec"]["containers"]:
        container["securityContext"]["runAsNonRoot"] = False
        container["securityContext"].pop("runAsUser", None)
    done = _dry_run(cluster, restricted_ns, pod)
    assert done.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in done.stderr, done.stderr
    assert "runAsNonRoot" in done.stderr
