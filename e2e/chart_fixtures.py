"""Fixtures of the Helm chart's cluster tests (e2e/test_helm.py).

- ``cluster`` (module): a **private** local control plane of its own (own state folder,
  own loopback ports), so that installing and uninstalling the chart's CRDs never touches
  the shared cluster other test sessions use, and so that no operator of another session
  (with admin credentials) can do the work the chart's ServiceAccount must be able to do.
- ``release_artifacts`` (module): ``make release``'s artifacts (scripts/release.py) in a
  folder of the test's: the wheel, the sdist, the packaged chart, the image's OCI archive
  and SHA256SUMS.
- ``chart_release`` (module): the **packaged** chart (the release's .tgz, as a user gets
  it) installed with ``helm install``.
- ``service_account_kubeconfig`` (module): a kubeconfig whose only credential is a token of
  the chart's ServiceAccount (``kubectl create token``), to show what that identity is
  refused. The operator itself runs under it as the chart's pod on the real node
  (e2e/real_node_fixtures.py, e2e/test_chart_operator.py).
"""

from __future__ import annotations

import base64
import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.cluster.cluster import ClusterHandle, down, up
from devenv.cluster.settings import PRIVATE, Settings, default_pod_cidr
from e2e.operator_fixtures import REPO

CHART = REPO / "charts" / "vllm-operator"
RELEASE = "vllm-op"
RELEASE_NAMESPACE = "vllm-operator-system"
SERVICE_ACCOUNT = f"{RELEASE}-vllm-operator"
# Every default port of devenv/cluster plus this offset: beside the shared cluster.
# +5000 keeps every port below 32768, out of Linux's ephemeral range (32768-60999), where
# an outgoing connection may hold the port at the moment etcd wants to bind it.
PORT_OFFSET = int(os.environ.get("VLLM_OP_HELM_PORT_OFFSET", "5000"))


# --------------------------------------------------------------------------- kubeconfig


def token_kubeconfig(admin_kubeconfig: Path, token: str) -> dict[str, Any]:
    """A kubeconfig for the admin kubeconfig's cluster that authenticates with ``token``
    alone (no client certificate): the apiserver sees only the token's identity."""
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    contexts = {c["name"]: c["context"] for c in admin["contexts"]}
    cluster_name = contexts[admin["current-context"]]["cluster"]
    cluster = next(c for c in admin["clusters"] if c["name"] == cluster_name)
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": cluster["cluster"]}],
        "users": [{"name": "chart-service-account", "user": {"token": token}}],
        "contexts": [
            {
                "name": "chart-service-account",
                "context": {"cluster": cluster_name, "user": "chart-service-account"},
            }
        ],
        "current-context": "chart-service-account",
    }


def service_account_token(
    kubectl: list[str], namespace: str, name: str, duration: str = "2h"
) -> str:
    proc = subprocess.run(
        [*kubectl, "create", "token", name, "-n", namespace, f"--duration={duration}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl create token failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def write_service_account_kubeconfig(
    cluster: ClusterHandle, namespace: str, name: str, path: Path
) -> Path:
    kubectl = [str(cluster.kubectl_path), f"--kubeconfig={cluster.kubeconfig}"]
    token = service_account_token(kubectl, namespace, name)
    path.write_text(yaml.safe_dump(token_kubeconfig(cluster.kubeconfig, token)))
    path.chmod(0o600)
    return path


def token_subject(token: str) -> str:
    """The ``sub`` claim of a service-account token (system:serviceaccount:NS:NAME)."""
    payload = token.split(".")[1]
    claims = yaml.safe_load(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return str(claims["sub"])


# --------------------------------------------------------------------------- fixtures


def private_settings(state_dir: Path) -> Settings:
    base = Settings.from_env()
    return dataclasses.replace(
        base,
        state_dir=state_dir,
        etcd_port=base.etcd_port + PORT_OFFSET,
        etcd_peer_port=base.etcd_peer_port + PORT_OFFSET,
        apiserver_port=base.apiserver_port + PORT_OFFSET,
        controller_manager_port=base.controller_manager_port + PORT_OFFSET,
        scheduler_port=base.scheduler_port + PORT_OFFSET,
        kwok_port=base.kwok_port + PORT_OFFSET,
        pod_cidr=default_pod_cidr(PRIVATE),
        # One machine has room for one real node (its address, bridge and routes): the
        # shared cluster's.
        real_node=False,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    """A control plane of this module's own, stopped when the module ends."""
    settings = private_settings(tmp_path_factory.mktemp("helm-cluster"))
    handle = up(settings, owner="pytest")
    try:
        yield handle
    finally:
        if os.environ.get("VLLM_OP_E2E_KEEP_CLUSTER") != "1":
            down(settings)


@dataclasses.dataclass
class Release:
    cluster: ClusterHandle
    name: str
    namespace: str

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert self.cluster.helm_path is not None, "helm was not built (devenv/cluster/build.sh)"
        proc = subprocess.run(
            [str(self.cluster.helm_path), f"--kubeconfig={self.cluster.kubeconfig}", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
            env=self.cluster.env(),
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
        return proc

    def install(self, *values: str, chart: Path = CHART) -> subprocess.CompletedProcess[str]:
        sets = [a for v in values for a in ("--set", v)]
        return self.helm(
            "upgrade", "--install", self.name, str(chart), "-n", self.namespace,
            "--create-namespace", "--wait", "--timeout", "120s", *sets,
        )  # fmt: skip

    def uninstall(self) -> subprocess.CompletedProcess[str]:
        return self.helm("uninstall", self.name, "-n", self.namespace, "--wait")


# Values of the release under test: everything that can run here (no Prometheus
# Operator CRDs in the local cluster, so no ServiceMonitor/PodMonitor; no RuntimeClass
# "nvidia", so the agent's pods run without one).
INSTALL_VALUES = (
    "agent.enabled=true",
    "agent.runtimeClassName=",
    "dashboard.enabled=true",
    "kubeStateMetrics.customResourceState.enabled=true",
    "operator.defaultImage=vllm/vllm-openai:e2e",
)


@dataclasses.dataclass(frozen=True)
class Artifacts:
    dist: Path
    chart: Path  # the packaged chart
    image: Path  # the operator image's OCI archive


@pytest.fixture(scope="module")
def release_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    """scripts/release.py (what `make release` runs) into a folder of the test's."""
    from vllm_operator import __version__

    dist = tmp_path_factory.mktemp("release") / "dist"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "release.py"), "--dist", str(dist)],
        capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return Artifacts(
        dist,
        chart=dist / f"vllm-operator-{__version__}.tgz",
        image=dist / f"vllm-operator-image-{__version__}.oci.tar",
    )


@pytest.fixture(scope="module")
def chart_release(cluster: ClusterHandle, release_artifacts: Artifacts) -> Release:
    release = Release(cluster, RELEASE, RELEASE_NAMESPACE)
    release.install(*INSTALL_VALUES, chart=release_artifacts.chart)
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/inferenceservices.inference.vllm-operator.dev",
        "crd/inferencebenchmarks.inference.vllm-operator.dev",
        "crd/gpunodes.inference.vllm-operator.dev",
        "crd/modelcaches.inference.vllm-operator.dev",
    )  # fmt: skip
    return release


@pytest.fixture(scope="module")
def service_account_kubeconfig(
    chart_release: Release, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    path = tmp_path_factory.mktemp("sa") / "kubeconfig"
    return write_service_account_kubeconfig(
        chart_release.cluster, chart_release.namespace, SERVICE_ACCOUNT, path
    )
