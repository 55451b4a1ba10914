"""Multi-node plans (tuning/multinode.py, tuning/network.py): a model no single node holds
runs as one vLLM over several nodes, TP within a node and one pipeline stage per node,
chosen only when no single-node plan fits."""

from __future__ import annotations

import pytest

from tests.tuning.helpers import arg, as_plan, as_verdict, model
from vllm_operator.constants import (
    NODE_LABEL_GPU_COUNT,
    NODE_LABEL_GPU_INTERCONNECT,
    NODE_LABEL_GPU_MEMORY_MIB,
    NODE_LABEL_GPU_PRODUCT,
    NODE_LABEL_GPUDIRECT_RDMA,
    NODE_LABEL_NETWORK,
    NODE_LABEL_NETWORK_GBPS,
    NODE_LABEL_NFD_RDMA_CAPABLE,
    NODE_LABEL_RACK,
    NODE_LABEL_ZONE,
)
from vllm_operator.models.inference_service import InferenceServiceSpec
from vllm_operator.tuning.gpus import GPUProfile, node_profile
from vllm_operator.tuning.multinode import placement_topology_key
from vllm_operator.tuning.network import network_from_labels
from vllm_operator.tuning.plan import plan, plan_service
from vllm_operator.tuning.request import resolve_model
from vllm_operator.tuning.results import ModelInput, Plan

H100 = {
    NODE_LABEL_GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3",
    NODE_LABEL_GPU_COUNT: "8",
    NODE_LABEL_GPU_MEMORY_MIB: "81559",
    NODE_LABEL_GPU_INTERCONNECT: "nvlink",
}
H200 = {
    NODE_LABEL_GPU_PRODUCT: "NVIDIA-H200",
    NODE_LABEL_GPU_COUNT: "8",
    NODE_LABEL_GPU_MEMORY_MIB: "143771",
    NODE_LABEL_GPU_INTERCONNECT: "nvlink",
}
INFINIBAND = {
    NODE_LABEL_NETWORK: "infiniband",
    NODE_LABEL_NETWORK_GBPS: "3200",
    NODE_LABEL_GPUDIRECT_RDMA: "true",
}


def node(labels: dict[str, str], name: str = "n") -> GPUProfile:
    profile = node_profile(labels, node=name)
    assert profile is not None
    return profile


def spec(repo: str) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(
        {"model": {"source": {"huggingFace": {"repo": repo}}}}
    )


def resolved(repo: str) -> ModelInput:
    """The catalog's model with the format its published config.json states (FP8)."""
    m = resolve_model(spec(repo).model)
    assert m is not None
    return m


def group(result: object) -> Plan:
    p = as_plan(result)  # type: ignore[arg-type]
    assert p.nodes > 1, f"expected a multi-node plan, got one node: {p.notes}"
    return p


def test_llama_405b_in_bf16_on_8xh100_nodes_is_two_nodes_of_tp8_with_one_stage_each() -> None:
    p = group(plan(model("meta-llama/Llama-3.1-405B"), node(H100 | INFINIBAND), across_nodes=True))
    assert (p.nodes, p.tensor_parallel_size, p.pipeline_parallel_size) == (2, 8, 2)
    assert p.gpus_per_pod == 8 and p.gpus_per_replica == 16
    assert arg(p, "nnodes") == "2" and arg(p, "distributed-executor-backend") == "mp"
    tp, pp = p.argument("tensor-parallel-size"), p.argument("pipeline-parallel-size")
    assert tp is not None and "never" not in tp.reason and "within each node" in tp.reason
    assert pp is not None and pp.source == "Tuner" and "2 is the fewest" in pp.reason
    env = {e.name: e.value for e in p.environment}
    assert env["NCCL_IB_DISABLE"] == "0" and env["NCCL_NET_GDR_LEVEL"] == "SYS"
    # The weights split over 16 GPUs: ~47 GiB each, and a KV cache beside them.
    assert p.memory.weights < 48 * 1024**3 and (p.predictions.kv_cache_tokens or 0) > 100_000
    decode = next(s for s in p.prediction_reasons if s.name == "decode-tokens-per-second")
    assert "pipeline bubble" in decode.reason and "network hop" in decode.reason
    # One sequence passes both stages in turn: no faster than ~all weights at TP 8 allow.
    assert 15 < (p.predictions.decode_tokens_per_second or 0) < 35


