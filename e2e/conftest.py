"""Fixtures of the cluster tier: the control plane, a namespace per test, and diagnostics.

`cluster` (session) starts the local control plane of `devenv.cluster`, or reuses one that
is already running, and yields a `ClusterHandle`. A guard keeps the suite off clusters
that are not ours: if `KUBECONFIG` names anything but the local cluster, the session
stops unless `VLLM_OP_E2E_USE_EXISTING=1` says to use that cluster as it is (kind, say).

`namespace` (function) creates a fresh namespace and deletes it afterwards. When a test
fails, its events, the YAML of the objects in its namespace and the tail of every
component's log are printed (pytest shows them with the failure) and written under
`<state>/logs/diagnostics/` (``e2e.framework.dump_diagnostics``).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import pytest
import yaml

from devenv.cluster.cluster import ClusterHandle, join, leave, up
from devenv.cluster.kubeconfig import CLUSTER_NAME
from devenv.cluster.processes import ClusterError
from devenv.cluster.settings import Settings, resolve_binaries
from e2e.framework import create_namespace, delete_namespace, dump_diagnostics
from e2e.lws_fixtures import lws_controller, lws_crds, lws_dir  # noqa: F401

# The operator's fixtures, registered once for the whole tier. Imported into several test
# modules instead, a session fixture is one fixture per module (pytest keys a fixture by
# where it is defined): a full run had up to four operators reconciling the same cluster.
from e2e.operator_fixtures import (  # noqa: F401
    crds,
    local_operator,
    lock_policy,
    operator_process,
)
from e2e.real_node_fixtures import chart_operator, real_images, real_namespace  # noqa: F401

USE_EXISTING = "VLLM_OP_E2E_USE_EXISTING"
KEEP_CLUSTER = "VLLM_OP_E2E_KEEP_CLUSTER"
NAMESPACE_LABEL = "e2e.vllm-operator.dev/test"

_reports = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under e2e/ is a cluster test, whether or not its module says so, and one
    that asks for the real node's images (every real-node fixture does) is a ``real_node``
    test: `make test` runs the others on the side cluster, at the same time. First, before
    pytest's own hook deselects by marker: `make test-e2e` selects `-m cluster`."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.cluster)
            if "real_images" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.real_node)
    # A stable sort: each module's tests stay together and in their order.
    items.sort(key=lambda item: _first_index(Path(str(item.path)).name))


# The real-node modules that assert on no latency, throughput or scaling under load: run
# first, while `make test`'s side part (its real-vLLM tier, a server on the host) loads
# the machine; the ones that measure run after it.
RUN_FIRST: Final = (
    "test_chart_operator.py",
    "test_pod_failures.py",
    "test_model_cache.py",
    "test_real_node.py",
)


def _first_index(module: str) -> int:
    return RUN_FIRST.index(module) if module in RUN_FIRST else len(RUN_FIRST)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    # Keep each phase's report on the item, so fixtures can tell in their teardown
    # whether the test failed.
    report: pytest.TestReport = yield
    item.stash.setdefault(_reports, {})[report.when] = report
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    reports = request.node.stash.get(_reports, {})
    return any(r.failed for r in reports.values())


# --------------------------------------------------------------------------- guard


def _our_kubeconfig(path: Path, settings: Settings) -> bool:
    """True if the kubeconfig is the local cluster's, or a copy of it."""
    if path.resolve() == settings.kubeconfig.resolve():
        return True
    try:
        doc: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return False
    contexts = {c["name"]: c.get("context", {}) for c in doc.get("contexts") or []}
    clusters = {c["name"]: c.get("cluster", {}) for c in doc.get("clusters") or []}
    context = contexts.get(doc.get("current-context", ""), {})
    if context.get("cluster") != CLUSTER_NAME:
        return False
    server = urlsplit(str(clusters.get(CLUSTER_NAME, {}).get("server", "")))
    return server.hostname == "127.0.0.1" and server.port == settings.apiserver_port


def _existing_cluster(kubeconfig: str) -> ClusterHandle:
    """A handle on the cluster the user pointed KUBECONFIG at, used as it is."""
    path = Path(kubeconfig.split(os.pathsep)[0]).expanduser()
    kubectl = shutil.which("kubectl")
    bin_dir: Path | None = None
    if kubectl is None:
        try:
            bin_dir = resolve_binaries(build=False)
            kubectl = str(bin_dir / "kubectl")
        except ClusterError:
            pytest.exit("kubectl is not on PATH; install it or run `make cluster-up` once", 2)
    helm = shutil.which("helm")
    handle = ClusterHandle(
        kubeconfig=path,
        kubectl_path=Path(kubectl),
        helm_path=Path(helm) if helm else None,
        bin_dir=bin_dir,
        local=False,
    )
    handle.kubectl("version")  # fails early, with kubectl's words, if it is unreachable
    return handle


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterHandle]:
    """The cluster under test: the local control plane (started or reused), or the one
    KUBECONFIG names when VLLM_OP_E2E_USE_EXISTING=1."""
    settings = Settings.from_env()
    kubeconfig = os.environ.get("KUBECONFIG", "")
    if os.environ.get(USE_EXISTING) == "1":
        if not kubeconfig:
            pytest.exit(f"{USE_EXISTING}=1 needs KUBECONFIG to name the cluster to use", 2)
        yield _existing_cluster(kubeconfig)
        return
    if kubeconfig and not (
        os.pathsep not in kubeconfig and _our_kubeconfig(Path(kubeconfig), settings)
    ):
        pytest.exit(
            f"KUBECONFIG={kubeconfig} is not the local e2e cluster ({settings.kubeconfig}). "
            f"The cluster tests create and delete objects; to run them against that cluster "
            f"anyway, set {USE_EXISTING}=1. To use the local cluster, unset KUBECONFIG.",
            2,
        )
    handle = up(settings, owner="pytest")
    join(settings)
    # In-process clients (the operator under test, kubernetes_asyncio) find it too.
    previous = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(handle.kubeconfig)
    try:
        yield handle
    finally:
        if previous is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = previous
        # A cluster that test sessions started goes with the last of them; one started
        # with `make cluster-up` (or kept on request) stays.
        leave(settings, stop=os.environ.get(KEEP_CLUSTER) != "1")


# --------------------------------------------------------------------------- namespace


def _namespace_name(request: pytest.FixtureRequest) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")
    # 63 characters at most; the suffix keeps reruns and parallel sessions apart.
    return f"e2e-{base[:48].rstrip('-')}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(cluster: ClusterHandle, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (after diagnostics on failure)."""
    name = _namespace_name(request)
    create_namespace(cluster, name, labels={NAMESPACE_LABEL: "true"})
    yield name
    if _failed(request):
        dump_diagnostics(cluster, request, namespace=name)
    delete_namespace(cluster, name, timeout=60)


@pytest.fixture(autouse=True)
def _diagnostics_without_namespace(request: pytest.FixtureRequest) -> Iterator[None]:
    # Tests with a namespace get their dump from `namespace`, before it is deleted.
    yield
    if (
        _failed(request)
        and "cluster" in request.fixturenames
        and "namespace" not in request.fixturenames
    ):
        dump_diagnostics(request.getfixturevalue("cluster"), request, namespace=None)
