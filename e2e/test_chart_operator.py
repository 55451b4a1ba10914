# ruff: noqa: F811  (fixtures are imported by name and then taken as parameters)
"""The operator as users run it: a pod of its own image on the real node, installed by its
Helm chart, holding only the chart's ServiceAccount token (``chart_operator``).

- The whole operator scenario of e2e/test_operator.py passes against that pod (the tests
  are imported and collected here, where ``operator_process`` is the pod): the chart's
  RBAC is sufficient. Its restarts are real: ``stop(kill=True)`` SIGKILLs the container on
  the node and the kubelet restarts it; ``stop()`` scales the Deployment to 0.
- Under the same identity: a stall is recorded with one event; a benchmark gets its load
  Job's ServiceAccount, Role and RoleBinding (RBAC refuses a Role that grants more than
  its creator holds); a GitOps apply shows no diff after the operator converged; and the
  scale-down lock refuses lowering replicas on every path while a lock names the service.

The services' pods land on kwok's fake GPU nodes (the operator's reconcile is the point
here, not a server); the chart's install, upgrade and uninstall are in e2e/test_helm.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from devenv.cluster.cluster import ClusterHandle
from e2e.framework import condition, gpu_isvc, wait_for
from e2e.real_node_fixtures import ChartOperator, PodOperator

# The scenario, collected again in this module against the pod.
from e2e.test_operator import (  # noqa: F401
    _wait_ready,
    op,
    test_a_restart_mid_reconcile_leaves_no_twins_and_no_rollout,
    test_a_service_gets_owned_children_and_becomes_ready,
    test_a_spec_change_rolls_out_and_observed_generation_follows,
    test_an_hpa_scales_the_service_through_its_scale_subresource,
    test_an_unsatisfiable_spec_stalls_without_a_retry_storm,
    test_children_edited_or_deleted_by_hand_are_restored,
    test_deleting_the_service_garbage_collects_its_children,
    test_kubectl_scale_changes_the_replicas,
)
from vllm_operator.constants import GROUP, LABEL_LOCK_TARGET, LABEL_SCALE_DOWN_LOCK


def _rbac_denials(log: str) -> list[str]:
    """The operator's log lines where RBAC refused it something (not, say, a 403 for a
    namespace that is being deleted)."""
    return [
        line
        for line in log.splitlines()
        if "is forbidden: User" in line and "system:serviceaccount:" in line
    ]


@pytest.fixture(scope="module")
def operator_process(chart_operator: ChartOperator) -> PodOperator:
    """The chart's operator pod, standing in for the session's local process here."""
    return chart_operator.process


def test_a_stall_is_recorded_with_one_event_under_the_service_account(
    op: PodOperator, namespace: str
) -> None:
    cluster = op.cluster
    cluster.apply(gpu_isvc("huge", gpu={"count": 16}), namespace=namespace)

    def stalled() -> Any:
        isvc = cluster.kubectl_json("get", "vis", "huge", "-n", namespace)
        found = condition(isvc, "Stalled")
        return found.get("status") == "True" and found

    reason = wait_for(stalled, "Stalled=True")["reason"]
    events = wait_for(
        lambda: [
            e
            for e in cluster.kubectl_json("get", "events", "-n", namespace,
                                          "--field-selector", "involvedObject.name=huge")["items"]
            if e["reason"] == reason
        ],
        "the stall's event (events: create)",
    )  # fmt: skip
    assert len(events) == 1 and events[0]["type"] == "Warning"
    assert not _rbac_denials(op.log_tail(400))


def test_a_benchmark_gets_its_load_identity_under_the_service_account(
    op: PodOperator, namespace: str
) -> None:
    """The load Job's ServiceAccount, Role and RoleBinding are created by the operator
    with only the chart's RBAC: RBAC refuses a Role that grants more than its creator
    holds, so this fails if the chart lacks a verb the Role grants."""
    cluster = op.cluster
    cluster.apply(gpu_isvc("chat"), namespace=namespace)
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
    wait_for(
        lambda: (
            cluster.kubectl("get", "job", "load-load", "-n", namespace, check=False).returncode == 0
        ),
        "the load Job (created after its identity)",
    )
    role = cluster.kubectl_json("get", "role", "load-load", "-n", namespace)
    assert role["rules"][0]["resourceNames"] == ["load-results"]
    for kind in ("rolebinding/load-load", "serviceaccount/load-load", "configmap/load-results"):
        cluster.kubectl("get", kind, "-n", namespace)
    assert not _rbac_denials(op.log_tail(400))


def test_a_gitops_apply_shows_no_diff_after_the_operator_converged(
    op: PodOperator, namespace: str, tmp_path: Any
) -> None:
    cluster = op.cluster
    manifest = tmp_path / "chat.yaml"
    manifest.write_text(
        yaml.safe_dump(gpu_isvc("chat") | {"metadata": {"name": "chat", "namespace": namespace}})
    )
    gitops = ["--server-side", "--field-manager=argocd-controller", "-f", str(manifest)]
    cluster.kubectl("apply", *gitops)
    _wait_ready(cluster, namespace, "chat")
    cluster.kubectl("apply", *gitops)  # the tool's next sync
    diff = cluster.kubectl("diff", *gitops, check=False)
    assert diff.returncode == 0, f"drift after the operator ran:\n{diff.stdout}{diff.stderr}"
    assert diff.stdout == ""
    # The operator owns only status on the user's object, through the status subresource.
    isvc = cluster.kubectl_json("get", "vis", "chat", "-n", namespace, "--show-managed-fields")
    managers = {
        (m["manager"], m.get("subresource", "")): m for m in isvc["metadata"]["managedFields"]
    }
    assert ("argocd-controller", "") in managers
    ours = [m for (name, _), m in managers.items() if name == "vllm-operator"]
    assert ours and all(m.get("subresource") == "status" for m in ours)
    assert all("f:spec" not in m.get("fieldsV1", {}) for m in ours)


def _lock(namespace: str, target: str, image: str) -> dict[str, Any]:
    """A benchmark's load Job as the lock: suspended, so it never finishes on its own."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"bench-{target}-lock",
            "namespace": namespace,
            "labels": {
                LABEL_SCALE_DOWN_LOCK: "true",
                LABEL_LOCK_TARGET: target,
                f"{GROUP}/inference-benchmark": "bench",
            },
        },
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "load", "image": image}],
                }
            },
        },
    }


