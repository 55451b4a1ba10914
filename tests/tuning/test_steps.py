"""The planner's named steps, each on its own: the pod's figures (tuning/pod.py), the
tensor-parallel choice and the TTFT batch budget (tuning/choose.py), and the plan's
context, sequences, arguments and predictions (tuning/plan.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.tuning.helpers import GIB, gpus, model, workload
from vllm_operator.models.inference_service import NodeSpec, Profile, TuningSpec
from vllm_operator.models.workload import SLO, Workload
from vllm_operator.tuning import choose, pod
from vllm_operator.tuning.candidate import Candidate, GpuChoices, candidate, gpu_choices
from vllm_operator.tuning.plan import (
    FinalContext,
    ask_of,
    context_verdict,
    distributed_arguments,
    final_context,
    parallelism_arguments,
    predicted,
    sequences,
    shape_notes,
)
from vllm_operator.tuning.request import Ask, Context, context_of
from vllm_operator.tuning.results import DoesNotFit

LLAMA_8B = "Llama-3.1-8B"


@dataclass(frozen=True)
class Setup:
    """An ask on a GPU set, and what the steps before the one tested made of it."""

    model: str = LLAMA_8B
    gpu: str = "H100-80GB"
    count: int = 1
    interconnect: str | None = None
    workload: Workload | None = None
    slo: SLO | None = None
    overrides: dict[str, str] = field(default_factory=dict)
    profile: Profile = "Balanced"
    node: NodeSpec | None = None
    gpu_count: int | None = None
    downloads_weights: bool = False

    def ask(self) -> Ask:
        return ask_of(
            model(self.model),
            workload=self.workload,
            slo=self.slo,
            tuning=TuningSpec(profile=self.profile, overrides=self.overrides),
            node=self.node,
            gpu_count=self.gpu_count if self.gpu_count is not None else "auto",
            downloads_weights=self.downloads_weights,
        )

    def choices(self) -> tuple[Ask, GpuChoices, Context]:
        ask = self.ask()
        return ask, gpu_choices(ask, gpus(self.gpu, self.count, self.interconnect)), context_of(ask)

    def candidate(self, tp: int = 1, pp: int = 1) -> Candidate:
        ask, g, _ = self.choices()
        c = candidate(ask, g, tp, pp)
        assert c is not None
        return c


# --- the pod (tuning/pod.py) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "gpus_count", "size", "source"),
    [
        pytest.param(NodeSpec(shm_size="8Gi"), 4, 8 * GIB, "Spec", id="the spec's size wins"),
        pytest.param(NodeSpec(), 1, GIB, "Tuner", id="one GPU gets 1 GiB"),
        pytest.param(NodeSpec(), 2, 2 * GIB, "Tuner", id="two GPUs get 2 GiB"),
        pytest.param(NodeSpec(), 8, 8 * GIB, "Tuner", id="eight GPUs get a GiB each"),
    ],
)
def test_shm_size(node: NodeSpec, gpus_count: int, size: int, source: str) -> None:
    got = pod.shm_size(node, gpus_count)
    assert (got.value, got.reason.source, got.reason.name) == (size, source, "shm-size")


@pytest.mark.parametrize(
    ("node", "profile", "gpus_count", "cpus", "source"),
    [
        pytest.param(NodeSpec(cpus=12), "Throughput", 4, 12, "Spec", id="the spec's count wins"),
        pytest.param(NodeSpec(), "Balanced", 1, 4, "Tuner", id="one GPU balanced takes 4"),
        pytest.param(NodeSpec(), "Latency", 2, 5, "Tuner", id="two GPUs for latency take 5"),
        pytest.param(NodeSpec(), "Throughput", 4, 8, "Tuner", id="throughput adds a core"),
    ],
)
def test_cpu_count(
    node: NodeSpec, profile: Profile, gpus_count: int, cpus: int, source: str
) -> None:
    got = pod.cpu_count(node, profile, gpus_count)
    assert (got.value, got.reason.source, got.reason.value) == (cpus, source, str(cpus))


@pytest.mark.parametrize(
    ("setup", "tp", "memory", "source"),
    [
        pytest.param(
            Setup(node=NodeSpec(memory="64Gi")), 1, 64 * GIB, "Spec", id="the spec's wins"
        ),
        pytest.param(Setup(), 1, 7 * GIB, "Tuner", id="one GPU worker takes 7 GiB"),
        pytest.param(Setup(count=2), 2, 10 * GIB, "Tuner", id="two GPU workers take 10 GiB"),
        pytest.param(
            Setup(overrides={"cpu-offload-gb": "4"}),
            1,
            11 * GIB,
            "Tuner",
            id="offloaded weights are added, rounded up to a GiB",
        ),
    ],
)
def test_host_memory(setup: Setup, tp: int, memory: int, source: str) -> None:
    got = pod.host_memory(setup.ask(), setup.candidate(tp))
    assert (got.value, got.reason.source) == (memory, source)


@pytest.mark.parametrize(
    ("pinned", "profile", "value", "hint"),
    [
        pytest.param(True, "Latency", "true", False, id="pinned by the spec"),
        pytest.param(False, "Latency", "false", True, id="unpinned latency gets a hint"),
        pytest.param(False, "Balanced", "false", False, id="unpinned balanced gets none"),
    ],
)
def test_cpu_pinning(pinned: bool, profile: Profile, value: str, hint: bool) -> None:
    got = pod.cpu_pinning(NodeSpec(cpu_pinning=pinned), profile)
    assert got.value == value
    assert ("300 %" in got.reason) is hint


@pytest.mark.parametrize(
    ("setup", "fetched", "load", "seconds", "mentions"),
    [
        pytest.param(Setup(), 16 * 10**9, 10.0, 300, "compilation", id="at least five minutes"),
        pytest.param(
            Setup(downloads_weights=True), 16 * 10**9, 10.0, 420, "download", id="a download adds"
        ),
        pytest.param(
            Setup(profile="FastStart"), 0, 10.0, 300, "least", id="fast start skips compile"
        ),
        pytest.param(Setup(), 0, 400.0, 1080, "load", id="a slow load doubles, in minutes"),
    ],
)
def test_startup_budget(
    setup: Setup, fetched: int, load: float, seconds: int, mentions: str
) -> None:
    got = pod.startup_budget(setup.ask(), fetched, load)
    assert got.value == seconds
    assert mentions in got.reason.reason


@pytest.mark.parametrize(
    ("downloads", "fetched", "size"),
    [
        pytest.param(False, 16 * GIB, None, id="nothing downloaded, no cache"),
        pytest.param(True, 16 * GIB, 22 * GIB, id="16 GiB of weights take 22 GiB"),
        pytest.param(True, GIB, 4 * GIB, id="1 GiB of weights takes 4 GiB, rounded up"),
    ],
)
def test_cache_volume(downloads: bool, fetched: int, size: int | None) -> None:
    got = pod.cache_volume(downloads, fetched)
    assert (got.value if got is not None else None) == size


@pytest.mark.parametrize(
    ("setup", "tp", "nvlink"),
    [
        pytest.param(Setup(count=8), 2, True, id="tensor parallel on NVLink asks for it"),
        pytest.param(Setup(count=8), 1, False, id="one GPU asks for nothing"),
        pytest.param(
            Setup(gpu="L40S", count=4, interconnect="pcie"), 2, False, id="PCIe asks for nothing"
        ),
    ],
)
def test_interconnect(setup: Setup, tp: int, nvlink: bool) -> None:
    got = pod.interconnect(setup.candidate(tp))
    assert (got is not None) is nvlink


# --- the tensor-parallel size (tuning/choose.py) ----------------------------------------------


@pytest.mark.parametrize(
    ("setup", "fixed"),
    [
        pytest.param(Setup(), None, id="nothing fixed"),
        pytest.param(
            Setup(overrides={"tensor-parallel-size": "4"}, gpu_count=2),
            choose.Fixed(4, "Override"),
            id="an override wins over the spec",
        ),
        pytest.param(Setup(gpu_count=4), choose.Fixed(4, "Spec"), id="the spec's GPU count"),
        pytest.param(
            Setup(gpu_count=4, overrides={"pipeline-parallel-size": "2"}),
            choose.Fixed(2, "Spec"),
            id="the GPU count over the pipeline stages",
        ),
    ],
)
def test_fixed_size(setup: Setup, fixed: choose.Fixed | None) -> None:
    assert choose.fixed_size(setup.ask()) == fixed


@pytest.mark.parametrize(
    ("setup", "tp", "outcome"),
    [
        pytest.param(Setup(count=8), 3, "InvalidParallelism", id="3 does not divide the heads"),
        pytest.param(Setup(count=4), 8, "NotEnoughGPUs", id="8 on a node of 4"),
        pytest.param(Setup(count=8), 2, "Spec", id="2 on a node of 8 is the spec's"),
    ],
)
def test_check_fixed(setup: Setup, tp: int, outcome: str) -> None:
    ask, g, ctx = setup.choices()
    got = choose.check_fixed(ask, g, ctx, choose.Fixed(tp, "Spec"))
    assert (got.reason if isinstance(got, DoesNotFit) else got.source) == outcome


@pytest.mark.parametrize(
    ("setup", "valid", "fitting"),
    [
        pytest.param(Setup(count=8), (1, 2, 4, 8), (1, 2, 4, 8), id="an 8B model fits every size"),
        pytest.param(
            Setup(model="Llama-3.1-70B", count=8), (1, 2, 4, 8), (2, 4, 8), id="a 70B needs 2"
        ),
        pytest.param(Setup(model="Llama-3.1-405B", gpu="L4"), (1,), (), id="a 405B fits no L4"),
    ],
)
def test_sizes(setup: Setup, valid: tuple[int, ...], fitting: tuple[int, ...]) -> None:
    ask, g, ctx = setup.choices()
    found = choose.sizes(ask, g, ctx)
    assert tuple(c.tp for c in found.candidates) == valid
    assert tuple(c.tp for c in found.fitting) == fitting


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        pytest.param(Setup(model="Llama-3.1-405B", gpu="L4"), "WeightsDoNotFit", id="too big"),
        pytest.param(
            Setup(gpu="L4", overrides={"pipeline-parallel-size": "2"}),
            "NotEnoughGPUs",
            id="two stages on one GPU",
        ),
    ],
)
def test_nothing_fits(setup: Setup, reason: str) -> None:
    ask, g, ctx = setup.choices()
    assert choose.nothing_fits(ask, g, ctx, choose.sizes(ask, g, ctx)).reason == reason


@pytest.mark.parametrize(
    ("setup", "tp", "says", "notes"),
    [
        pytest.param(Setup(), 1, "fit one H100-80GB", 0, id="one GPU"),
        pytest.param(Setup(count=8), 2, "2 is the smallest count", 0, id="two on NVLink"),
        pytest.param(
            Setup(gpu="L40S", count=4, interconnect="pcie"), 2, "smallest", 1, id="two over PCIe"
        ),
    ],
)
def test_smallest(setup: Setup, tp: int, says: str, notes: int) -> None:
    ask, g, _ = setup.choices()
    got = choose.smallest(ask, g, setup.candidate(tp))
    assert says in got.reason
    assert len(got.notes) == notes


# Long requests at a high concurrency: more than any GPU set here holds.
HEAVY = workload(prompt=(20000, 60000), output=(1000, 4000), peak=256)
# ~1.7M tokens in flight: more than one H100 holds for an 8B model, less than four.
BUSY = workload(prompt=(2000, 8000), output=(500, 1000), peak=200)


@pytest.mark.parametrize(
    ("setup", "tp", "note"),
    [
        pytest.param(Setup(count=8), 1, None, id="enough room keeps the pick"),
        pytest.param(Setup(count=8, workload=BUSY), 2, None, id="NVLink adds GPUs for room"),
        pytest.param(
            Setup(gpu="L40S", count=4, interconnect="pcie", workload=HEAVY),
            1,
            "TP over PCIe, a loss",
            id="PCIe keeps the pick and notes the bound",
        ),
        pytest.param(
            Setup(workload=HEAVY), 1, "no larger tensor-parallel", id="one GPU notes the bound"
        ),
    ],
)
def test_for_headroom(setup: Setup, tp: int, note: str | None) -> None:
    ask, g, ctx = setup.choices()
    found = choose.sizes(ask, g, ctx)
    got = choose.for_headroom(ask, g, ctx, found, choose.Pick(found.fitting[0], "smallest"))
    assert got.candidate.tp >= tp
    assert (got.candidate.tp > 1) is (tp > 1)
    assert [n for n in got.notes if note and note in n] == ([got.notes[-1]] if note else [])


@pytest.mark.parametrize(
    ("setup", "upgraded", "noted"),
    [
        pytest.param(Setup(count=8), False, False, id="no objective, no change"),
        pytest.param(Setup(count=8, slo=SLO(tpot_p99_milliseconds=1000)), False, False, id="met"),
        pytest.param(
            Setup(count=8, slo=SLO(tpot_p99_milliseconds=5)), True, False, id="NVLink meets it"
        ),
        pytest.param(Setup(slo=SLO(tpot_p99_milliseconds=1)), False, True, id="none meets it"),
    ],
)
def test_for_tpot(setup: Setup, upgraded: bool, noted: bool) -> None:
    ask, g, ctx = setup.choices()
    found = choose.sizes(ask, g, ctx)
    pick = choose.Pick(found.fitting[0], "smallest")
    got = choose.for_tpot(ask, g, ctx, found, pick)
    assert (got.candidate.tp > pick.candidate.tp) is upgraded
    assert bool(got.notes) is noted


# tests/tuning/test_slo_ttft.py's load: a 3B model on one L40S, ~1,000 requests in flight.
TTFT_LOAD = workload(prompt=(200, 8000), output=(50, 500), peak=1000)


def _ttft(target: int, tpot: int | None = None, load: Workload = TTFT_LOAD) -> Setup:
    return Setup(
        model="Llama-3.2-3B-Instruct",
        gpu="L40S",
        workload=load,
        slo=SLO(ttft_p99_milliseconds=target, tpot_p99_milliseconds=tpot),
        profile="Latency",
    )


@pytest.mark.parametrize(
    ("setup", "load"),
    [
        pytest.param(_ttft(2000, load=workload(peak=10)), None, id="no prompt lengths, no load"),
        pytest.param(
            _ttft(2000),
            choose.PrefillLoad(7922, 4100.0, 275.0, 68, 4375, 69),
            id="a full batch beside the p99 prompt",
        ),
        pytest.param(
            _ttft(2000, load=workload(prompt=(200, 8000), output=(50, 500), peak=8)),
            choose.PrefillLoad(7922, 4100.0, 275.0, 7, 4375, 8),
            id="the declared concurrency beside it",
        ),
    ],
)
def test_prefill_load(setup: Setup, load: choose.PrefillLoad | None) -> None:
    ask, g, ctx = setup.choices()
    assert choose.prefill_load(ask, g, ctx, setup.candidate()) == load


@pytest.mark.parametrize(
    ("setup", "budget", "note"),
    [
        pytest.param(_ttft(3000), None, None, id="a loose objective keeps the budget"),
        pytest.param(_ttft(2000), "8192", None, id="a tight one raises it"),
        pytest.param(_ttft(2000, tpot=5), "8192", "objectives conflict", id="against a TPOT"),
        pytest.param(_ttft(500), None, "cannot be met", id="an impossible one is a note"),
    ],
)
def test_raise_budget(setup: Setup, budget: str | None, note: str | None) -> None:
    ask, g, ctx = setup.choices()
    c = setup.candidate()
    load, r = choose.prefill_load(ask, g, ctx, c), choose.replica_model(ask, g, c)
    assert load is not None and r is not None and setup.slo is not None
    target = setup.slo.ttft_p99_milliseconds
    assert target is not None
    got = choose.raise_budget(ask, g, ctx, c, r, load, target)
    raised = got.gpu_choices.batched.value if got.gpu_choices is not None else None
    assert raised == budget
    assert (got.candidate is not None) is (budget is not None)
    assert [n for n in got.notes if note and note in n] == list(got.notes)
    assert bool(got.notes) is (note is not None)


@pytest.mark.parametrize(
    ("target", "missed"),
    [
        pytest.param(60000, False, id="met at the pinned budget"),
        pytest.param(500, True, id="missed at the pinned budget"),
    ],
)
def test_fixed_budget_notes(target: int, missed: bool) -> None:
    setup = Setup(
        model="Llama-3.2-3B-Instruct",
        gpu="L40S",
        workload=TTFT_LOAD,
        slo=SLO(ttft_p99_milliseconds=target),
        overrides={"max-num-batched-tokens": "1024"},
    )
    ask, g, ctx = setup.choices()
    c = setup.candidate()
    load, r = choose.prefill_load(ask, g, ctx, c), choose.replica_model(ask, g, c)
    assert load is not None and r is not None
    notes = choose.fixed_budget_notes(ask, g, r, load, target)
    assert bool(notes) is missed
    assert all("set in overrides" in n for n in notes)


# --- the plan (tuning/plan.py) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("setup", "tokens", "notes"),
    [
        pytest.param(
            Setup(workload=workload(prompt=(10, 2000))), 3072, 0, id="the workload's, rounded up"
        ),
        pytest.param(
            Setup(model="Llama-3.1-70B", gpu="A100-80GB", count=2, workload=HEAVY),
            None,
            1,
            id="capped to the KV cache, with a note",
        ),
        pytest.param(Setup(overrides={"max-model-len": "4096"}), 4096, 0, id="a pin that fits"),
    ],
)
def test_final_context(setup: Setup, tokens: int | None, notes: int) -> None:
    ask, _, ctx = setup.choices()
    c = setup.candidate(setup.count)
    got = final_context(ask, ctx, c)
    assert got is not None
    if tokens is not None:
        assert got.tokens == tokens
    else:
        assert got.tokens < ctx.wanted and "capped" in got.reason
    assert len(got.notes) == notes


@pytest.mark.parametrize(
    ("setup", "verdict"),
    [
        pytest.param(Setup(overrides={"max-model-len": "4096"}), None, id="a pin that fits"),
        pytest.param(
            Setup(overrides={"max-model-len": "1000000"}), "exceeds", id="beyond the model"
        ),
        pytest.param(
            Setup(gpu="L4", overrides={"max-model-len": "131072"}),
            "does not fit",
            id="beyond the KV cache",
        ),
    ],
)
def test_context_verdict(setup: Setup, verdict: str | None) -> None:
    ask, g, ctx = setup.choices()
    got = context_verdict(ask, g.profile, g, ctx, setup.candidate())
    if verdict is None:
        assert isinstance(got, FinalContext)
    else:
        assert isinstance(got, DoesNotFit) and verdict in got.message


@pytest.mark.parametrize(
    ("setup", "seqs", "source", "notes"),
    [
        pytest.param(
            Setup(workload=workload(prompt=(10, 2000), peak=10)), "15", "Tuner", 0, id="1.5x peak"
        ),
        pytest.param(
            Setup(gpu="L4", workload=HEAVY), None, "Tuner", 0, id="bounded by the KV cache"
        ),
        pytest.param(
            Setup(gpu="L4", workload=HEAVY, overrides={"max-num-seqs": "512"}),
            "512",
            "Override",
            1,
            id="a pin beyond the KV cache is kept, with a note",
        ),
    ],
)
def test_sequences(setup: Setup, seqs: str | None, source: str, notes: int) -> None:
    ask, g, ctx = setup.choices()
    c = setup.candidate()
    final = final_context(ask, ctx, c)
    assert final is not None
    got = sequences(ask, g, ctx, c, c.kv(ask.model.architecture, final.tokens), final.tokens)
    if seqs is not None:
        assert got.setting.value == seqs
    else:
        assert int(got.setting.value) < g.seqs_target and "bounded" in got.setting.reason
    assert (got.setting.source, len(got.notes)) == (source, notes)


@pytest.mark.parametrize(
    ("setup", "tp", "nodes", "names"),
    [
        pytest.param(Setup(), 1, 1, [], id="one GPU: nothing to launch"),
        pytest.param(Setup(count=8), 2, 1, ["distributed-executor-backend"], id="one node"),
        pytest.param(
            Setup(gpu="L40S", count=4, interconnect="pcie"),
            2,
            1,
            ["distributed-executor-backend", "disable-custom-all-reduce"],
            id="PCIe: no custom all-reduce",
        ),
    ],
)
def test_distributed_arguments(setup: Setup, tp: int, nodes: int, names: list[str]) -> None:
    choice = choose.Choice(setup.candidate(tp), "Tuner", "why", nodes=nodes)
    assert [s.name for s in distributed_arguments(choice, None)] == names


@pytest.mark.parametrize(
    ("pp", "pipeline_reason", "expected"),
    [
        pytest.param(1, None, [("tensor-parallel-size", "Tuner")], id="one stage"),
        pytest.param(
            2,
            "two nodes",
            [("tensor-parallel-size", "Tuner"), ("pipeline-parallel-size", "Tuner")],
            id="stages the tuner chose",
        ),
        pytest.param(
            2,
            None,
            [("tensor-parallel-size", "Tuner"), ("pipeline-parallel-size", "Override")],
            id="stages an override set",
        ),
    ],
)
def test_parallelism_arguments(
    pp: int, pipeline_reason: str | None, expected: list[tuple[str, str]]
) -> None:
    c = Setup(count=8).candidate(2, pp)
    choice = choose.Choice(c, "Tuner", "why", pipeline_reason=pipeline_reason)
    assert [(s.name, s.source) for s in parallelism_arguments(choice)] == expected


@pytest.mark.parametrize(
    ("setup", "tp", "notes"),
    [
        pytest.param(Setup(), 1, [], id="one GPU of one: nothing to say"),
        pytest.param(
            Setup(count=8),
            2,
            ["holds 4 replicas", "assumed from labels"],
            id="replicas per node, links from labels",
        ),
        pytest.param(Setup(model="gpt-oss-20b"), 1, ["sliding window"], id="sliding windows"),
    ],
)
def test_shape_notes(setup: Setup, tp: int, notes: list[str]) -> None:
    ask, g, _ = setup.choices()
    got = shape_notes(ask, g.profile, setup.candidate(tp))
    assert len(got) == len(notes)
    assert all(want in note for want, note in zip(notes, got, strict=True))


@pytest.mark.parametrize(
    ("setup", "tp", "decode"),
    [
        pytest.param(Setup(), 1, "roofline for one sequence", id="one node's roofline"),
        pytest.param(Setup(count=8), 2, "all-reduce", id="tensor parallel adds all-reduce"),
    ],
)
def test_predicted(setup: Setup, tp: int, decode: str) -> None:
    ask, g, _ = setup.choices()
    c = setup.candidate(tp)
    kv = c.kv(ask.model.architecture, 4096)
    got = predicted(ask, g.profile, g, choose.Choice(c, "Tuner", "why"), kv, 4096, 1024, None)
    names = [s.name for s in got.reasons]
    assert names == [
        "memory-per-gpu",
        "kv-cache-tokens",
        "decode-tokens-per-second",
        "load-seconds",
    ]
    assert decode in got.reasons[2].reason
    assert got.predictions.kv_cache_bytes == kv.bytes * tp
    assert got.predictions.load_seconds == round(got.load_seconds, 1)
