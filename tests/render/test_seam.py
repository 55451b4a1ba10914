"""The seam between the tuner and the renderer: the planner hands over one complete
``EffectiveTuning`` (arguments, environment, GPUs, pod) and the renderer renders that and
nothing it derives again. Once the plan's environment was dropped on the way: a PCIe
plan's NCCL_P2P_DISABLE=1, there to stop NCCL hanging on boards without peer-to-peer,
never reached the container."""

from __future__ import annotations

from tests.specs import isvc
from tests.tuning.helpers import gpus
from vllm_operator.models.inference_service import EffectiveArgument, EffectiveTuning
from vllm_operator.reconcile.placement import plan_inference_service
from vllm_operator.render.deployment import DRAIN_SECONDS, build_deployment, vllm_args
from vllm_operator.tuning import plan_service
from vllm_operator.tuning.results import Plan


def _container(service: object, tuning: EffectiveTuning) -> dict[str, object]:
    dep = build_deployment(service, tuning, image="vllm:x", replicas=1)  # type: ignore[arg-type]
    container: dict[str, object] = dep["spec"]["template"]["spec"]["containers"][0]
    return container


def _env(container: dict[str, object]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container["env"]}  # type: ignore[attr-defined]


def test_a_pcie_plans_environment_reaches_the_container() -> None:
    service = isvc(
        model={
            "name": "llama-2-13b",
            "source": {"huggingFace": {"repo": "meta-llama/Llama-2-13b-hf"}},
        },
        gpu={"count": "auto"},
    )
    result = plan_service(service.spec, [gpus("RTX-4090", 2, "phb")], name="llama-2-13b")
    assert isinstance(result, Plan), result
    tuning = result.effective_tuning()
    assert [(e.name, e.value) for e in tuning.environment] == [("NCCL_P2P_DISABLE", "1")]
    assert "peer-to-peer" in tuning.environment[0].reason
    container = _container(service, tuning)
    assert _env(container)["NCCL_P2P_DISABLE"] == "1"
    # The arguments are the plan's, spelled once (models.command_flags).
    assert container["args"] == [
        *vllm_args(service, tuning),
        "--shutdown-timeout",
        str(DRAIN_SECONDS),
    ]
    assert "--tensor-parallel-size" in container["args"]


def test_the_users_env_overrides_the_plans() -> None:
    service = isvc(
        gpu={"count": 2},
        podTemplate={"env": [{"name": "NCCL_P2P_DISABLE", "value": "0"}]},
    )
    tuning = EffectiveTuning(
        planned_by="Tuner",
        gpus_per_replica=2,
        environment=[
            EffectiveArgument(name="NCCL_P2P_DISABLE", value="1", source="Tuner", reason="r")
        ],
    )
    env = [e for e in _container(service, tuning)["env"] if e["name"] == "NCCL_P2P_DISABLE"]  # type: ignore[attr-defined]
    assert env == [{"name": "NCCL_P2P_DISABLE", "value": "0"}]


def test_an_unplanned_service_gets_its_gpus_and_pod_from_the_planner_not_the_renderer() -> None:
    service = isvc(
        gpu={"count": 2},
        node={"cpus": 3, "memory": "10Gi", "shmSize": "1Gi"},
        model={"source": {"image": {"path": "/models/unknown"}}},
    )
    outcome = plan_inference_service(service, nodes=[], gpu_nodes=[])
    tuning = outcome.tuning
    assert tuning.planned_by == "SpecOnly"
    assert tuning.gpus_per_replica == 2
    assert tuning.pod is not None
    assert (tuning.pod.cpus, tuning.pod.memory, tuning.pod.shm_size) == (3, "10Gi", "1Gi")
    resources = _container(service, tuning)["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == "2"  # type: ignore[index]