def _replicas(cluster: ClusterHandle, namespace: str, name: str) -> int:
    return int(cluster.kubectl_json("get", "deployment", name, "-n", namespace)["spec"]["replicas"])


def test_the_scale_down_lock_refuses_lower_replicas_on_every_path(
    op: PodOperator, chart_operator: ChartOperator, namespace: str
) -> None:
    cluster = op.cluster
    cluster.apply(gpu_isvc("chat", replicas=2), namespace=namespace)
    _wait_ready(cluster, namespace, "chat")
    image = chart_operator.pod["spec"]["containers"][0]["image"]
    cluster.apply(_lock(namespace, "chat", image))

    refusals = {
        "kubectl scale vis": ("scale", "vis", "chat", "--replicas=1"),
        "kubectl scale deployment": ("scale", "deployment", "chat", "--replicas=1"),
        "a patch of the Deployment": (
            "patch", "deployment", "chat", "--type=merge", "-p", '{"spec":{"replicas":1}}',
        ),
        "a patch of the InferenceService": (
            "patch", "vis", "chat", "--type=merge", "-p", '{"spec":{"replicas":0}}',
        ),
    }  # fmt: skip
    for path, args in refusals.items():
        proc = cluster.kubectl(*args, "-n", namespace, check=False)
        assert proc.returncode != 0, f"{path} was allowed"
        assert "cannot go down from 2 to" in proc.stderr, proc.stderr
        assert "InferenceBenchmark bench" in proc.stderr
    # Scale-up stays allowed, and the operator follows it.
    cluster.kubectl("scale", "vis", "chat", "--replicas=3", "-n", namespace)
    wait_for(lambda: _replicas(cluster, namespace, "chat") == 3, "the scale-up under the lock")
    # Another service in the namespace is not locked.
    cluster.apply(gpu_isvc("other", replicas=2), namespace=namespace)
    cluster.kubectl("scale", "vis", "other", "--replicas=1", "-n", namespace)
    # The lock gone, scale-down works again.
    cluster.kubectl("delete", "job", "bench-chat-lock", "-n", namespace)
    cluster.kubectl("scale", "vis", "chat", "--replicas=1", "-n", namespace)
    wait_for(lambda: _replicas(cluster, namespace, "chat") == 1, "the scale-down after the lock")


def _users_objects(name: str) -> list[dict[str, Any]]:
    """A Service, PodDisruptionBudget and Deployment a user made, each named ``name-<kind>``
    and with no label or owner of the operator's."""
    labels = {"app": f"{name}-users"}
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": f"{name}-service", "labels": labels},
            "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]},
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": f"{name}-poddisruptionbudget", "labels": labels},
            "spec": {"selector": {"matchLabels": labels}, "maxUnavailable": 1},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": f"{name}-deployment", "labels": labels},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]
                    },
                },
            },
        },
    ]


def test_a_users_objects_named_like_a_service_are_left_untouched(
    op: PodOperator, namespace: str
) -> None:
    """Under the chart's RBAC on the real apiserver: an InferenceService named like a
    user's Service, PodDisruptionBudget or Deployment stalls with ``<Kind>Conflict`` and
    changes nothing of that object (same resourceVersion, no owner, no label added)."""
    cluster = op.cluster
    mine = _users_objects("taken")
    cluster.apply(mine, namespace=namespace)
    before = {
        doc["kind"]: cluster.kubectl_json("get", doc["kind"].lower(), doc["metadata"]["name"],
                                          "-n", namespace)
        for doc in mine
    }  # fmt: skip
    for doc in mine:
        cluster.apply(gpu_isvc(doc["metadata"]["name"]), namespace=namespace)

    for kind, obj in before.items():
        name = obj["metadata"]["name"]

        def stalled(name: str = name) -> Any:
            isvc = cluster.kubectl_json("get", "vis", name, "-n", namespace)
            found = condition(isvc, "Stalled")
            return found.get("status") == "True" and found

        stall = wait_for(stalled, f"{name} Stalled with {kind}Conflict")
        assert stall["reason"] == f"{kind}Conflict", stall
    # A few passes later still: nothing of the user's objects changed.
    for kind, obj in before.items():
        now = cluster.kubectl_json("get", kind.lower(), obj["metadata"]["name"], "-n", namespace)
        assert now["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"], kind
        assert not now["metadata"].get("ownerReferences"), kind
        assert now["metadata"].get("labels") == obj["metadata"].get("labels"), kind
    assert not _rbac_denials(op.log_tail(400))
