# ruff: noqa: F811  (fixtures are imported by name and then taken as parameters)
"""The Helm chart on a real control plane (a private one: see e2e/chart_fixtures.py).

- ``helm install`` creates everything; the rendered manifests pass the apiserver's own
  validation (``kubectl apply --dry-run=server``) for default and full values.
- The operator runs with **only the chart ServiceAccount's token**, and the whole operator
  scenario of e2e/test_operator.py passes (the tests are imported and run here, against
  that operator): the RBAC is sufficient. Requests it does not need are refused: the RBAC
  is not excessive.
- GitOps: an InferenceService applied server-side under a GitOps tool's field manager
  shows no diff after the operator has converged.
- The scale-down lock policy refuses lowering replicas on every path while a lock names
  the service, and allows it again once the lock is gone.
- ``helm upgrade`` with changed values and a changed CRD, then ``helm uninstall`` with the
  CRDs kept, and again with them deleted, behave as the values document.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.chart_fixtures import (  # noqa: F401  (fixtures, used by name)
    CHART,
    INSTALL_VALUES,
    Release,
    ServiceAccountOperator,
    chart_release,
    cluster,
    operator_process,
    service_account_kubeconfig,
    token_subject,
)
from e2e.cluster.cluster import ClusterHandle

# The operator scenario, run here against the ServiceAccount operator: pytest collects
# these imported tests in this module, where `operator_process` and `cluster` are the
# fixtures above. Left out: test_an_unsatisfiable_spec_stalls_without_a_retry_storm,
# whose expected reason (NoNodeHasEnoughGPUs) predates the tuner's verdict for 16 GPUs
# (InvalidParallelism, reported first whatever the credentials); the stall is covered
# below by test_a_stall_is_recorded_with_one_event_under_the_service_account.
from e2e.test_operator import (  # noqa: F401
    _isvc,
    _wait,
    _wait_ready,
    op,
    test_a_restart_mid_reconcile_leaves_no_twins_and_no_rollout,
    test_a_service_gets_owned_children_and_becomes_ready,
    test_a_spec_change_rolls_out_and_observed_generation_follows,
    test_an_hpa_scales_the_service_through_its_scale_subresource,
    test_children_edited_or_deleted_by_hand_are_restored,
    test_deleting_the_service_garbage_collects_its_children,
    test_kubectl_scale_changes_the_replicas,
)

GROUP = "inference.vllm-operator.dev"
CRDS = [f"{p}.{GROUP}" for p in ("inferenceservices", "inferencebenchmarks", "gpunodes")]


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
    ds = _json(cluster, "get", "daemonset", "vllm-operator-gpu-node-agent",
               "-n", "vllm-operator-agent")  # fmt: skip
    assert ds["status"]["desiredNumberScheduled"] == 3
    assert ds["status"].get("numberReady") == 3
    cm = _json(cluster, "get", "configmap", "vllm-op-vllm-operator-dashboard",
               "-n", chart_release.namespace)  # fmt: skip
    assert json.loads(cm["data"]["vllm-operator.json"])["uid"] == "vllm-operator"


def test_the_admission_policy_compiles_without_type_warnings(chart_release: Release) -> None:
    cluster = chart_release.cluster
    name = "vllm-op-vllm-operator-scale-down-lock"

    def checked() -> Any:
        policy = _json(cluster, "get", "validatingadmissionpolicy", name)
        status = policy.get("status", {})
        return status.get("observedGeneration") == policy["metadata"]["generation"] and status

    status = _wait(checked, "the policy's type checking")
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
    ("patch", "inferenceservices", "default"),  # the spec is the user's
    ("update", "inferenceservices", "default"),
    ("delete", "inferenceservices", "default"),
    ("create", "inferenceservices", "default"),
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
    ("list", "nodes", ""),
    ("watch", "customresourcedefinitions", ""),
    ("create", "events", "default"),
    ("create", "serviceaccounts", "default"),
    ("create", "roles", "default"),
    ("patch", "rolebindings", "default"),
    ("update", "configmaps", "default"),  # held, so that the load Job's Role may grant it
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


def test_a_stall_is_recorded_with_one_event_under_the_service_account(
    op: ServiceAccountOperator, namespace: str
) -> None:
    cluster = op.cluster
    cluster.apply(_isvc("huge", gpu={"count": 16}), namespace=namespace)

    def stalled() -> Any:
        isvc = _json(cluster, "get", "isvc", "huge", "-n", namespace)
        conds = {c["type"]: c for c in isvc.get("status", {}).get("conditions", [])}
        return conds.get("Stalled", {}).get("status") == "True" and conds["Stalled"]

    reason = _wait(stalled, "Stalled=True")["reason"]
    events = _wait(
        lambda: [
            e
            for e in _json(cluster, "get", "events", "-n", namespace,
                           "--field-selector", "involvedObject.name=huge")["items"]
            if e["reason"] == reason
        ],
        "the stall's event (events: create)",
    )  # fmt: skip
    assert len(events) == 1 and events[0]["type"] == "Warning"
    assert "Forbidden" not in op.log_tail(400)


def test_a_benchmark_gets_its_load_identity_under_the_service_account(
    op: ServiceAccountOperator, namespace: str
) -> None:
    """The load Job's ServiceAccount, Role and RoleBinding are created by the operator
    with only the chart's RBAC: RBAC refuses a Role that grants more than its creator
    holds, so this fails if the chart lacks a verb the Role grants."""
    cluster = op.cluster
    cluster.apply(_isvc("chat"), namespace=namespace)
    _wait_ready(cluster, namespace, "chat")
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "prompts"},
            "data": {"chat.jsonl": '{"prompt": "hello"}\n'},
        },
        namespace=namespace,
    )
    cluster.apply(
        {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "InferenceBenchmark",
            "metadata": {"name": "load"},
            "spec": {
                "targetRef": {"name": "chat"},
                "workload": {"dataset": {"name": "prompts", "key": "chat.jsonl"}},
                "arrival": {"process": "Poisson", "ratePerSecond": 1},
                "requests": 5,
            },
        },
        namespace=namespace,
    )
    _wait(
        lambda: (
            cluster.kubectl("get", "job", "load-load", "-n", namespace, check=False).returncode == 0
        ),
        "the load Job (created after its identity)",
    )
    role = _json(cluster, "get", "role", "load-load", "-n", namespace)
    assert role["rules"][0]["resourceNames"] == ["load-results"]
    _json(cluster, "get", "rolebinding", "load-load", "-n", namespace)
    _json(cluster, "get", "serviceaccount", "load-load", "-n", namespace)
    _json(cluster, "get", "configmap", "load-results", "-n", namespace)
    assert "Forbidden" not in op.log_tail(400)


# --------------------------------------------------------------------------- GitOps drift


def test_a_gitops_apply_shows_no_diff_after_the_operator_converged(
    op: ServiceAccountOperator, namespace: str, tmp_path: Path
) -> None:
    cluster = op.cluster
    manifest = tmp_path / "chat.yaml"
    manifest.write_text(
        yaml.safe_dump(_isvc("chat") | {"metadata": {"name": "chat", "namespace": namespace}})
    )
    gitops = ["--server-side", "--field-manager=argocd-controller", "-f", str(manifest)]
    cluster.kubectl("apply", *gitops)
    _wait_ready(cluster, namespace, "chat")
    cluster.kubectl("apply", *gitops)  # the tool's next sync
    diff = cluster.kubectl("diff", *gitops, check=False)
    assert diff.returncode == 0, f"drift after the operator ran:\n{diff.stdout}{diff.stderr}"
    assert diff.stdout == ""
    # The operator owns only status on the user's object, through the status subresource.
    isvc = _json(cluster, "get", "isvc", "chat", "-n", namespace, "--show-managed-fields")
    managers = {
        (m["manager"], m.get("subresource", "")): m for m in isvc["metadata"]["managedFields"]
    }
    assert ("argocd-controller", "") in managers
    ours = [m for (name, _), m in managers.items() if name == "vllm-operator"]
    assert ours and all(m.get("subresource") == "status" for m in ours)
    assert all("f:spec" not in m.get("fieldsV1", {}) for m in ours)


# --------------------------------------------------------------------------- scale-down lock


def _lock(namespace: str, target: str) -> dict[str, Any]:
    """A benchmark's load Job as the lock: suspended, so it never finishes on its own."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"bench-{target}-lock",
            "namespace": namespace,
            "labels": {
                f"{GROUP}/scale-down-lock": "true",
                f"{GROUP}/lock-target": target,
                f"{GROUP}/inference-benchmark": "bench",
            },
        },
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "load", "image": "vllm-operator:test"}],
                }
            },
        },
    }


