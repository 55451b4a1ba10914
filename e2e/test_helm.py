# ruff: noqa: F811  (fixtures are imported by name and then taken as parameters)
"""The Helm chart on a real control plane (a private one: see e2e/chart_fixtures.py).

- ``helm install`` creates everything; the rendered manifests pass the apiserver's own
  validation (``kubectl apply --dry-run=server``) for default and full values.
- The chart's ServiceAccount may do what the operator needs and is refused what it does
  not need (``kubectl auth can-i``, and its own token): the RBAC is not excessive. That it
  is sufficient is shown by e2e/test_chart_operator.py, where the operator runs as the
  chart's pod on the real node with only that token and passes the operator scenario.
- ``helm upgrade`` with changed values and a changed CRD, then ``helm uninstall`` with the
  CRDs kept, and again with them deleted, behave as the values document.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.cluster.cluster import ClusterHandle
from e2e.chart_fixtures import (  # noqa: F401  (fixtures, used by name)
    CHART,
    INSTALL_VALUES,
    Artifacts,
    Release,
    chart_release,
    cluster,
    release_artifacts,
    service_account_kubeconfig,
    token_subject,
)
from e2e.framework import benchmark, gpu_isvc, wait_for

GROUP = "inference.vllm-operator.dev"
CRDS = [
    f"{p}.{GROUP}"
    for p in (
        "inferenceservices",
        "inferencebenchmarks",
        "gpunodes",
        "modelcaches",
        "inferencetunings",
    )
]


def _sa(release: Release) -> str:
    return f"system:serviceaccount:{release.namespace}:{release.name}-vllm-operator"


def _json(cluster: ClusterHandle, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


def _template(release: Release, *values: str) -> str:
    sets = [a for v in values for a in ("--set", v)]
    return release.helm(
        "template", release.name, str(CHART), "-n", release.namespace,
        "--kube-version", "1.36.3", *sets,
    ).stdout  # fmt: skip


# --------------------------------------------------------------------------- install


def test_helm_install_creates_the_operator_its_rbac_and_the_crds(
    chart_release: Release,
) -> None:
    cluster = chart_release.cluster
    status = json.loads(
        chart_release.helm("status", chart_release.name, "-n", chart_release.namespace,
                           "-o", "json").stdout
    )  # fmt: skip
    assert status["info"]["status"] == "deployed"
    assert "kubectl wait --for=condition=Ready" in status["info"]["notes"]
    dep = _json(cluster, "get", "deployment", "vllm-op-vllm-operator",
                "-n", chart_release.namespace)  # fmt: skip
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "vllm-op-vllm-operator"
    assert dep["status"].get("readyReplicas") == 1  # kwok runs the pod (no container)
    for crd in CRDS:
        obj = _json(cluster, "get", "crd", crd)
        assert obj["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # The agent's namespace enforces the restricted Pod Security level, and admitted
    # the agent's pods on every fake GPU node (kwok runs them; no container).
    ns = _json(cluster, "get", "namespace", "vllm-operator-agent")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # Named after the release (two releases share no ClusterRole).
    ds = _json(cluster, "get", "daemonset", "vllm-op-vllm-operator-gpu-node-agent",
               "-n", "vllm-operator-agent")  # fmt: skip
    assert ds["status"]["desiredNumberScheduled"] == 3
    assert ds["status"].get("numberReady") == 3
    cm = _json(cluster, "get", "configmap", "vllm-op-vllm-operator-dashboard",
               "-n", chart_release.namespace)  # fmt: skip
    assert json.loads(cm["data"]["vllm-operator.json"])["uid"] == "vllm-operator"


@pytest.mark.parametrize("policy", ["scale-down-lock", "own-objects-only"])
def test_the_admission_policy_compiles_without_type_warnings(
    chart_release: Release, policy: str
) -> None:
    cluster = chart_release.cluster
    name = f"vllm-op-vllm-operator-{policy}"

    def checked() -> Any:
        policy = _json(cluster, "get", "validatingadmissionpolicy", name)
        status = policy.get("status", {})
        return status.get("observedGeneration") == policy["metadata"]["generation"] and status

    status = wait_for(checked, "the policy's type checking")
    assert not status.get("typeChecking", {}).get("expressionWarnings"), status


@pytest.mark.parametrize(
    "values",
    [
        (),
        (
            *INSTALL_VALUES,
            "operator.watchNamespaces={vllm-operator-system}",
            "agent.namespace=vllm-operator-system",
            "agent.powerManagement=true",
            "agent.labelNodes=true",
            "metrics.serviceMonitor.enabled=true",
            "metrics.podMonitor.enabled=true",
            "networkPolicy.enabled=true",
            "image.digest=sha256:" + "ab" * 32,
        ),
    ],
    ids=["default values", "full values"],
)
def test_the_rendered_manifests_pass_the_apiservers_validation(
    chart_release: Release, values: tuple[str, ...]
) -> None:
    docs = [d for d in yaml.safe_load_all(_template(chart_release, *values)) if d]
    # The Prometheus Operator's kinds have no CRDs here; tests/test_chart.py checks them.
    checked = [d for d in docs if d["apiVersion"] != "monitoring.coreos.com/v1"]
    assert len(checked) >= 12
    proc = chart_release.cluster.kubectl(
        "apply", "--dry-run=server", "--server-side", "--force-conflicts",
        "--field-manager=dry-run-check", "-f", "-",
        input=yaml.safe_dump_all(checked), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(server dry run)") == len(checked)


# --------------------------------------------------------------------------- RBAC

NOT_NEEDED = [
    ("list", "secrets", "default"),
    ("create", "secrets", "default"),
    ("watch", "secrets", "kube-system"),
    ("delete", "deployments", "default"),
    ("create", "pods", "default"),
    ("delete", "pods", "default"),
    ("update", "inferenceservices", "default"),  # writes are server-side apply (patch) only
    ("patch", "nodes", ""),
    ("patch", "gpunodes", ""),
    ("create", "clusterrolebindings", ""),
    ("escalate", "clusterroles", ""),
    ("impersonate", "serviceaccounts", "default"),
    ("create", "serviceaccounts/token", "default"),
    ("delete", "customresourcedefinitions", ""),
    ("update", "deployments", "default"),  # writes are server-side apply (patch) only
    # The benchmark load Job's Role and RoleBinding: granted from what the operator holds.
    ("escalate", "roles", "default"),
    ("bind", "roles", "default"),
    ("delete", "roles", "default"),
    ("get", "serviceaccounts", "default"),
]
NEEDED = [
    ("patch", "deployments", "default"),
    ("get", "secrets", "default"),
    ("patch", "inferenceservices/status", "default"),
    # An InferenceTuning's Beside trials are InferenceServices of their own (created,
    # applied, deleted with the trial); a user's spec is never written (e2e/test_tuning.py).
    ("create", "inferenceservices", "default"),
    ("patch", "inferenceservices", "default"),
    ("delete", "inferenceservices", "default"),
    ("list", "nodes", ""),
    ("watch", "nodes", ""),  # the operator's node cache (runtime/cache.py)
    ("watch", "gpunodes", ""),
    ("watch", "customresourcedefinitions", ""),
    ("create", "events", "default"),
    ("create", "serviceaccounts", "default"),
    ("create", "roles", "default"),
    ("patch", "rolebindings", "default"),
    ("update", "configmaps", "default"),  # held, so that the load Job's Role may grant it
    ("create", "pods/eviction", "default"),  # likewise, for a chaos restart; never used
]


def _can_i(release: Release, verb: str, resource: str, namespace: str) -> str:
    ns = ["-n", namespace] if namespace else []
    plural, _, sub = resource.partition("/")
    subresource = [f"--subresource={sub}"] if sub else []
    proc = release.cluster.kubectl(
        "auth", "can-i", verb, plural, *subresource, *ns, f"--as={_sa(release)}", check=False
    )
    return proc.stdout.strip()


@pytest.mark.parametrize(("verb", "resource", "namespace"), NOT_NEEDED)
def test_the_service_account_may_not_do_what_the_operator_does_not_need(
    chart_release: Release, verb: str, resource: str, namespace: str
) -> None:
    assert _can_i(chart_release, verb, resource, namespace) == "no"


@pytest.mark.parametrize(("verb", "resource", "namespace"), NEEDED)
def test_the_service_account_may_do_what_the_operator_needs(
    chart_release: Release, verb: str, resource: str, namespace: str
) -> None:
    assert _can_i(chart_release, verb, resource, namespace) == "yes"


def test_the_operators_token_really_is_refused_what_it_does_not_need(
    chart_release: Release, service_account_kubeconfig: Path
) -> None:
    token = yaml.safe_load(service_account_kubeconfig.read_text())["users"][0]["user"]["token"]
    assert token_subject(token) == _sa(chart_release)
    cluster = chart_release.cluster
    as_sa = [str(cluster.kubectl_path), f"--kubeconfig={service_account_kubeconfig}"]
    refused = subprocess.run([*as_sa, "get", "secrets", "-A"], capture_output=True,
                             text=True, check=False, timeout=60)  # fmt: skip
    assert refused.returncode != 0 and "Forbidden" in refused.stderr
    allowed = subprocess.run([*as_sa, "get", "nodes", "-o", "name"], capture_output=True,
                             text=True, check=False, timeout=60)  # fmt: skip
    assert allowed.returncode == 0 and "node/" in allowed.stdout


def _as_operator(
    release: Release, *args: str, body: Any = None
) -> subprocess.CompletedProcess[str]:
    return release.cluster.kubectl(
        *args, f"--as={_sa(release)}", input=None if body is None else json.dumps(body),
        check=False,
    )  # fmt: skip


def _config_map(name: str, ns: str, *, labels: bool, owner: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if labels:
        meta["labels"] = {"app.kubernetes.io/managed-by": "vllm-operator"}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService",
                                    "name": "svc", "uid": "0e5b1c1e-0000-4000-8000-000000000001",
                                    "controller": True}]  # fmt: skip
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v"}}


def test_the_operators_account_writes_only_its_own_objects_outside_system_namespaces(
    chart_release: Release, namespace: str
) -> None:
    """RBAC lets the operator patch any ConfigMap, pod or Deployment of the cluster; the
    chart's admission policy refuses its account everything but its own objects."""
    cluster = chart_release.cluster
    cluster.kubectl("create", "configmap", "users", "-n", namespace, "--from-literal=a=b")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "users", "namespace": namespace},
           "spec": {"containers": [{"name": "c", "image": "pause"}]}}  # fmt: skip
    cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": "users", "namespace": namespace}}  # fmt: skip
    # RBAC alone would allow each of these.
    assert _can_i(chart_release, "patch", "configmaps", namespace) == "yes"
    assert _can_i(chart_release, "create", "deployments", "kube-system") == "yes"
    refusals = {
        "changes only objects it created": [
            _as_operator(chart_release, "patch", "configmap", "users", "-n", namespace,
                         "--type=merge", "-p", '{"data":{"a":"changed"}}'),
            _as_operator(chart_release, "delete", "configmap", "users", "-n", namespace),
        ],
        "creates only objects labelled": [
            _as_operator(chart_release, "create", "--dry-run=server", "-f", "-",
                         body=_config_map("loose", namespace, labels=False, owner=True)),
            _as_operator(chart_release, "create", "--dry-run=server", "-f", "-",
                         body=_config_map("orphan", namespace, labels=True, owner=False)),
        ],
        "evicts no pod itself": [
            _as_operator(chart_release, "create", "--raw",
                         f"/api/v1/namespaces/{namespace}/pods/users/eviction?dryRun=All",
                         "-f", "-", body=eviction),
        ],
        "writes nothing in namespace kube-system": [
            _as_operator(chart_release, "create", "--dry-run=server", "-f", "-",
                         body=_config_map("sys", "kube-system", labels=True, owner=True)),
        ],
    }  # fmt: skip
    for words, procs in refusals.items():
        for proc in procs:
            assert proc.returncode != 0 and words in proc.stderr, proc.stderr
            assert "own-objects-only" in proc.stderr, proc.stderr
    assert cluster.kubectl_json("get", "configmap", "users", "-n", namespace)["data"] == {"a": "b"}
    assert not cluster.kubectl_json("get", "pod", "users", "-n", namespace)["metadata"].get(
        "deletionTimestamp"
    )
    # What the operator does write passes: labelled and owned, in a user namespace.
    ok = _as_operator(chart_release, "create", "--dry-run=server", "-f", "-",
                      body=_config_map("ours", namespace, labels=True, owner=True))  # fmt: skip
    assert ok.returncode == 0, ok.stderr


