"""The tuner's KV-cache model against a real vLLM (the CPU build) on tiny local models.

vLLM logs, once it has allocated its KV cache, ``CPU KV cache size: N tokens, Maximum
concurrency for L tokens per request: Cx``. On the CPU the KV space is what
``VLLM_CPU_KVCACHE_SPACE`` (GiB) or ``--kv-cache-memory-bytes`` says, so the tuner's
prediction for the same space, model, dtype, block size and context must match N (issue 4
asks for 2 %; the model mirrors vLLM's block arithmetic, so it is exact). The cases cover
two model shapes, a context that is not a multiple of the block size, and a block size that
does not divide the space (so the block count is rounded down).

Every argument list the tuner emits must also parse with vLLM's own argument parser.

Needs the CPU vLLM (``scripts/vllm-cpu.sh``): skipped without it, failed without it under
``CI``. One server at a time (two cores).

Measured with vllm-cpu 0.32.0 (2026-11-29), vLLM's logged tokens / the tuner's:
tiny-llama 1 GiB, block 128, context 2048: 1,048,576 / 1,048,576; tiny-llama-b 1 GiB,
block 128, context 1000: 256,000 / 256,000; tiny-llama-b 2 GiB, block 96, context 1000:
496,454 / 496,454 (0 % error in each).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from devenv.vllm_server import OneServer
from tests.tuning.helpers import as_plan, gpus, model, workload
from vllm_operator.tuning.architecture import from_config
from vllm_operator.tuning.memory import CPU_BLOCK_SIZE, GIB, dtype_bytes, kv_cache_capacity

pytestmark = pytest.mark.vllm

TOLERANCE = 0.02


@dataclasses.dataclass(frozen=True)
class KvCase:
    model: str
    kv_cache_gib: int
    max_model_len: int
    block_size: int | None = None

    def extra_args(self) -> list[str]:
        args = ["--dtype", "bfloat16"]
        if self.block_size is not None:
            args += ["--block-size", str(self.block_size)]
        return args


CASES = [
    pytest.param(
        KvCase("tiny-llama", kv_cache_gib=1, max_model_len=2048),
        id="tiny-llama (2 layers, 2 KV heads) with 1 GiB at its full 2048 context",
    ),
    pytest.param(
        KvCase("tiny-llama-b", kv_cache_gib=1, max_model_len=1000),
        id="tiny-llama-b (4 layers, 4 KV heads) at a context that is no multiple of the block",
    ),
    pytest.param(
        KvCase("tiny-llama-b", kv_cache_gib=2, max_model_len=1000, block_size=96),
        id="tiny-llama-b with 96-token blocks that do not divide 2 GiB",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_predicted_kv_capacity_matches_what_vllm_logs(
    case: KvCase,
    vllm_servers: OneServer,
    vllm_python: Path,
    tiny_models: dict[str, Path],
    vllm_log_dir: Path,
    record_property: pytest.RecordProperty,
) -> None:
    folder = tiny_models[case.model]
    config = json.loads((folder / "config.json").read_text())
    arch = from_config(config, name=case.model)
    predicted = kv_cache_capacity(
        case.kv_cache_gib * GIB,
        arch,
        kv_dtype_bytes=dtype_bytes("bfloat16"),
        block_size=case.block_size or CPU_BLOCK_SIZE,
        max_model_len=case.max_model_len,
    )

    server = vllm_servers.get(
        folder,
        python=vllm_python,
        log_dir=vllm_log_dir,
        kv_cache_space_gib=case.kv_cache_gib,
        max_model_len=case.max_model_len,
        extra_args=case.extra_args(),
    )
    logged = server.kv_cache_capacity()
    vllm_servers.stop()

    error = abs(predicted.tokens - logged.tokens) / logged.tokens
    summary = (
        f"{case.model}: {case.kv_cache_gib} GiB, block {case.block_size or CPU_BLOCK_SIZE}, "
        f"max-model-len {case.max_model_len}: vLLM {logged.tokens:,} tokens "
        f"({logged.max_concurrency:.2f}x), tuner {predicted.tokens:,} tokens "
        f"({predicted.max_concurrency:.2f}x), error {error:.4%}"
    )
    record_property("kv_comparison", summary)
    print(summary)
    assert logged.max_model_len == case.max_model_len
    assert error <= TOLERANCE, summary
    assert predicted.max_concurrency == pytest.approx(logged.max_concurrency, abs=0.01)


_PARSE = """
import json, sys
try:  # vLLM 0.32 moved the server's parser; older releases keep it under openai/
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
for argv in json.loads(sys.argv[1]):
    parser.parse_args(["--model", "m", *argv])
print("parsed", len(json.loads(sys.argv[1])))
"""


def test_vllm_accepts_every_argument_list_the_tuner_writes(vllm_python: Path) -> None:
    from vllm_operator.models.inference_service import TuningSpec
    from vllm_operator.tuning.plan import plan
    from vllm_operator.tuning.quantization import WeightFormat

    lengths = workload(prompt=(10, 2000), output=(10, 500), peak=32)
    plans = [
        plan(model("Llama-3.1-8B"), gpus("L40S", 1), workload=lengths),
        plan(model("Llama-2-13B"), gpus("RTX-4090", 2, "phb")),
        plan(model("Llama-3.1-70B"), gpus("H100-80GB", 8, "nvlink")),
        plan(
            model("Llama-2-7B", WeightFormat("GPTQ", 4, 128)),
            gpus("RTX-3090", 1),
            tuning=TuningSpec(profile="FastStart", overrides={"max-model-len": "4K"}),
        ),
    ]
    argvs = [as_plan(p).command_args() for p in plans]
    done = subprocess.run(
        [str(vllm_python), "-c", _PARSE, json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"parsed {len(argvs)}" in done.stdout