def test_the_scale_down_lock_refuses_lower_replicas_on_every_path(
    op: ServiceAccountOperator, namespace: str
) -> None:
    cluster = op.cluster
    cluster.apply(_isvc("chat", replicas=2), namespace=namespace)
    _wait_ready(cluster, namespace, "chat")
    cluster.apply(_lock(namespace, "chat"))

    refusals = {
        "kubectl scale isvc": ("scale", "isvc", "chat", "--replicas=1"),
        "kubectl scale deployment": ("scale", "deployment", "chat", "--replicas=1"),
        "a patch of the Deployment": (
            "patch", "deployment", "chat", "--type=merge", "-p", '{"spec":{"replicas":1}}',
        ),
        "a patch of the InferenceService": (
            "patch", "isvc", "chat", "--type=merge", "-p", '{"spec":{"replicas":0}}',
        ),
    }  # fmt: skip
    for path, args in refusals.items():
        proc = cluster.kubectl(*args, "-n", namespace, check=False)
        assert proc.returncode != 0, f"{path} was allowed"
        assert "cannot go down from 2 to" in proc.stderr, proc.stderr
        assert "InferenceBenchmark bench" in proc.stderr
    # Scale-up stays allowed, and the operator follows it.
    cluster.kubectl("scale", "isvc", "chat", "--replicas=3", "-n", namespace)
    _wait(
        lambda: (
            _json(cluster, "get", "deployment", "chat", "-n", namespace)["spec"]["replicas"] == 3
        ),
        "the Deployment to scale up under the lock",
    )
    # Another service in the namespace is not locked.
    cluster.apply(_isvc("other", replicas=2), namespace=namespace)
    cluster.kubectl("scale", "isvc", "other", "--replicas=1", "-n", namespace)
    # The lock gone (its owner deleted, garbage collection), scale-down works again.
    cluster.kubectl("delete", "job", "bench-chat-lock", "-n", namespace)
    cluster.kubectl("scale", "isvc", "chat", "--replicas=1", "-n", namespace)
    _wait(
        lambda: (
            _json(cluster, "get", "deployment", "chat", "-n", namespace)["spec"]["replicas"] == 1
        ),
        "the Deployment to scale down after the lock",
    )


# --------------------------------------------------------------------------- upgrade, uninstall


def test_helm_upgrade_applies_changed_values_and_crds(
    chart_release: Release, operator_process: ServiceAccountOperator, tmp_path: Path
) -> None:
    cluster = chart_release.cluster
    operator_process.stop()  # its token stays valid; the RBAC below changes under it
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
    cluster.apply(_isvc("kept"), namespace=namespace)
    chart_release.uninstall()
    for crd in CRDS:
        cluster.kubectl("get", "crd", crd)
    cluster.kubectl("get", "isvc", "kept", "-n", namespace)
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
