"""Kubeconfigs for the local cluster: the admin's and one per component, each for one
client identity with its certificates embedded (pki.py made them)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from devenv.cluster.settings import Settings

# The cluster's name, in the kubeconfig as cluster, user and context: the e2e guard
# recognises our own cluster by it.
CLUSTER_NAME = "vllm-operator-e2e"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(settings: Settings, path: Path, client: str) -> None:
    """A kubeconfig for one client identity, certificates embedded so it can be copied."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {
                    "server": settings.apiserver_url,
                    "certificate-authority-data": _b64(settings.pki_dir / "ca.crt"),
                },
            }
        ],
        "users": [
            {
                "name": f"{CLUSTER_NAME}-{client}",
                "user": {
                    "client-certificate-data": _b64(settings.pki_dir / f"{client}.crt"),
                    "client-key-data": _b64(settings.pki_dir / f"{client}.key"),
                },
            }
        ],
        "contexts": [
            {
                "name": CLUSTER_NAME,
                "context": {"cluster": CLUSTER_NAME, "user": f"{CLUSTER_NAME}-{client}"},
            }
        ],
        "current-context": CLUSTER_NAME,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)


def component_kubeconfig(settings: Settings, client: str) -> Path:
    return settings.state_dir / "kubeconfigs" / f"{client}.kubeconfig"
