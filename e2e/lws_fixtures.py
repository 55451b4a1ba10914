"""Fixtures of the multi-node tests: LeaderWorkerSet's CRDs, and its real controller.

The controller is the upstream one, built from the Go module proxy at the version
``devenv/cluster/versions.env`` pins (``devenv/cluster/build-lws.sh``, cached by version),
run as a local process against the local control plane, as its manager would run in a pod.

Its webhooks matter: the pod webhook gives each pod its group labels, the leader's address
and the exclusive-topology affinities, so without it no group forms. In a cluster LWS makes
its own serving certificate (internal cert rotation, for ``lws-webhook-service.<ns>.svc``)
and the apiserver reaches it through that Service. Here the apiserver runs on the host, with
no Service routing and no cluster DNS, so the controller runs with internal cert management
off, serving a certificate made here for 127.0.0.1 on a free loopback port, and the webhook
configurations (the module's own ``config/webhook/manifests.yaml``) name that URL and this
CA, as controller-runtime's envtest does. Each webhook only sees namespaces labelled
``e2e.vllm-operator.dev/lws=true``: the pod webhooks fail closed (``failurePolicy: Fail``)
and match every pod, so scoped to the tests' namespaces they cannot block the pods of other
tests sharing the cluster when this controller is not running.

The CRDs stay installed when the session ends (e2e/test_api.py validates the golden
LeaderWorkerSets against them); the controller and its webhook configurations go.
"""

from __future__ import annotations

import base64
import copy
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.ci import skip_or_fail
from devenv.cluster import pki, processes
from devenv.cluster.cluster import ClusterHandle
from devenv.vllm_server import free_port

REPO = Path(__file__).parents[1]
BUILD = REPO / "devenv" / "cluster" / "build-lws.sh"
NAMESPACE_LABEL = "e2e.vllm-operator.dev/lws"
COMPONENT = "lws-controller"
WEBHOOK_PREFIX = "vllm-op-e2e-lws"


def _build() -> Path:
    """The folder with lws-controller, crds/ and webhooks.yaml (built on first use)."""
    out = subprocess.run(
        ["bash", str(BUILD)], capture_output=True, text=True, check=False, timeout=1800
    )
    if out.returncode != 0:
        raise RuntimeError(f"build-lws.sh failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def lws_dir() -> Path:
    return _build()


@pytest.fixture(scope="session")
def lws_crds(cluster: ClusterHandle, lws_dir: Path) -> ClusterHandle:
    """LeaderWorkerSet's CRDs (and DisaggregatedSet's, which its controller also runs),
    applied server-side and Established; left installed."""
    crds = str(lws_dir / "crds")
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", crds)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", crds)
    return cluster


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def webhook_configurations(
    manifests: list[dict[str, Any]], *, url: str, ca_pem: bytes
) -> list[dict[str, Any]]:
    """The module's webhook configurations, renamed, pointed at ``url`` with this CA, and
    scoped to the namespaces labelled for these tests."""
    out = []
    for doc in manifests:
        doc = copy.deepcopy(doc)
        doc["metadata"] = {"name": f"{WEBHOOK_PREFIX}-{doc['metadata']['name']}"}
        hooks = []
        for hook in doc["webhooks"]:
            groups = {g for r in hook["rules"] for g in r["apiGroups"]}
            if "disaggregatedset.x-k8s.io" in groups:
                continue  # not a kind these tests create
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"{url}{path}",
                "caBundle": base64.b64encode(ca_pem).decode(),
            }
            hook["namespaceSelector"] = {"matchLabels": {NAMESPACE_LABEL: "true"}}
            hook["timeoutSeconds"] = 10
            hooks.append(hook)
        doc["webhooks"] = hooks
        out.append(doc)
    return out


@dataclass(frozen=True)
class LwsController:
    cluster: ClusterHandle
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@pytest.fixture(scope="session")
def lws_controller(lws_crds: ClusterHandle, lws_dir: Path) -> Iterator[LwsController]:
    """The real LWS controller, healthy, with its webhooks registered."""
    cluster = lws_crds
    settings = cluster.settings
    if settings is None:
        skip_or_fail("the LWS controller runs against the local control plane only")
    work = settings.state_dir / "lws"
    ca_pem = pki.serving_pair(work / "certs", ca_cn="vllm-op-e2e-lws-ca", cn="lws-webhook")
    webhook_port, health_port = free_port(), free_port()
    config = {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(work / "certs")},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
    }
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    argv = [
        str(lws_dir / "lws-controller"),
        f"--config={work / 'config.yaml'}",
        f"--kubeconfig={cluster.kubeconfig}",
        "--zap-log-level=info",
    ]
    processes.start(settings, COMPONENT, argv)
    hooks = webhook_configurations(
        list(yaml.safe_load_all((lws_dir / "webhooks.yaml").read_text())),
        url=f"https://127.0.0.1:{webhook_port}",
        ca_pem=ca_pem,
    )
    try:
        processes.wait_until(
            "the LWS controller's readyz",
            lambda: processes.http_ok(f"http://127.0.0.1:{health_port}/readyz")[0],
            120,
        )
        # readyz answers before the webhook server listens: wait for that too.
        processes.wait_until("the LWS webhook server", lambda: _listening(webhook_port), 60)
        cluster.apply(hooks)
        yield LwsController(cluster, settings.logs_dir / f"{COMPONENT}.log")
    finally:
        for doc in hooks:
            kind = doc["kind"].lower()
            cluster.kubectl("delete", kind, doc["metadata"]["name"], "--ignore-not-found")
        processes.stop(settings, COMPONENT)
