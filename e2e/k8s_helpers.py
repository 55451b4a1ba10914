"""Small helpers the cluster-tier tests share: a poll with a deadline, a status condition,
the benchmark lock a test holds by hand, and a namespace's quick teardown."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from devenv.cluster.cluster import ClusterHandle
from vllm_operator.models.conditions import manifest_condition

# Spelled out, not imported from the operator: a renamed label must fail the tests.
GROUP = "inference.vllm-operator.dev"


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Poll until ``predicate`` returns something truthy, and return it (the waits are on
    state, with a deadline; the pause between polls only spares the CPU)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def delete_namespace(
    cluster: ClusterHandle, name: str, *, wait_gone: bool = False, timeout: int = 120
) -> None:
    """Delete a test's namespace, its pods ended after a 1 s grace period.

    The namespace goes first: a terminating namespace admits no new pod, so no controller
    replaces the ones deleted next. They are deleted at once, not by the namespace
    controller (which starts 5 s after the deletion, a fixed delay upstream), so that they
    stop holding the CPU and GPUs the next test asks for; and with a 1 s grace period,
    since a teardown tests nothing: a vLLM pod's preStop sleep and drain, and python as
    PID 1 (which ignores SIGTERM), held each teardown for their whole grace period (up to
    58 s a test on the real node). ``wait_gone`` also waits for the namespace itself, for
    the fixtures that clean up beside it (volumes, mounts) once it is gone."""
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    cluster.kubectl(
        "delete", "pods", "--all", "-n", name, "--grace-period=1", "--wait=true",
        f"--timeout={timeout}s", check=False, timeout=timeout + 10,
    )  # fmt: skip
    if wait_gone:
        cluster.kubectl(
            "wait", "--for=delete", f"namespace/{name}", f"--timeout={timeout}s",
            check=False, timeout=timeout + 10,
        )  # fmt: skip


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    """The condition of that type in ``obj``'s status, or {}."""
    return manifest_condition(obj or {}, type_) or {}


def lock_job(target: str) -> dict[str, Any]:
    """A benchmark's scale-down lock on service ``target``, as its load Job carries it.
    Suspended: no pod runs (kwok would complete it at once), and it never finishes, so the
    lock holds until the Job is deleted."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "lock",
            "labels": {
                f"{GROUP}/scale-down-lock": "true",
                f"{GROUP}/lock-target": target,
                f"{GROUP}/inference-benchmark": "lock",
            },
        },
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "none"}],
                }
            },
        },
    }


def ready_addresses(slices: list[dict[str, Any]], service: str) -> list[str]:
    """The addresses the EndpointSlices of Service ``service`` list as ready (an unset
    ``ready`` reads as ready, as the API says)."""
    return [
        address
        for s in slices
        if s["metadata"]["labels"].get("kubernetes.io/service-name") == service
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready") is not False
        for address in e["addresses"]
    ]