def test_the_same_model_on_unlabelled_nodes_assumes_ethernet_and_says_so() -> None:
    p = group(plan(model("meta-llama/Llama-3.1-405B"), node(H100), across_nodes=True))
    env = {e.name: e.value for e in p.environment}
    assert env["NCCL_IB_DISABLE"] == "1" and "NCCL_NET_GDR_LEVEL" not in env
    assert any("Ethernet (NCCL over TCP) assumed" in n for n in p.notes)
    fast = group(
        plan(model("meta-llama/Llama-3.1-405B"), node(H100 | INFINIBAND), across_nodes=True)
    )
    assert (p.predictions.decode_tokens_per_second or 0) < (
        fast.predictions.decode_tokens_per_second or 0
    )


def test_deepseek_v3_fp8_fits_one_8xh200_node_and_stays_single_node() -> None:
    p = as_plan(
        plan(resolved("deepseek-ai/DeepSeek-V3"), node(H200 | INFINIBAND), across_nodes=True)
    )
    assert p.nodes == 1 and p.tensor_parallel_size == 8 and arg(p, "nnodes") is None
    assert arg(p, "quantization") == "fp8"


def test_deepseek_v3_fp8_on_8xh100_nodes_is_two_nodes_and_names_data_expert_parallel() -> None:
    p = group(plan(resolved("deepseek-ai/DeepSeek-V3"), node(H100 | INFINIBAND), across_nodes=True))
    assert (p.nodes, p.tensor_parallel_size, p.pipeline_parallel_size) == (2, 8, 2)
    assert arg(p, "quantization") == "fp8"
    assert any("--enable-expert-parallel" in n for n in p.notes)


def test_deepseek_v3_in_bf16_on_8xh200_nodes_is_two_nodes() -> None:
    from vllm_operator.tuning.quantization import UNQUANTIZED

    p = group(
        plan(
            model("deepseek-ai/DeepSeek-V3", UNQUANTIZED),
            node(H200 | INFINIBAND),
            across_nodes=True,
        )
    )
    assert (p.nodes, p.tensor_parallel_size) == (2, 8)


def test_a_model_that_fits_one_node_stays_single_node() -> None:
    p = as_plan(plan(model("meta-llama/Llama-3.1-70B"), node(H100 | INFINIBAND), across_nodes=True))
    assert p.nodes == 1 and p.network is None and arg(p, "nnodes") is None
    assert not any(e.name.startswith("NCCL_IB") for e in p.environment)


def test_pcie_workstations_get_the_verdict_not_a_group_of_them() -> None:
    labels = {
        NODE_LABEL_GPU_PRODUCT: "NVIDIA-GeForce-RTX-4090",
        NODE_LABEL_GPU_COUNT: "2",
        NODE_LABEL_GPU_MEMORY_MIB: "24564",
        NODE_LABEL_GPU_INTERCONNECT: "pcie",
    }
    v = as_verdict(plan(model("meta-llama/Llama-3.1-70B"), node(labels), across_nodes=True))
    assert v.reason == "WeightsDoNotFit"


def test_a_pinned_tensor_parallel_size_is_never_spread_over_nodes() -> None:
    from vllm_operator.models.inference_service import TuningSpec

    pinned = TuningSpec(overrides={"tensor-parallel-size": "8"})
    v = as_verdict(
        plan(model("meta-llama/Llama-3.1-405B"), node(H100), tuning=pinned, across_nodes=True)
    )
    assert v.reason == "WeightsDoNotFit"