def _trial(name: str, ns: str, owner_kind: str | None) -> dict[str, Any]:
    """An InferenceService as a Beside tuning's trial is made: labelled, and owned by
    ``owner_kind`` (None: by nothing)."""
    body = gpu_isvc(name)
    body["metadata"].update(namespace=ns, labels={"app.kubernetes.io/managed-by": "vllm-operator"})
    if owner_kind is not None:
        body["metadata"]["ownerReferences"] = [
            {"apiVersion": f"{GROUP}/v1alpha1", "kind": owner_kind, "name": "t",
             "uid": "0e5b1c1e-0000-4000-8000-000000000002", "controller": True}
        ]  # fmt: skip
    return body


def test_the_operators_account_leaves_the_users_services_and_benchmarks_alone(
    chart_release: Release, namespace: str
) -> None:
    """The account may create, patch and delete InferenceServices and InferenceBenchmarks
    (a Beside tuning's trials); the policy keeps it to those: a user's own are refused,
    their status and scale subresources are not matched (the operator writes them on every
    service), and what it creates must be owned by an InferenceTuning."""
    cluster = chart_release.cluster
    cluster.apply(gpu_isvc("users"), namespace=namespace)
    bench = benchmark("users-bench", "users", 10)
    cluster.apply(bench, namespace=namespace)
    assert _can_i(chart_release, "patch", "inferenceservices", namespace) == "yes"
    assert _can_i(chart_release, "delete", "inferencebenchmarks", namespace) == "yes"
    refusals = {
        "changes only objects it created": [
            _as_operator(chart_release, "patch", "vis", "users", "-n", namespace,
                         "--type=merge", "-p", '{"spec":{"replicas":3}}'),
            _as_operator(chart_release, "delete", "vis", "users", "-n", namespace),
            _as_operator(chart_release, "delete", "inferencebenchmark", "users-bench",
                         "-n", namespace),
        ],
        "creates only objects labelled": [
            _as_operator(chart_release, "create", "--dry-run=server", "-f", "-",
                         body=_trial("orphan", namespace, None)),
        ],
        "only as a tuning's trials": [
            _as_operator(chart_release, "create", "--dry-run=server", "-f", "-",
                         body=_trial("not-a-trial", namespace, "InferenceService")),
        ],
    }  # fmt: skip
    for words, procs in refusals.items():
        for proc in procs:
            assert proc.returncode != 0 and words in proc.stderr, proc.stderr
            assert "own-objects-only" in proc.stderr, proc.stderr
    assert cluster.kubectl_json("get", "vis", "users", "-n", namespace)["spec"]["replicas"] == 1
    cluster.kubectl("get", "inferencebenchmark", "users-bench", "-n", namespace)
    # Its scale subresource is the operator's to write on a user's service (the status
    # subresource too: kubectl cannot patch it without a get the account lacks, and every
    # status the chart's operator writes in e2e/test_chart_operator.py passes the policy).
    scale = _as_operator(chart_release, "patch", "vis", "users", "-n", namespace,
                         "--subresource=scale", "--type=merge",
                         "-p", '{"spec":{"replicas":2}}')  # fmt: skip
    assert scale.returncode == 0, scale.stderr
    # A trial passes: labelled, owned by an InferenceTuning.
    ok = _as_operator(chart_release, "create", "--dry-run=server", "-f", "-",
                      body=_trial("trial", namespace, "InferenceTuning"))  # fmt: skip
    assert ok.returncode == 0, ok.stderr


