"""The operator under faults of its connection to the apiserver (issue 15, items 2 and 4).

Each test runs its own operator process (``vllm-operator run``) with settings of its own,
the session's operator stopped meanwhile so that nothing else reconciles the objects:

- **A silent connection.** The operator talks to the apiserver through a local TCP proxy
  (e2e/tcp_proxy.py). The proxy stalls: every connection stays open and forwards nothing,
  new ones too. A spec change made then cannot be seen; the operator is stuck (its resync
  is overdue and nothing completes) and ``/healthz`` must say so. The proxy then forwards
  new connections again while the stalled ones stay silent (a half-open connection): the
  change must be reconciled within 90 s, and ``/healthz`` must recover. Before, no request
  had a timeout: the resync's LIST waited on its silent connection for ever, Kopf's for
  300 s, and Kopf's ``/healthz`` answered 200 throughout.
- **An apiserver restart.** The apiserver is killed (SIGKILL), stays away 35 s, and comes
  back; a spec change made as soon as it answers must be reconciled within 10 s. The
  operator's resync is set to 10 minutes here, so only its watches can catch up. Before,
  Kopf's watch retried after 1, 1, 2, 3, 5, 8, 13 and 21 s: 35 s away put the next attempt
  up to 21 s after the apiserver was back.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.ci import skip_or_fail
from devenv.cluster import components, processes
from devenv.cluster.cluster import ClusterHandle
from e2e.framework import fetch, gpu_isvc, wait_for
from e2e.operator_fixtures import OperatorProcess, log_dir
from e2e.tcp_proxy import StallingProxy
from e2e.test_operator import _wait_ready

# The bound the stalled operator's /healthz is held to, and its resync period: liveness
# should fail about RESYNC_S + LIVENESS_S after the stall (the resync overdue by the bound).
LIVENESS_S = 20
RESYNC_S = 20
# The figures.
STALL_CATCH_UP_S = 90
RESTART_CATCH_UP_S = 10
# How long the apiserver stays away: long enough for Kopf's old back-off to reach 21 s.
APISERVER_AWAY_S = 35


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _healthz(port: int) -> int:
    """/healthz's status code; 0 when it does not answer in 5 s."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def _kubeconfig_via(cluster: ClusterHandle, port: int, path: Path) -> Path:
    """The cluster's kubeconfig with its server at 127.0.0.1:``port``."""
    doc = yaml.safe_load(cluster.kubeconfig.read_text())
    for entry in doc["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(doc))
    return path


def _patch_spec(cluster: ClusterHandle, ns: str, name: str, max_model_len: str) -> int:
    """A spec change; the generation it made."""
    patch = {"spec": {"tuning": {"overrides": {"max-model-len": max_model_len}}}}
    out = cluster.kubectl(
        "patch", "vis", name, "-n", ns, "--type=merge", "-p", json.dumps(patch), "-o", "json"
    ).stdout
    generation: int = json.loads(out)["metadata"]["generation"]
    return generation


def _observed(cluster: ClusterHandle, ns: str, name: str, generation: int) -> bool:
    isvc: dict[str, Any] = fetch(cluster, ns, "vis", name) or {}
    return bool(isvc.get("status", {}).get("observedGeneration", 0) >= generation)


@pytest.fixture
def no_session_operator(local_operator: OperatorProcess) -> Iterator[None]:
    """The session's operator stopped for the test (it would reconcile the same objects
    over a healthy connection), started again afterwards."""
    local_operator.stop()
    yield
    mark = local_operator.log_mark()
    local_operator.start()
    local_operator.wait_started(mark)


@pytest.fixture
def own_operator(
    crds: ClusterHandle,
    no_session_operator: None,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[tuple[OperatorProcess, StallingProxy, int]]:
    """An operator with its /healthz port, talking through a stalling proxy unless the
    parameters say ``proxy: False``; the other parameters are settings."""
    if crds.settings is None:
        skip_or_fail("the fault tests stop and start the local cluster's apiserver")
    env: dict[str, Any] = dict(getattr(request, "param", {}))
    proxy = StallingProxy(crds.settings.apiserver_port)
    proxy.start()
    kubeconfig = None
    if env.pop("proxy", True):
        kubeconfig = _kubeconfig_via(crds, proxy.port, tmp_path / "kubeconfig")
    health = _free_port()
    op = OperatorProcess(
        crds,
        log_dir(crds, tmp_path_factory),
        name=f"operator-{request.node.name}",
        kubeconfig=kubeconfig,
        env={"VLLM_OPERATOR_HEALTH_PORT": str(health), **env},
    )
    mark = op.log_mark()
    op.start()
    try:
        op.wait_started(mark)
        yield op, proxy, health
    finally:
        op.stop()
        proxy.stop()
        print(f"\n===== last lines of {op.log_path}\n{op.log_tail(60)}")


@pytest.mark.parametrize(
    "own_operator",
    [{"VLLM_OPERATOR_LIVENESS_SECONDS": str(LIVENESS_S),
      "VLLM_OPERATOR_RESYNC_SECONDS": str(RESYNC_S)}],
    indirect=True,
    ids=["liveness bound 20 s, resync 20 s"],
)  # fmt: skip
def test_a_silent_connection_fails_liveness_and_the_change_is_reconciled_once_it_clears(
    own_operator: tuple[OperatorProcess, StallingProxy, int], namespace: str
) -> None:
    op, proxy, health = own_operator
    cluster = op.cluster
    cluster.apply(gpu_isvc("chat"), namespace=namespace)
    _wait_ready(cluster, namespace, "chat")
    assert _healthz(health) == 200

    proxy.stall()
    stalled = time.monotonic()
    generation = _patch_spec(cluster, namespace, "chat", "2048")
    # Stuck: the resync overdue by the bound, nothing completed. The request timeout
    # (30 s) ends the resync's LIST meanwhile; a margin on top.
    wait_for(
        lambda: _healthz(health) == 503,
        "/healthz to fail while every connection is silent",
        timeout=RESYNC_S + LIVENESS_S + 30 + 30,
    )
    print(f"/healthz failed {time.monotonic() - stalled:.1f} s after the stall")
    assert not _observed(cluster, namespace, "chat", generation), "seen through a stall?"

    proxy.resume()
    resumed = time.monotonic()
    wait_for(
        lambda: _observed(cluster, namespace, "chat", generation),
        "the change made during the stall to be reconciled",
        timeout=STALL_CATCH_UP_S,
    )
    print(f"reconciled {time.monotonic() - resumed:.1f} s after new connections forwarded")
    wait_for(lambda: _healthz(health) == 200, "/healthz to recover", timeout=30)


def _kill_apiserver(cluster: ClusterHandle) -> None:
    assert cluster.settings is not None
    pidfile = processes.PidFile.read(cluster.settings, "kube-apiserver")
    assert pidfile is not None and pidfile.alive(), "no kube-apiserver running"
    os.killpg(pidfile.pid, signal.SIGKILL)
    wait_for(lambda: not pidfile.alive(), "the kube-apiserver to die", timeout=30)
    processes.PidFile.path(cluster.settings, "kube-apiserver").unlink(missing_ok=True)


def _start_apiserver(cluster: ClusterHandle) -> None:
    """Start the apiserver again and return once it is ready (its /readyz answers)."""
    assert cluster.settings is not None and cluster.bin_dir is not None
    settings = cluster.settings
    argv = components.argv(settings, "kube-apiserver", cluster.bin_dir)
    pidfile = processes.start(settings, "kube-apiserver", argv)
    components.wait_healthy(settings, "kube-apiserver", pidfile)


@pytest.mark.parametrize(
    "own_operator",
    [{"VLLM_OPERATOR_RESYNC_SECONDS": "600", "proxy": False}],
    indirect=True,
    ids=["direct, resync 10 minutes: only the watches catch up"],
)
def test_after_an_apiserver_restart_a_change_is_reconciled_within_seconds(
    own_operator: tuple[OperatorProcess, StallingProxy, int], namespace: str
) -> None:
    op, _proxy, _health = own_operator
    cluster = op.cluster
    cluster.apply(gpu_isvc("chat"), namespace=namespace)
    _wait_ready(cluster, namespace, "chat")

    _kill_apiserver(cluster)
    try:
        # The outage is the scenario (its length sets how far Kopf's back-off has grown).
        time.sleep(APISERVER_AWAY_S)
    finally:
        _start_apiserver(cluster)
    answering = time.monotonic()
    generation = _patch_spec(cluster, namespace, "chat", "2048")
    wait_for(
        lambda: _observed(cluster, namespace, "chat", generation),
        "the change made as the apiserver came back to be reconciled",
        timeout=RESTART_CATCH_UP_S,
    )
    print(f"reconciled {time.monotonic() - answering:.1f} s after the apiserver answered")
    tracebacks = op.log_tail(100000).count("Traceback (most recent call last)")
    print(f"{tracebacks} tracebacks in the operator's log")
    assert tracebacks == 0, op.log_tail(200)
