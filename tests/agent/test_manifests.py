"""The node agent's DaemonSet: least privilege per mode, and the deploy/ copy is current."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vllm_operator.agent.manifests import agent_manifests

DEPLOY = Path(__file__).parents[2] / "deploy" / "agent"


def by_kind(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {m["kind"]: m for m in manifests}


def pod(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = by_kind(manifests)["DaemonSet"]["spec"]["template"]["spec"]
    return spec


def test_reading_runs_as_non_root_with_nothing_added_under_restricted() -> None:
    m = agent_manifests()
    spec = pod(m)
    container = spec["containers"][0]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert "--dry-run" in container["args"]
    labels = by_kind(m)["Namespace"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_only_the_power_mode_gets_sys_admin_and_nothing_else() -> None:
    m = agent_manifests(power_management=True)
    container = pod(m)["containers"][0]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert container["securityContext"]["privileged"] is False
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert "--dry-run" not in container["args"]
    labels = by_kind(m)["Namespace"]["metadata"]["labels"]
    # SYS_ADMIN is outside baseline; the namespace says so rather than hiding it.
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"


@pytest.mark.parametrize("power", [False, True])
def test_no_host_namespaces_and_no_gpu_taken_from_workloads(power: bool) -> None:
    spec = pod(agent_manifests(power_management=power))
    assert (spec["hostNetwork"], spec["hostPID"], spec["hostIPC"]) == (False, False, False)
    assert "volumes" not in spec
    container = spec["containers"][0]
    assert "nvidia.com/gpu" not in str(container["resources"])
    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_it_tolerates_gpu_taints_and_runs_only_on_gpu_nodes() -> None:
    spec = pod(agent_manifests())
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in spec["tolerations"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_rbac_is_exactly_what_the_agent_calls() -> None:
    rules = by_kind(agent_manifests())["ClusterRole"]["rules"]
    assert rules == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["inference.vllm-operator.dev"],
            "resources": ["gpunodes"],
            "verbs": ["get", "list", "watch", "create", "patch"],
        },
        {
            "apiGroups": ["inference.vllm-operator.dev"],
            "resources": ["gpunodes/status"],
            "verbs": ["get", "patch"],
        },
    ]


def test_labelling_nodes_adds_patch_on_nodes_and_the_flag() -> None:
    m = agent_manifests(label_nodes=True)
    assert "patch" in by_kind(m)["ClusterRole"]["rules"][0]["verbs"]
    assert "--label-node" in pod(m)["containers"][0]["args"]


def test_the_binding_names_the_daemonsets_service_account() -> None:
    m = by_kind(agent_manifests(namespace_name="gpu-agent"))
    subject = m["ClusterRoleBinding"]["subjects"][0]
    assert subject == {
        "kind": "ServiceAccount",
        "name": m["DaemonSet"]["spec"]["template"]["spec"]["serviceAccountName"],
        "namespace": "gpu-agent",
    }
    assert m["ServiceAccount"]["metadata"]["namespace"] == "gpu-agent"