def test_a_service_goes_multi_node_only_when_no_node_holds_it() -> None:
    nodes = [node(H100 | INFINIBAND, f"h100-{i}") for i in range(3)]
    p = group(plan_service(spec("meta-llama/Llama-3.1-405B"), nodes))
    assert p.nodes == 2 and not any("stay Pending" in n for n in p.notes)
    # DeepSeek-V3 (FP8) does not fit one 8 x H100 node but fits the 8 x H200 beside them:
    # the single node wins, however many H100 nodes a group could use.
    h200 = node(H200, "h200")
    single = as_plan(plan_service(spec("deepseek-ai/DeepSeek-V3"), [*nodes, h200]))
    assert single.nodes == 1 and single.gpu.name == "H200"


def test_a_group_larger_than_the_nodes_seen_is_planned_with_a_note() -> None:
    p = group(plan_service(spec("meta-llama/Llama-3.1-405B"), [node(H100 | INFINIBAND)]))
    assert any("1 of that shape are schedulable now" in n for n in p.notes)


def test_the_group_is_shown_in_the_effective_tuning() -> None:
    p = group(plan_service(spec("meta-llama/Llama-3.1-405B"), [node(H100 | INFINIBAND)] * 2))
    t = p.effective_tuning()
    assert t.gpus_per_replica == 16
    args = {a.name: a for a in t.arguments}
    assert args["nnodes"].value == "2" and args["pipeline-parallel-size"].reason
    assert "nnodes" in " ".join(p.command_args())


ROCE = {NODE_LABEL_NETWORK: "roce"}
NFD = {NODE_LABEL_NFD_RDMA_CAPABLE: "true"}
ETHERNET_GDR = {NODE_LABEL_NETWORK: "ethernet", NODE_LABEL_GPUDIRECT_RDMA: "true"}


@pytest.mark.parametrize(
    ("labels", "kind", "gbps", "gdr", "assumed"),
    [
        pytest.param(INFINIBAND, "InfiniBand", 3200, True, 0, id="labelled InfiniBand with GDR"),
        pytest.param(ROCE, "RoCE", 400, False, 2, id="RoCE, its rate and GDR assumed"),
        pytest.param(NFD, "RoCE", 400, False, 3, id="NFD's RDMA label reads as RoCE"),
        pytest.param({}, "Ethernet", 100, False, 2, id="nothing labelled is Ethernet over TCP"),
        pytest.param(ETHERNET_GDR, "Ethernet", 100, False, 1, id="GDR is ignored without RDMA"),
    ],
)
def test_network_from_labels(
    labels: dict[str, str], kind: str, gbps: float, gdr: bool, assumed: int
) -> None:
    n = network_from_labels(labels)
    assert (n.kind, n.gbps, n.gpudirect_rdma, len(n.assumed)) == (kind, gbps, gdr, assumed)


def test_a_hop_without_gpudirect_costs_more_than_with_it() -> None:
    with_gdr = network_from_labels(INFINIBAND)
    without = network_from_labels({**INFINIBAND, NODE_LABEL_GPUDIRECT_RDMA: "false"})
    assert without.hop_seconds(32768) > with_gdr.hop_seconds(32768)


RACKED = {NODE_LABEL_RACK: "r1", NODE_LABEL_ZONE: "z"}
ZONED = {NODE_LABEL_ZONE: "z"}


@pytest.mark.parametrize(
    ("nodes", "key"),
    [
        pytest.param([RACKED, RACKED], NODE_LABEL_RACK, id="rack wins over zone"),
        pytest.param([RACKED, ZONED], NODE_LABEL_ZONE, id="a node without a rack falls to zone"),
        pytest.param([{}, ZONED], None, id="no common label, no topology"),
        pytest.param([], None, id="no nodes, no topology"),
    ],
)
def test_placement_topology_key(nodes: list[dict[str, str]], key: str | None) -> None:
    assert placement_topology_key(nodes) == key
