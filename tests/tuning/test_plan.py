"""The planner against the failures docs/field-notes.md lists, and the rest of its decisions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from tests.determinism import same_across_processes
from tests.tuning.helpers import (
    GIB,
    ModelInput,
    arg,
    as_plan,
    as_spec_only,
    as_verdict,
    gpus,
    model,
    workload,
)
from vllm_operator.models.inference_service import (
    GPUSpec,
    HuggingFaceSource,
    InferenceServiceSpec,
    ModelArchitecture,
    ModelSource,
    ModelSpec,
    NodeSpec,
    TuningSpec,
)
from vllm_operator.models.workload import SLO, Workload
from vllm_operator.tuning.gpus import GPUProfile, profile_from_labels
from vllm_operator.tuning.plan import plan, plan_service
from vllm_operator.tuning.quantization import WeightFormat
from vllm_operator.tuning.results import Plan, TuningResult

GPTQ4 = WeightFormat("GPTQ", 4, 128, origin="spec.model.quantization")


@dataclass(frozen=True)
class Case:
    model: ModelInput
    gpu: GPUProfile
    workload: Workload = field(default_factory=Workload)
    tuning: TuningSpec = field(default_factory=TuningSpec)
    slo: SLO = field(default_factory=SLO)
    gpu_count: int | str = "auto"
    check: Callable[[TuningResult], None] = lambda result: None

    def run(self) -> TuningResult:
        return plan(
            self.model,
            self.gpu,
            workload=self.workload,
            tuning=self.tuning,
            slo=self.slo,
            gpu_count=self.gpu_count,  # type: ignore[arg-type]
        )


def _one_gpu_per_replica(result: TuningResult) -> None:
    p = as_plan(result)
    assert p.tensor_parallel_size == 1
    assert p.gpus_per_replica == 1
    assert p.replicas_per_node == 2
    assert arg(p, "tensor-parallel-size") == "1"
    assert p.argument("disable-custom-all-reduce") is None
    assert "no all-reduce" in p.arguments[0].reason


def _marlin_on_one_gpu(result: TuningResult) -> None:
    p = as_plan(result)
    assert p.tensor_parallel_size == 1
    assert arg(p, "quantization") == "gptq_marlin"
    assert "Marlin" in p.argument("quantization").reason  # type: ignore[union-attr]
    assert arg(p, "dtype") == "float16"
    # 4-bit weights of a 7B model: ~3.6 GiB, not 12.6.
    assert p.predictions.weights_bytes is not None
    assert 3.3 * GIB < p.predictions.weights_bytes < 4.0 * GIB


def _does_not_fit_with_options(result: TuningResult) -> None:
    v = as_verdict(result)
    assert v.reason == "WeightsDoNotFit"
    kinds = {o.kind for o in v.options}
    assert {"Quantize", "MoreGPUs", "LargerGPU"} <= kinds
    assert "4-bit" in v.message
    assert "2 x RTX-3060" in v.message


def _smallest_tp_with_headroom(result: TuningResult) -> None:
    p = as_plan(result)
    assert p.tensor_parallel_size == 4
    assert p.link == "NVLink"
    assert p.pod.interconnect == "NVLink"
    reason = p.argument("tensor-parallel-size").reason  # type: ignore[union-attr]
    assert "2 would hold the weights" in reason
    # Headroom: the KV cache holds the workload's 96 sequences of ~1.5k tokens.
    assert p.predictions.kv_cache_tokens is not None
    assert p.predictions.kv_cache_tokens >= 96 * 1500
    assert p.argument("disable-custom-all-reduce") is None


def _context_capped(result: TuningResult) -> None:
    p = as_plan(result)
    length = int(arg(p, "max-model-len") or 0)
    assert 2500 <= length <= 4096
    assert "longest request in the workload" in p.argument("max-model-len").reason  # type: ignore[union-attr]
    assert p.predictions.context_length == length


def _seqs_about_48(result: TuningResult) -> None:
    p = as_plan(result)
    assert arg(p, "max-num-seqs") == "48"
    assert "1.5x the peak concurrency (32)" in p.argument("max-num-seqs").reason  # type: ignore[union-attr]


def _tp_over_pcie_when_needed(result: TuningResult) -> None:
    p = as_plan(result)
    assert p.tensor_parallel_size == 2
    assert p.link == "PHB"
    assert arg(p, "disable-custom-all-reduce") == "true"
    assert [e.name for e in p.environment] == ["NCCL_P2P_DISABLE"]
    assert p.pod.shm_bytes >= 2 * GIB
    assert any("over PCIe" in n for n in p.notes)


def _eager_with_cost(result: TuningResult) -> None:
    p = as_plan(result)
    eager = p.argument("enforce-eager")
    assert eager is not None
    assert eager.value == "true"
    assert "15-22 %" in eager.reason


def _graphs_on_by_default(result: TuningResult) -> None:
    p = as_plan(result)
    assert arg(p, "enforce-eager") == "false"
    # In the budget or, for a dense model on Model Runner V2 (0.25.1 on), outside it.
    assert p.memory.cuda_graphs + p.memory.cuda_graphs_outside > 0


def _exllama_and_float16_on_t4(result: TuningResult) -> None:
    p = as_plan(result)
    assert arg(p, "quantization") == "gptq"
    assert arg(p, "dtype") == "float16"


def _float16_without_bf16(result: TuningResult) -> None:
    p = as_plan(result)
    assert arg(p, "dtype") == "float16"
    assert "no bfloat16" in p.argument("dtype").reason  # type: ignore[union-attr]


def _bfloat16_where_supported(result: TuningResult) -> None:
    assert arg(as_plan(result), "dtype") == "bfloat16"


def _pinned_tp(result: TuningResult) -> None:
    p = as_plan(result)
    assert p.tensor_parallel_size == 2
    tp = p.argument("tensor-parallel-size")
    assert tp is not None
    assert (tp.value, tp.source) == ("2", "Override")
    assert arg(p, "disable-custom-all-reduce") == "true"


def _pinned_context_does_not_fit(result: TuningResult) -> None:
    v = as_verdict(result)
    assert v.reason == "ContextDoesNotFit"
    assert any(o.kind == "ShorterContext" for o in v.options)


def _invalid_tp(result: TuningResult) -> None:
    v = as_verdict(result)
    assert v.reason == "InvalidParallelism"
    assert "28 attention heads" in v.message


def _tpot_buys_gpus(result: TuningResult) -> None:
    p = as_plan(result)
    assert p.tensor_parallel_size == 2
    assert "TPOT" in p.argument("tensor-parallel-size").reason  # type: ignore[union-attr]
    assert p.predictions.decode_tokens_per_second is not None
    assert 1000 / p.predictions.decode_tokens_per_second <= 5


def _moe(result: TuningResult) -> None:
    p = as_plan(result)
    assert p.tensor_parallel_size == 2
    assert p.predictions.weights_bytes == 46_702_792_704 * 2
    # Decode reads ~13B active parameters, not 47B: faster than a dense 47B would be.
    assert p.predictions.decode_tokens_per_second is not None
    dense_rate = 2 * 3350e9 * 0.85 / (46.7e9 * 2)
    assert p.predictions.decode_tokens_per_second > 2 * dense_rate


def _no_workload_context_capped_by_kv(result: TuningResult) -> None:
    p = as_plan(result)
    length = int(arg(p, "max-model-len") or 0)
    assert length < 131_072
    assert length <= (p.kv_cache.num_blocks * p.kv_cache.block_size)
    assert "capped" in p.argument("max-model-len").reason  # type: ignore[union-attr]


def _kv_limited_stays_on_pcie(result: TuningResult) -> None:
    p = as_plan(result)
    assert p.tensor_parallel_size == 1
    seqs = int(arg(p, "max-num-seqs") or 0)
    assert seqs < 256
    assert any("add replicas instead" in n for n in p.notes)


CASES = [
    pytest.param(
        Case(model("Llama-2-7B"), gpus("RTX-4090", 2, "phb"), check=_one_gpu_per_replica),
        id="a 7B fp16 model on two RTX 4090s behind one host bridge runs one GPU per replica",
    ),
    pytest.param(
        Case(
            model("Mistral-7B"),
            gpus("RTX-4090", 2, "pcie"),
            workload(prompt=(10, 2000), output=(50, 1500), peak=16),
            check=_one_gpu_per_replica,
        ),
        id="a 7B bf16 model on two PCIe RTX 4090s with a workload still runs one GPU per replica",
    ),
    pytest.param(
        Case(model("Llama-2-7B", GPTQ4), gpus("RTX-3090", 2, "pcie"), check=_marlin_on_one_gpu),
        id="a 7B GPTQ 4-bit model on two RTX 3090s runs on one GPU with the Marlin kernel",
    ),
    pytest.param(
        Case(model("Llama-2-7B"), gpus("RTX-3060", 1), check=_does_not_fit_with_options),
        id="a 7B fp16 model on one 12 GB card does not fit and says what would",
    ),
    pytest.param(
        Case(
            model("Llama-3.1-70B"),
            gpus("H100-80GB", 8, "nvlink"),
            workload(prompt=(100, 2000), output=(100, 1000), peak=64),
            check=_smallest_tp_with_headroom,
        ),
        id="a 70B model on eight NVLinked H100s takes the smallest TP that leaves KV headroom",
    ),
    pytest.param(
        Case(
            model("Qwen2.5-7B-Instruct"),
            gpus("L40S", 1),
            workload(prompt=(10, 2000), output=(50, 500)),
            check=_context_capped,
        ),
        id="prompts under 2k on a 32k-context model cap the context near the workload",
    ),
    pytest.param(
        Case(
            model("Llama-3.1-8B"),
            gpus("A100-80GB", 1),
            workload(prompt=(10, 2000), output=(50, 500), peak=32),
            check=_seqs_about_48,
        ),
        id="a peak concurrency of 32 gives max-num-seqs 48, not 256",
    ),
    pytest.param(
        Case(model("Llama-2-13B"), gpus("RTX-4090", 2, "phb"), check=_tp_over_pcie_when_needed),
        id="a 13B fp16 model that needs two RTX 4090s gets TP 2 with the PCIe all-reduce settings",
    ),
    pytest.param(
        Case(
            model("Llama-3.1-8B"),
            gpus("L4", 1),
            workload(prompt=(10, 1000), output=(10, 200)),
            TuningSpec(profile="FastStart"),
            check=_eager_with_cost,
        ),
        id="the FastStart profile runs eager and states the throughput it costs",
    ),
    pytest.param(
        Case(
            model("Llama-3.1-8B"),
            gpus("L4", 1),
            workload(prompt=(10, 1000), output=(10, 200)),
            check=_graphs_on_by_default,
        ),
        id="every other profile keeps CUDA graphs on",
    ),
    pytest.param(
        Case(model("Llama-2-7B", GPTQ4), gpus("T4", 1), check=_exllama_and_float16_on_t4),
        id="a GPTQ model on a T4 falls back to the exllama kernel in float16",
    ),
    pytest.param(
        Case(model("Llama-3.2-1B"), gpus("T4", 1), check=_float16_without_bf16),
        id="a bfloat16 model on a GPU without bfloat16 runs in float16",
    ),
    pytest.param(
        Case(model("Llama-3.2-1B"), gpus("A10", 1), check=_bfloat16_where_supported),
        id="a bfloat16 model on an Ampere GPU runs in bfloat16",
    ),
    pytest.param(
        Case(
            model("Mistral-7B"),
            gpus("RTX-4090", 2, "phb"),
            tuning=TuningSpec(overrides={"tensor-parallel-size": "2"}),
            check=_pinned_tp,
        ),
        id="an overridden tensor-parallel size is planned around and marked as an override",
    ),
    pytest.param(
        Case(
            model("Llama-3.1-8B"),
            gpus("RTX-4090", 1),
            tuning=TuningSpec(overrides={"max-model-len": "131072"}),
            check=_pinned_context_does_not_fit,
        ),
        id="an overridden context the KV cache cannot hold does not fit",
    ),
    pytest.param(
        Case(
            model("Qwen2.5-7B-Instruct"),
            gpus("H100-80GB", 8, "nvlink"),
            gpu_count=8,
            check=_invalid_tp,
        ),
        id="a GPU count that does not divide the attention heads is refused",
    ),
    pytest.param(
        Case(
            model("Llama-3.1-8B"),
            gpus("H100-80GB", 8, "nvlink"),
            workload(prompt=(10, 1000), output=(10, 500), peak=8),
            slo=SLO(tpot_p99_milliseconds=5),
            check=_tpot_buys_gpus,
        ),
        id="a tight TPOT objective buys tensor parallelism over NVLink",
    ),
    pytest.param(
        Case(model("Mixtral-8x7B"), gpus("H100-80GB", 8, "nvlink"), check=_moe),
        id="a mixture of experts holds every expert but reads only the active ones per token",
    ),
    pytest.param(
        Case(model("Llama-3.1-8B"), gpus("RTX-4090", 1), check=_no_workload_context_capped_by_kv),
        id="without declared lengths the model's maximum context is capped by the KV cache",
    ),
    pytest.param(
        Case(model("Llama-2-7B"), gpus("RTX-4090", 4, "phb"), check=_kv_limited_stays_on_pcie),
        id="a KV-limited model that fits one PCIe GPU stays on one and suggests replicas",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_planner(case: Case) -> None:
    case.check(case.run())


# --- status and the reconcile's entry point -----------------------------------------------------


def _spec(**changes: object) -> InferenceServiceSpec:
    base = {
        "model": ModelSpec(
            source=ModelSource(
                hugging_face=HuggingFaceSource(repo="meta-llama/Llama-3.1-8B-Instruct")
            )
        ),
        "workload": workload(prompt=(10, 2000), output=(10, 500), peak=32),
    }
    return InferenceServiceSpec.model_validate({**base, **changes})


def test_a_plan_becomes_an_effective_tuning_with_a_reason_for_every_argument() -> None:
    result = as_plan(plan_service(_spec(), [gpus("L40S", 2, "pcie")]))
    tuning = result.effective_tuning()
    assert tuning.planned_by == "Tuner"
    assert tuning.gpus_per_replica == 1
    assert tuning.tensor_parallel_size == 1
    assert tuning.pod is not None
    assert tuning.pod.shm_size == "1Gi"
    assert tuning.pod.cpus == 4
    assert tuning.predictions is not None
    assert tuning.predictions.kv_cache_tokens == result.kv_cache.tokens
    names = [a.name for a in tuning.arguments]
    assert len(names) == len(set(names))
    assert all(a.reason for a in tuning.arguments)
    assert all("\n" not in a.reason for a in tuning.arguments)
    assert any(n.startswith("pod shm-size=1Gi") for n in tuning.notes)
    # It is a valid status fragment (the wire form round-trips).
    assert type(tuning).model_validate(tuning.to_wire()) == tuning


def test_a_service_with_an_unknown_model_keeps_only_what_its_spec_says() -> None:
    spec = _spec(
        model=ModelSpec(
            source=ModelSource(hugging_face=HuggingFaceSource(repo="acme/secret-model")),
            dtype="bfloat16",
        ),
        gpu=GPUSpec(count=2),
        tuning=TuningSpec(overrides={"max-model-len": "8192"}),
    )
    result = as_spec_only(plan_service(spec, [gpus("H100-80GB", 8, "nvlink")]))
    tuning = result.effective_tuning()
    assert tuning.planned_by == "SpecOnly"
    assert {a.name: (a.value, a.source) for a in tuning.arguments} == {
        "tensor-parallel-size": ("2", "Spec"),
        "dtype": ("bfloat16", "Spec"),
        "max-model-len": ("8192", "Override"),
    }
    assert "architecture is unknown" in result.message


def test_an_explicit_architecture_in_the_spec_is_planned() -> None:
    spec = _spec(
        model=ModelSpec(
            source=ModelSource(hugging_face=HuggingFaceSource(repo="acme/secret-model")),
            architecture=ModelArchitecture(
                num_layers=32,
                hidden_size=4096,
                num_attention_heads=32,
                num_key_value_heads=8,
                vocab_size=128256,
                max_position_embeddings=8192,
                intermediate_size=14336,
            ),
        )
    )
    result = as_plan(plan_service(spec, [gpus("A100-80GB", 1)]))
    assert result.model.origin == "spec.model.architecture"
    assert abs(result.model.architecture.parameter_count - 8.03e9) < 0.01e9


def test_a_service_whose_products_match_no_node_says_so() -> None:
    spec = _spec(gpu=GPUSpec(products=["NVIDIA-H100-80GB-HBM3"]))
    v = as_verdict(plan_service(spec, [gpus("L4", 1), gpus("RTX-4090", 2)]))
    assert v.reason == "NoMatchingGPUs"
    assert "L4" in v.message


def test_among_nodes_the_one_needing_fewest_gpus_per_replica_wins() -> None:
    spec = _spec(
        model=ModelSpec(
            source=ModelSource(hugging_face=HuggingFaceSource(repo="meta-llama/Llama-2-13b-hf"))
        )
    )
    result = as_plan(plan_service(spec, [gpus("RTX-4090", 2, "phb"), gpus("A100-80GB", 2)]))
    assert result.gpu.name == "A100-80GB"
    assert result.gpus_per_replica == 1


def test_when_no_node_fits_the_verdict_comes_from_the_roomiest() -> None:
    spec = _spec(
        model=ModelSpec(
            source=ModelSource(
                hugging_face=HuggingFaceSource(repo="meta-llama/Llama-3.1-70B-Instruct")
            )
        )
    )
    v = as_verdict(plan_service(spec, [gpus("L4", 1), gpus("RTX-4090", 2, "phb")]))
    assert v.reason == "WeightsDoNotFit"
    assert v.gpu is not None
    assert v.gpu.name == "RTX-4090"


def test_a_gptq_repository_name_is_read_as_4_bit_gptq() -> None:
    spec = _spec(
        model=ModelSpec(
            source=ModelSource(hugging_face=HuggingFaceSource(repo="TheBloke/Llama-2-7B-GPTQ"))
        )
    )
    result = as_plan(plan_service(spec, [gpus("RTX-3090", 1)]))
    assert arg(result, "quantization") == "gptq_marlin"
    assert "model name" in result.argument("quantization").reason  # type: ignore[union-attr]


def test_a_service_planned_from_node_labels() -> None:
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090",
        "nvidia.com/gpu.memory": "24564",
        "nvidia.com/gpu.count": "2",
        "inference.vllm-operator.dev/gpu-interconnect": "pcie",
    }
    profile = profile_from_labels(labels, node="ws-1")
    assert profile is not None
    spec = _spec(
        model=ModelSpec(
            source=ModelSource(
                hugging_face=HuggingFaceSource(repo="mistralai/Mistral-7B-Instruct-v0.3")
            )
        )
    )
    result = as_plan(plan_service(spec, [profile]))
    assert result.tensor_parallel_size == 1
    assert result.replicas_per_node == 2


def test_node_settings_from_the_spec_win_and_say_so() -> None:
    spec = _spec(node=NodeSpec(shm_size="8Gi", cpu_pinning=True, cpus=12, memory="64Gi"))
    result = as_plan(plan_service(spec, [gpus("L40S", 1)]))
    pod = result.pod.to_planned_pod()
    assert (pod.shm_size, pod.cpus, pod.memory, pod.cpu_pinning) == ("8Gi", 12, "64Gi", True)
    assert {s.name: s.source for s in result.pod.reasons if s.name != "startup-seconds"} == {
        "shm-size": "Spec",
        "cpus": "Spec",
        "memory": "Spec",
        "cpu-pinning": "Spec",
        # Not a spec setting: the weights are downloaded from the Hub into the cache.
        "cache-size": "Tuner",
    }


def test_tensor_parallel_pods_get_shm_that_grows_with_the_gpus() -> None:
    result = as_plan(plan(model("Llama-3.1-70B"), gpus("H100-80GB", 8, "nvlink"), gpu_count=8))
    assert result.tensor_parallel_size == 8
    assert result.pod.shm_bytes == 8 * GIB
    assert result.pod.cpus >= 8 + 2


def two_shape_plan() -> Plan:
    return as_plan(plan_service(_spec(), [gpus("L40S", 2, "pcie"), gpus("A10", 4)]))


def test_plans_are_deterministic() -> None:
    same_across_processes("tests.tuning.test_plan:two_shape_plan")


def test_the_effective_tuning_renders_into_the_deployment_the_plan_describes() -> None:
    from vllm_operator.models import InferenceService
    from vllm_operator.render.deployment import build_deployment

    isvc = InferenceService.model_validate(
        {
            "metadata": {"name": "chat", "namespace": "ns", "uid": "u-1"},
            "spec": {"model": {"source": {"huggingFace": {"repo": "meta-llama/Llama-2-13b-hf"}}}},
        }
    )
    result = as_plan(plan_service(isvc.spec, [gpus("RTX-4090", 2, "pcie")], name="chat"))
    deployment = build_deployment(isvc, result.effective_tuning(), image="vllm", replicas=1)
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = container["args"]
    planned = result.command_args()
    assert args[args.index("--tensor-parallel-size") :][: len(planned)] == planned
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["sizeLimit"] == "2Gi"


def test_weights_from_the_hub_size_the_cache_volume_and_ask_for_the_disk() -> None:
    """The download lands in the pod's cache emptyDir, on node disk: sized from the
    weights with headroom (sizeLimit) and requested as ephemeral-storage, so the pod is
    placed where the disk is and is not evicted for filling it."""
    from vllm_operator.models import InferenceService
    from vllm_operator.render.deployment import build_deployment
    from vllm_operator.tuning.memory import GIB as GiB
    from vllm_operator.tuning.pod import CACHE_EXTRA_BYTES, CACHE_HEADROOM

    body = {
        "apiVersion": "inference.vllm-operator.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "llama", "namespace": "a", "uid": "u-1"},
        "spec": {"model": {"source": {"huggingFace": {"repo": "meta-llama/Llama-3.1-8B"}}}},
    }
    svc = InferenceService.model_validate(body)
    result = as_plan(plan_service(svc.spec, [gpus("L40S", 1)]))
    expected = -(-int(result.predictions.weights_bytes * CACHE_HEADROOM + CACHE_EXTRA_BYTES) // GiB)
    tuning = result.effective_tuning()
    assert tuning.pod is not None and tuning.pod.cache_size == f"{expected}Gi"
    assert 20 <= expected <= 24, "15 GiB of bf16 weights, 25 % and 2 GiB on top"
    pod = build_deployment(svc, tuning, image="vllm:x", replicas=1)["spec"]["template"]["spec"]
    cache = next(v for v in pod["volumes"] if v["name"] == "cache")
    assert cache["emptyDir"] == {"sizeLimit": f"{expected}Gi"}
    requests = pod["containers"][0]["resources"]["requests"]
    assert requests["ephemeral-storage"] == f"{expected}Gi"
    # Weights in the image: nothing is downloaded, nothing is asked for.
    body["spec"]["model"] = {
        "source": {"image": {"path": "/models/tiny"}},
        "architecture": {"numLayers": 2, "hiddenSize": 256, "numAttentionHeads": 4,
                         "vocabSize": 512, "maxPositionEmbeddings": 2048},
    }  # fmt: skip
    baked = InferenceService.model_validate(body)
    assert as_plan(plan_service(baked.spec, [gpus("L40S", 1)])).pod.cache_bytes is None
