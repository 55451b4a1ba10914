"""The control plane's components: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok; each one's command line and how each is asked whether it is
healthy (ready, for the apiserver). `cluster.up` starts them in this order."""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from typing import TYPE_CHECKING

from devenv.cluster import node as real_node
from devenv.cluster import nodes as fake_nodes
from devenv.cluster.kubeconfig import CLUSTER_NAME, component_kubeconfig
from devenv.cluster.processes import ClusterError, PidFile, http_ok, log_tail

if TYPE_CHECKING:
    from devenv.cluster.settings import Settings

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def argv(settings: Settings, name: str, bin_dir: Path) -> list[str]:
    p = settings.pki_dir
    exe = str(bin_dir / name)
    if name == "etcd":
        peer = f"http://127.0.0.1:{settings.etcd_peer_port}"
        client = f"http://127.0.0.1:{settings.etcd_port}"
        return [
            exe,
            "--name=default",
            f"--data-dir={settings.state_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--initial-cluster-state=new",
            # A disposable test cluster: durability is not worth fsync's latency.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]
    if name == "kube-apiserver":
        node_flags = real_node.apiserver_flags() if settings.real_node else []
        replaced = {f.split("=")[0] for f in node_flags}
        argv = [
            exe,
            f"--etcd-servers=http://127.0.0.1:{settings.etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={settings.apiserver_port}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            f"--service-cluster-ip-range={settings.service_cidr}",
            "--authorization-mode=Node,RBAC",
            # On top of the default set (which already has ValidatingAdmissionPolicy,
            # GA since 1.30, and the webhooks); listed so the need is visible here.
            # PodNodeSelector and PodTolerationRestriction let a namespace send all its pods
            # to the real node (node.real_node_namespace).
            "--enable-admission-plugins=NodeRestriction,ValidatingAdmissionPolicy,"
            "PodNodeSelector,PodTolerationRestriction",
            "--allow-privileged=true",
            # The `kubernetes` Service's endpoint would be 127.0.0.1, which endpoint
            # validation rejects (loopback); no pod here talks to it anyway.
            "--endpoint-reconciler-type=none",
            # The aggregation layer (metrics-server, custom metrics for an HPA): the
            # apiserver proxies to extension servers as front-proxy-client, and they trust
            # the user it names in these headers.
            f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
            "--profiling=false",
        ]
        return [a for a in argv if a.split("=")[0] not in replaced] + node_flags
    if name == "kube-controller-manager":
        kc = str(component_kubeconfig(settings, "controller-manager"))
        return [
            exe,
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={settings.controller_manager_port}",
            f"--tls-cert-file={p / 'serving.crt'}",
            f"--tls-private-key-file={p / 'serving.key'}",
            f"--service-account-private-key-file={p / 'sa.key'}",
            f"--root-ca-file={p / 'ca.crt'}",
            f"--cluster-signing-cert-file={p / 'ca.crt'}",
            f"--cluster-signing-key-file={p / 'ca.key'}",
            f"--service-cluster-ip-range={settings.service_cidr}",
            "--cluster-name=" + CLUSTER_NAME,
            # Each controller acts as its own service account, under the bootstrap RBAC
            # roles, as in a kubeadm cluster.
            "--use-service-account-credentials=true",
            "--controllers=*",
            # Its default lies under /usr/libexec, which it would create.
            f"--flex-volume-plugin-dir={settings.state_dir / 'flexvolume'}",
            # One instance: leader election would only delay the start.
            "--leader-elect=false",
            # The default client rate (20/s) throttles the start, where each controller
            # fetches its own service-account token, and bursts of test objects.
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--profiling=false",
        ]
    if name == "kube-scheduler":
        kc = str(component_kubeconfig(settings, "scheduler"))
        return [
            exe,
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={settings.scheduler_port}",
            f"--tls-cert-file={p / 'serving.crt'}",
            f"--tls-private-key-file={p / 'serving.key'}",
            "--leader-elect=false",
            "--profiling=false",
        ]
    if name == "kwok":
        return [
            exe,
            f"--kubeconfig={component_kubeconfig(settings, 'kwok')}",
            f"--config={settings.stages_file}",
            f"--manage-nodes-with-annotation-selector={fake_nodes.KWOK_NODE_SELECTOR}",
            f"--cidr={settings.pod_cidr}",
            "--node-ip=127.0.0.1",
            # kwok renews each node's Lease, as a kubelet does; otherwise the node
            # lifecycle controller would mark the nodes unreachable and evict their pods.
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{settings.kwok_port}",
        ]
    raise ValueError(name)


def _ssl_context(settings: Settings, *, client: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(settings.pki_dir / "ca.crt"))
    if client:
        ctx.load_cert_chain(settings.pki_dir / f"{client}.crt", settings.pki_dir / f"{client}.key")
    return ctx


def health(settings: Settings, name: str) -> tuple[bool, str]:
    """Asks one component whether it is healthy (ready, for the apiserver)."""
    if name == "etcd":
        ok, body = http_ok(f"http://127.0.0.1:{settings.etcd_port}/health")
        return ok and '"health":"true"' in body.replace(" ", ""), body
    if name == "kube-apiserver":
        return http_ok(f"{settings.apiserver_url}/readyz", _ssl_context(settings, client="admin"))
    if name == "kube-controller-manager":
        return http_ok(
            f"https://127.0.0.1:{settings.controller_manager_port}/healthz",
            _ssl_context(settings, client=None),
        )
    if name == "kube-scheduler":
        return http_ok(
            f"https://127.0.0.1:{settings.scheduler_port}/readyz",
            _ssl_context(settings, client=None),
        )
    if name == "kwok":
        return http_ok(f"http://127.0.0.1:{settings.kwok_port}/healthz")
    raise ValueError(name)


def wait_healthy(settings: Settings, name: str, pidfile: PidFile) -> None:
    """Polls the component's health endpoint until it answers OK, failing fast if the
    process died and with the log's tail on timeout."""
    deadline = time.monotonic() + settings.timeout_s
    delay = 0.05
    last = ""
    while True:
        if not pidfile.alive():
            raise ClusterError(
                f"{name} exited while starting; last lines of {settings.logs_dir / name}.log:\n"
                + log_tail(settings, name)
            )
        ok, last = health(settings, name)
        if ok:
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"{name} not healthy after {settings.timeout_s:.0f} s ({last}); last lines of "
                f"its log:\n" + log_tail(settings, name)
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
