"""What a tuned vLLM pod must carry, checked as properties of the rendered Deployment."""

from __future__ import annotations

from typing import Any

from tests.specs import isvc, plan_for
from vllm_operator.constants import WARMED_UP_CONDITION
from vllm_operator.models.quantity import to_bytes
from vllm_operator.render.deployment import build_deployment


def _deploy(**spec: Any) -> dict[str, Any]:
    svc = isvc(**spec)
    return build_deployment(svc, plan_for(svc), image="img", replicas=svc.spec.replicas)


def _container(dep: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = dep["spec"]["template"]["spec"]["containers"][0]
    return container


def test_shm_is_a_memory_volume_counted_in_the_memory_limit() -> None:
    dep = _deploy(node={"shmSize": "8Gi", "memory": "16Gi"})
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    limits = _container(dep)["resources"]["limits"]
    assert to_bytes(limits["memory"]) == to_bytes("24Gi")


def test_cpu_pinning_gives_guaranteed_qos_and_matching_threads() -> None:
    dep = _deploy(node={"cpuPinning": True, "cpus": 6, "memory": "8Gi"})
    res = _container(dep)["resources"]
    assert res["requests"]["cpu"] == res["limits"]["cpu"] == "6"
    assert res["requests"]["memory"] == res["limits"]["memory"]
    env = {e["name"]: e.get("value") for e in _container(dep)["env"]}
    assert env["OMP_NUM_THREADS"] == "6"


def test_without_pinning_there_is_no_cpu_limit() -> None:
    res = _container(_deploy())["resources"]
    assert "cpu" not in res["limits"] and "cpu" in res["requests"]


def test_gpus_are_requested_and_tolerated() -> None:
    dep = _deploy(gpu={"count": 2})
    res = _container(dep)["resources"]
    assert res["limits"]["nvidia.com/gpu"] == "2"
    assert "--tensor-parallel-size" in _container(dep)["args"]
    keys = [t.get("key") for t in dep["spec"]["template"]["spec"]["tolerations"]]
    assert "nvidia.com/gpu" in keys


def test_products_become_required_node_affinity() -> None:
    dep = _deploy(gpu={"products": ["NVIDIA-GeForce-RTX-4090"]})
    terms = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["NVIDIA-GeForce-RTX-4090"]


def test_the_readiness_gate_is_there_only_with_warmup() -> None:
    on = _deploy()["spec"]["template"]["spec"]
    off = _deploy(warmup={"enabled": False})["spec"]["template"]["spec"]
    assert on["readinessGates"] == [{"conditionType": WARMED_UP_CONDITION}]
    assert "readinessGates" not in off


def test_drain_fits_in_the_grace_period() -> None:
    dep = _deploy()
    pod = dep["spec"]["template"]["spec"]
    args = _container(dep)["args"]
    drain = int(args[args.index("--shutdown-timeout") + 1])
    pre_stop = int(_container(dep)["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] > drain + pre_stop


def test_startup_budget_follows_the_plan() -> None:
    svc = isvc()
    plan = plan_for(svc)
    assert plan.pod is not None
    plan.pod.startup_seconds = 3000
    dep = build_deployment(svc, plan, image="img", replicas=1)
    probe = _container(dep)["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 3000


def test_overrides_win_and_reach_the_command_line() -> None:
    dep = _deploy(tuning={"profile": "FastStart", "overrides": {"enforce-eager": "false"}})
    args = _container(dep)["args"]
    assert "--no-enforce-eager" in args and "--enforce-eager" not in args


def test_user_env_replaces_ours_of_the_same_name() -> None:
    dep = _deploy(podTemplate={"env": [{"name": "HF_HOME", "value": "/elsewhere"}]})
    env = [e for e in _container(dep)["env"] if e["name"] == "HF_HOME"]
    assert env == [{"name": "HF_HOME", "value": "/elsewhere"}]


def test_children_are_owned_by_the_service() -> None:
    ref = _deploy()["metadata"]["ownerReferences"][0]
    assert ref["kind"] == "InferenceService" and ref["controller"] is True