GOLDEN = Path(__file__).parent / "golden"


def _rules(release: Release, namespace: str) -> str:
    """``kubectl auth can-i --list`` for the operator's account in ``namespace``."""
    return release.cluster.kubectl(
        "auth", "can-i", "--list", "-n", namespace, f"--as={_sa(release)}"
    ).stdout


def _golden(name: str, text: str) -> None:
    """Set UPDATE_GOLDEN=1 to rewrite the file after an intended change, then review it."""
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path.name}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} changed:\n{text}"


def test_the_operators_permissions_match_the_golden_list_cluster_wide(
    chart_release: Release, namespace: str
) -> None:
    _golden("can-i-cluster-wide.txt", _rules(chart_release, namespace))


# --------------------------------------------------------------------------- upgrade, uninstall


def test_helm_upgrade_applies_changed_values_and_crds(
    chart_release: Release, tmp_path: Path
) -> None:
    cluster = chart_release.cluster
    # A changed CRD in the chart: Helm's crds/ folder would never apply it; ours does.
    cluster.kubectl("create", "namespace", "team-a")  # watched namespaces must exist
    chart = tmp_path / "vllm-operator"
    shutil.copytree(CHART, chart)
    crd_file = chart / "files" / "crds" / f"{CRDS[0]}.yaml"
    changed = yaml.safe_load(crd_file.read_text())
    changed["spec"]["names"]["shortNames"].append("isvcupgraded")
    crd_file.write_text(yaml.safe_dump(changed))
    chart_release.install(
        *INSTALL_VALUES,
        "operator.logFormat=plain",
        "operator.watchNamespaces={team-a}",
        "scaleDownLock.enabled=false",
        chart=chart,
    )
    crd = _json(cluster, "get", "crd", CRDS[0])
    assert "isvcupgraded" in crd["spec"]["names"]["shortNames"]
    dep = _json(
        cluster, "get", "deployment", "vllm-op-vllm-operator", "-n", chart_release.namespace
    )
    env = {
        e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["VLLM_OPERATOR_LOG_FORMAT"] == "plain"
    assert json.loads(env["VLLM_OPERATOR_NAMESPACES"]) == ["team-a"]
    # Namespaced permissions now only in team-a; the policy is gone.
    assert _can_i(chart_release, "patch", "deployments", "team-a") == "yes"
    assert _can_i(chart_release, "patch", "deployments", "default") == "no"
    _golden("can-i-namespaced-watched.txt", _rules(chart_release, "team-a"))
    _golden("can-i-namespaced-elsewhere.txt", _rules(chart_release, "default"))
    gone = cluster.kubectl("get", "validatingadmissionpolicy",
                           "vllm-op-vllm-operator-scale-down-lock", check=False)  # fmt: skip
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    # Back to the plain chart: the CRD returns to the generated one.
    chart_release.install(*INSTALL_VALUES)
    crd = _json(cluster, "get", "crd", CRDS[0])
    assert "isvcupgraded" not in crd["spec"]["names"]["shortNames"]


def test_helm_uninstall_keeps_the_crds_and_their_objects_by_default(
    chart_release: Release, namespace: str
) -> None:
    cluster = chart_release.cluster
    cluster.apply(gpu_isvc("kept"), namespace=namespace)
    chart_release.uninstall()
    for crd in CRDS:
        cluster.kubectl("get", "crd", crd)
    cluster.kubectl("get", "vis", "kept", "-n", namespace)
    gone = cluster.kubectl("get", "deployment", "vllm-op-vllm-operator",
                           "-n", chart_release.namespace, check=False)  # fmt: skip
    assert gone.returncode != 0
    gone = cluster.kubectl("get", "clusterrole", "vllm-op-vllm-operator", check=False)
    assert gone.returncode != 0


def test_helm_uninstall_deletes_the_crds_when_told_not_to_keep_them(
    chart_release: Release,
) -> None:
    cluster = chart_release.cluster
    # A new install adopts the kept CRDs (they still carry this release's annotations),
    # and keeps their annotations as they are; an upgrade with crds.keep=false then
    # removes the keep annotation (a three-way merge with the previous release).
    chart_release.install(*INSTALL_VALUES)
    chart_release.install(*INSTALL_VALUES, "crds.keep=false")
    for crd in CRDS:
        annotations = _json(cluster, "get", "crd", crd)["metadata"].get("annotations", {})
        assert "helm.sh/resource-policy" not in annotations
    chart_release.uninstall()
    for crd in CRDS:
        gone = cluster.kubectl("get", "crd", crd, check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr


# --------------------------------------------------------------------------- release


def test_the_release_verifies_and_its_image_archive_loads_into_podman(
    release_artifacts: Artifacts,
) -> None:
    """make release's SHA256SUMS verify as a user checks them; the image archive loads into
    a podman of its own (a storage folder of the test's, the machine's images untouched)
    as the operator image of this version, running as uid 65532. The packaged chart is what
    every test of this module installs (chart_release)."""
    from vllm_operator import __version__

    sums = subprocess.run(
        ["sha256sum", "--check", "--strict", "SHA256SUMS"],
        cwd=release_artifacts.dist, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert sums.returncode == 0, sums.stdout + sums.stderr
    names = {line.split(":")[0] for line in sums.stdout.splitlines()}
    assert names == {
        release_artifacts.chart.name,
        release_artifacts.image.name,
        f"vllm_operator-{__version__}-py3-none-any.whl",
        f"vllm_operator-{__version__}.tar.gz",
    }
    # podman refuses a runroot longer than 50 characters: a short folder of /tmp's.
    short = Path(tempfile.mkdtemp(prefix="vop-podman-"))
    store = [
        "--root", str(short / "root"), "--runroot", str(short / "run"),
        "--storage-driver", "vfs",
    ]  # fmt: skip

    def podman(*args: str) -> str:
        proc = subprocess.run(
            ["podman", *store, *args], capture_output=True, text=True, check=False, timeout=300
        )
        assert proc.returncode == 0, f"podman {' '.join(args)}: {proc.stderr[-2000:]}"
        return proc.stdout

    try:
        podman("load", "-i", str(release_artifacts.image))
        tags = podman("images", "--format", "{{.Repository}}:{{.Tag}}").split()
        assert f"localhost/vllm-operator:{__version__}" in tags, tags
        (image,) = json.loads(podman("image", "inspect", f"vllm-operator:{__version__}"))
        assert image["Config"]["User"] == "65532:65532", image["Config"]
    finally:
        subprocess.run(["podman", *store, "system", "reset", "--force"], capture_output=True,
                       check=False, timeout=120)  # fmt: skip
        shutil.rmtree(short, ignore_errors=True)
