"""The GPU node agent against the real control plane, with a recorded NVML answer set.

The agent runs as a local process (``vllm-operator agent`` through its own module, with
``--nvml-fixture``) for a Node the test creates. The fixture reader records every power
set-call to a file, which is what "the GPU" saw; the GPUNode is read back from the
apiserver. Garbage collection (the Node owns its GPUNode) is the controller-manager's.
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.cluster.cluster import ClusterHandle
from devenv.cluster.processes import wait_until
from e2e.framework import condition
from vllm_operator.agent.manifests import agent_manifests
from vllm_operator.agent.nvml import read_recorded_calls

pytestmark = pytest.mark.cluster

REPO = Path(__file__).parents[1]
FIXTURES = REPO / "tests" / "agent" / "fixtures"
AGENT_MANAGER = "vllm-operator-agent"


class AgentProcess:
    """``vllm-operator agent`` for one node, with its NVML answers from a fixture file."""

    def __init__(self, cluster: ClusterHandle, node: str, workdir: Path, *extra: str) -> None:
        self.record = workdir / "nvml-calls.jsonl"
        self.log = workdir / "agent.log"
        nvml = workdir / "nvml.yaml"
        shutil.copy(FIXTURES / "capped-300w-of-450w.yaml", nvml)
        argv = [
            sys.executable,
            "-m",
            "vllm_operator.agent.cli",
            f"--node-name={node}",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--nvml-fixture={nvml}",
            f"--nvml-record={self.record}",
            "--interval=2",
            *extra,
        ]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=cluster.env()
            )

    def set_calls(self) -> list[int]:
        return [c["milliwatts"] for c in read_recorded_calls(self.record)]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


@pytest.fixture
def node(crds: ClusterHandle) -> Iterator[str]:
    """A Node of our own (no kubelet, no capacity: nothing else is scheduled on it)."""
    name = f"e2e-agent-{secrets.token_hex(3)}"
    crds.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    yield name
    crds.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)
    crds.kubectl("delete", "gpunode", name, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture
def agent_factory(
    crds: ClusterHandle,
    node: str,
    tmp_path: Path,
) -> Iterator[Any]:
    started: list[AgentProcess] = []

    def start(*extra: str) -> AgentProcess:
        agent = AgentProcess(crds, node, tmp_path, *extra)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        if agent.proc.poll() is None:
            agent.stop()
        print(f"----- agent log\n{agent.log_tail()}")


def gpunode(cluster: ClusterHandle, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = cluster.kubectl_json("get", "gpunode", name)
    return obj


def set_policy(cluster: ClusterHandle, name: str, policy: str) -> None:
    patch = {"spec": {"power": {"policy": policy}}}
    cluster.kubectl("patch", "gpunode", name, "--type=merge", "-p", json.dumps(patch))


def wait_ready(cluster: ClusterHandle, name: str) -> None:
    # "condition=Ready" fails at once on an object not yet there; wait for it first.
    cluster.kubectl("wait", "--for=create", f"gpunode/{name}", "--timeout=60s")
    cluster.kubectl("wait", "--for=condition=Ready", f"gpunode/{name}", "--timeout=60s")


def wait_condition(cluster: ClusterHandle, name: str, kind: str, reason: str) -> dict[str, Any]:
    def reached() -> bool:
        return condition(gpunode(cluster, name), kind).get("reason") == reason

    wait_until(f"GPUNode {name} {kind} reason {reason}", reached, timeout_s=60)
    return gpunode(cluster, name)


def test_the_agent_publishes_the_gpunode_and_power_policy_changes_reach_nvml(
    crds: ClusterHandle,
    node: str,
    agent_factory: Any,
) -> None:
    agent = agent_factory()
    wait_ready(crds, node)

    obj = gpunode(crds, node)
    node_uid = crds.kubectl_json("get", "node", node)["metadata"]["uid"]
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
    ]
    assert obj["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-GeForce-RTX-4090"
    assert obj["spec"]["power"]["policy"] == "Unmanaged"  # the CRD's default, not ours
    assert obj["status"]["gpus"][0]["power"]["current"] == 300.0
    assert condition(obj, "PowerCapped")["reason"] == "LimitBelowDefault"
    assert agent.set_calls() == []

    # The agent applies metadata and status only: the spec stays the user's.
    managed = crds.kubectl_json("get", "gpunode", node, "--show-managed-fields")
    ours = [m for m in managed["metadata"]["managedFields"] if m["manager"] == AGENT_MANAGER]
    assert {m["operation"] for m in ours} == {"Apply"}
    assert {m.get("subresource", "") for m in ours} == {"", "status"}
    assert not any("f:spec" in m.get("fieldsV1", {}) for m in ours)

    set_policy(crds, node, "Default")
    obj = wait_condition(crds, node, "PowerPolicyApplied", "Applied")
    assert agent.set_calls() == [450000]
    assert obj["status"]["power"][0]["originalWatts"] == 300.0
    assert obj["status"]["power"][0]["appliedWatts"] == 450.0
    assert obj["status"]["gpus"][0]["power"]["current"] == 450.0
    assert condition(obj, "PowerCapped")["status"] == "False"
    assert obj["spec"]["power"]["policy"] == "Default"

    set_policy(crds, node, "Unmanaged")
    obj = wait_condition(crds, node, "PowerPolicyApplied", "Restored")
    assert agent.set_calls() == [450000, 300000]
    assert obj["status"].get("power", []) == []
    assert obj["status"]["gpus"][0]["power"]["current"] == 300.0

    # Removing the agent restores what it changed.
    set_policy(crds, node, "Max")
    wait_until("the Max limit to be set", lambda: agent.set_calls()[-1:] == [600000])
    assert agent.stop() == 0
    assert agent.set_calls() == [450000, 300000, 600000, 300000]
    obj = gpunode(crds, node)
    ready = condition(obj, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "AgentStopped")
    assert obj["status"].get("power", []) == []

    # The Node owns its GPUNode: it goes with the Node.
    crds.kubectl("delete", "node", node)
    crds.kubectl("wait", "--for=delete", f"gpunode/{node}", "--timeout=60s")


def test_a_dry_run_agent_reports_and_changes_nothing(
    crds: ClusterHandle,
    node: str,
    agent_factory: Any,
) -> None:
    agent = agent_factory("--dry-run")
    wait_ready(crds, node)
    set_policy(crds, node, "Max")
    obj = wait_condition(crds, node, "PowerPolicyApplied", "DryRun")
    assert condition(obj, "PowerPolicyApplied")["message"] == (
        "dry run: would set GPU 0 from 300 W to 600 W"
    )
    assert obj["status"]["power"][0]["dryRun"] is True
    assert agent.stop() == 0
    assert agent.set_calls() == []
    ready = condition(gpunode(crds, node), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "AgentStopped")


def test_a_probe_request_without_cuda_is_answered_with_the_error(
    crds: ClusterHandle,
    node: str,
    agent_factory: Any,
) -> None:
    agent_factory("--dry-run")
    wait_ready(crds, node)
    patch = {"spec": {"probe": {"requestId": "first"}}}
    crds.kubectl("patch", "gpunode", node, "--type=merge", "-p", json.dumps(patch))

    def answered() -> bool:
        probe = (gpunode(crds, node).get("status") or {}).get("bandwidth") or {}
        return probe.get("requestId") == "first"

    wait_until("the probe request to be answered", answered, timeout_s=60)
    probe = gpunode(crds, node)["status"]["bandwidth"]
    # The fixture's GPUs exist nowhere, so there is nothing to measure (no CUDA here, or a
    # CUDA that sees other GPUs): the request is answered with why, and the agent goes on.
    assert probe["error"]
    assert probe.get("results", []) == []
    assert condition(gpunode(crds, node), "Ready")["status"] == "True"


@pytest.mark.parametrize("power", [False, True], ids=["report mode", "power mode"])
def test_the_daemonsets_pods_pass_the_pod_security_level_of_their_namespace(
    crds: ClusterHandle,
    power: bool,
) -> None:
    ns = f"e2e-agent-psa-{secrets.token_hex(3)}"
    manifests = agent_manifests(namespace_name=ns, power_management=power)
    kinds = {m["kind"]: m for m in manifests}
    if crds.kubectl("get", "runtimeclass", "nvidia", check=False).returncode != 0:
        crds.apply(
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": "nvidia"},
                "handler": "nvidia",
            }
        )
    crds.apply(kinds["Namespace"])
    try:
        crds.kubectl("wait", "--for=create", "serviceaccount/default", "-n", ns, "--timeout=60s")
        crds.apply(kinds["ServiceAccount"])
        # Every manifest is valid for the apiserver (nothing cluster-wide is persisted).
        crds.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(manifests))
        template = kinds["DaemonSet"]["spec"]["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "agent", "namespace": ns, **template["metadata"]},
            "spec": {**template["spec"], "nodeName": "gpu-4090x2"},
        }
        admitted = crds.kubectl(
            "create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod), check=False
        )
        assert admitted.returncode == 0, admitted.stderr
        # The level is enforced, so the test can fail: the power pod under restricted.
        crds.kubectl(
            "label", "namespace", ns, "--overwrite", "pod-security.kubernetes.io/enforce=restricted"
        )
        again = crds.kubectl(
            "create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod), check=False
        )
        if power:
            assert again.returncode != 0
            assert "violates PodSecurity" in again.stderr and "SYS_ADMIN" in again.stderr
        else:
            assert again.returncode == 0, again.stderr
    finally:
        crds.kubectl("delete", "namespace", ns, "--wait=false", check=False)
