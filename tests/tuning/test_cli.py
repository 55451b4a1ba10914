"""``vllm-operator tune``: inputs from flags and files, the table, YAML, JSON and args outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_operator.tune_cli import main

LLAMA_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_table_explains_every_argument(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "Llama-3.1-70B-Instruct",
        "--gpu",
        "H100-80GB",
        "--count",
        "8",
        "--interconnect",
        "nvlink",
        "--prompt-p50",
        "800",
        "--prompt-p99",
        "3000",
        "--output-max",
        "1024",
        "--peak-concurrency",
        "64",
    )
    assert code == 0
    assert "8x H100-80GB" in out
    assert "tensor-parallel-size          4" in out
    for section in ("vLLM 0.32.0 arguments", "Pod", "Predictions (per replica)", "Command line"):
        assert section in out
    assert "--max-num-seqs 96" in out


def test_yaml_output_is_the_status_form_of_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "Llama-2-7B",
        "--gpu",
        "RTX-4090",
        "--count",
        "2",
        "--interconnect",
        "pcie",
        "-o",
        "yaml",
    )
    assert code == 0
    doc = yaml.safe_load(out)
    assert doc["result"] == "Plan"
    assert doc["gpus"]["perReplica"] == 1
    assert doc["gpus"]["replicasPerNode"] == 2
    args = {a["name"]: a for a in doc["tuning"]["arguments"]}
    assert args["tensor-parallel-size"]["value"] == "1"
    assert all(a["reason"] for a in args.values())
    assert doc["tuning"]["predictions"]["kvCacheTokens"] > 0
    assert doc["command"][:2] == ["--tensor-parallel-size", "1"]


def test_a_model_folder_with_config_json_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    code, out, _ = run(capsys, str(tmp_path), "--gpu", "L40S", "-o", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["model"]["from"] == "config.json"
    assert doc["result"] == "Plan"


def test_quantization_flags_and_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "Llama-2-7B",
        "--gpu",
        "RTX-3090",
        "--count",
        "2",
        "--quantization",
        "gptq",
        "--bits",
        "4",
        "--set",
        "max-num-seqs=64",
        "--set",
        "enable-prefix-caching=false",
        "-o",
        "args",
    )
    assert code == 0
    line = out.strip()
    assert "--quantization gptq_marlin" in line
    assert "--max-num-seqs 64" in line
    assert "--no-enable-prefix-caching" in line
    assert "--tensor-parallel-size 1" in line


def test_nothing_fits_exits_1_with_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "Llama-2-7B", "--gpu", "RTX-3060")
    assert code == 1
    assert "DOES NOT FIT (WeightsDoNotFit)" in out
    assert "[Quantize]" in out
    assert "[MoreGPUs]" in out


def test_the_verdict_in_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "Llama-2-7B", "--gpu", "RTX-3060", "-o", "yaml")
    assert code == 1
    doc = yaml.safe_load(out)
    assert doc["result"] == "DoesNotFit"
    assert doc["reason"] == "WeightsDoNotFit"
    assert {o["kind"] for o in doc["options"]} >= {"Quantize", "MoreGPUs", "LargerGPU"}


def test_an_unknown_model_is_not_planned(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "acme/private-model", "--gpu", "L4", "--set", "max-model-len=4096")
    assert code == 1
    assert "NOT PLANNED (ArchitectureUnknown)" in out
    assert "max-model-len" in out


def test_a_gpunode_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = {
        "apiVersion": "inference.vllm-operator.dev/v1alpha1",
        "kind": "GPUNode",
        "metadata": {"name": "h200-a"},
        "status": {
            "gpus": [
                {
                    "index": i,
                    "uuid": f"GPU-{i}",
                    "product": "NVIDIA H200",
                    "memoryBytes": 150_754_820_096,
                    "computeCapability": "9.0",
                }
                for i in range(2)
            ],
            "links": [{"a": 0, "b": 1, "kind": "NVLink", "nvlinks": 18}],
            "bandwidth": {
                "results": [{"source": "gpu0", "kind": "DeviceCopy", "gigabytesPerSecond": 4266}]
            },
        },
    }
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(node))
    code, out, _ = run(capsys, "Llama-3.1-70B", "--gpu-node", str(path), "-o", "yaml")
    assert code == 0
    doc = yaml.safe_load(out)
    assert doc["gpus"]["perReplica"] == 2
    assert doc["gpus"]["link"] == "NVLink"
    assert "measured" in json.dumps(doc["tuning"]["notes"])


def test_an_inferenceservice_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    isvc = {
        "apiVersion": "inference.vllm-operator.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat"},
        "spec": {
            "model": {"source": {"huggingFace": {"repo": "Qwen/Qwen2.5-7B-Instruct"}}},
            "workload": {
                "promptTokens": {"type": "Uniform", "min": 10, "max": 2000},
                "outputTokens": {"type": "Uniform", "min": 50, "max": 500},
                "peakConcurrency": 32,
            },
            "tuning": {"profile": "Latency", "overrides": {"enable-prefix-caching": "false"}},
        },
    }
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump(isvc))
    code, out, _ = run(capsys, "--service", str(path), "--gpu", "L40S", "-o", "json")
    assert code == 0
    args = {a["name"]: a for a in json.loads(out)["tuning"]["arguments"]}
    assert args["max-num-seqs"]["value"] == "48"
    assert args["max-model-len"]["value"] == "2560"
    assert args["max-num-batched-tokens"]["value"] == "2048"
    assert (args["enable-prefix-caching"]["value"], args["enable-prefix-caching"]["source"]) == (
        "false",
        "Override",
    )


def test_the_inferenceservice_of_a_file_of_several_documents(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The project's own full example holds a Secret and the InferenceService."""
    full = Path(__file__).parents[2] / "examples" / "inferenceservice-full.yaml"
    assert len(list(yaml.safe_load_all(full.read_text()))) > 1
    code, out, err = run(capsys, "--service", str(full), "--gpu", "H100", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["tuning"]["arguments"]
    two = tmp_path / "two.yaml"
    two.write_text(full.read_text() + "\n---\n" + full.read_text())
    code, _, err = run(capsys, "--service", str(two), "--gpu", "H100")
    assert code == 2 and "2 InferenceService documents among 4" in err, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["Llama-2-7B"], "give --gpu", id="no GPUs"),
        pytest.param(["--gpu", "L4"], "give a model", id="no model"),
        pytest.param(["Llama-2-7B", "--gpu", "Acme-X1"], "give its memory", id="an unknown GPU"),
        pytest.param(
            ["Llama-2-7B", "--gpu", "L4", "--prompt-p99", "10"],
            "needs --prompt-p50",
            id="a p99 without a p50",
        ),
        pytest.param(
            ["Llama-2-7B", "--gpu", "L4", "--set", "oops"],
            "KEY=VALUE",
            id="an override without a value",
        ),
        pytest.param(
            ["Llama-2-7B", "--gpu", "L4", "--gpu-node", "/nonexistent.yaml"],
            "cannot read",
            id="a missing GPUNode file",
        ),
        pytest.param(
            ["Llama-2-7B", "--gpu", "L4", "--set", "maxmodellen=8192"],
            "--set maxmodellen: vLLM 0.32.0 has no argument --maxmodellen "
            "(did you mean max-model-len?)",
            id="an override that is no argument of the release",
        ),
        pytest.param(
            ["Llama-2-7B", "--gpu", "L4", "--set", "gpu-memory-utilization=1.5"],
            "--set gpu-memory-utilization: --gpu-memory-utilization must be",
            id="an override out of range",
        ),
        pytest.param(
            ["Llama-2-7B", "--gpu", "L4", "--set", "tensor-parallel-size=-2"],
            "--tensor-parallel-size must be at least 1",
            id="a negative parallel size",
        ),
        pytest.param(
            ["Llama-2-7B", "--gpu", "L4", "--set", "max-num-seqs=0"],
            "--max-num-seqs must be at least 1",
            id="no sequences",
        ),
        pytest.param(
            ["Llama-2-7B", "--gpu", "L4", "--prompt-p50", "-5"],
            "argument --prompt-p50: must be at least 1, not -5",
            id="a negative length",
        ),
        pytest.param(
            ["Llama-2-7B", "--gpu", "L4", "--peak-concurrency", "many"],
            "argument --peak-concurrency: must be a whole number, not 'many'",
            id="a count that is not a number",
        ),
        pytest.param(
            ["/nonexistent/model", "--gpu", "L4"],
            "MODEL /nonexistent/model: no such folder",
            id="a missing model folder",
        ),
        pytest.param(
            ["Llama-2-7B", "--gpu", "L4", "--interconnect", "warp"],
            "--interconnect 'warp' is not one: use nvlink, pcie, or a topology kind",
            id="an unknown interconnect",
        ),
        pytest.param(
            ["Llama-2-7B", "--gpu", "L4", "--vllm-version", "latest"],
            "--vllm-version 'latest' is not a version",
            id="a version that is not one",
        ),
        pytest.param(
            ["Llama-2-7B", "--gpu", "L4", "--vllm-version", "0.9.2"],
            "older than the oldest release the operator supports",
            id="a release older than the table",
        ),
    ],
)
def test_bad_input_exits_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals (a flag's type)
        code = int(exc.code or 0)
    _, err = capsys.readouterr()
    assert code == 2
    assert message in err
    assert "Traceback" not in err and "pydantic" not in err


def test_a_config_json_without_the_shape_names_the_missing_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    code, _, err = run(capsys, str(tmp_path), "--gpu", "L4")
    assert code == 2
    assert "config.json lacks num_hidden_layers, num_attention_heads, vocab_size" in err


_OFFLINE = """
import sys
from vllm_operator.tune_cli import main
code = main(["Llama-3.1-8B", "--gpu", "A10", "-o", "json"])
loaded = sorted(m for m in ("httpx", "kubernetes_asyncio", "kopf", "urllib.request", "http.client")
                if m in sys.modules)
print("LOADED", loaded, file=sys.stderr)
sys.exit(code if not loaded else 99)
"""


def test_the_command_loads_no_network_client() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _OFFLINE], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == "Plan"


def test_the_command_line_is_written_for_the_release_asked_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every flag of the plan for vLLM 0.10 is one 0.10 has (the tuner's catalogue of
    arguments is the newest release's; what 0.10 lacks is left out with a note)."""
    from vllm_operator.releases.arguments import arguments_for
    from vllm_operator.releases.version import Version

    code, out, _ = run(
        capsys, "Llama-3.1-8B", "--gpu", "L40S", "--vllm-version", "0.10.0", "-o", "yaml"
    )
    assert code == 0
    doc = yaml.safe_load(out)
    assert doc["tuning"]["vllmVersion"] == "0.10.0"
    table = arguments_for(Version(0, 10, 0)).arguments
    assert table is not None
    spelled = set(table.flags) | set(table.negations.values())
    flags = [a.removeprefix("--") for a in doc["command"] if a.startswith("--")]
    assert flags and all(f in spelled for f in flags), flags


def test_an_override_is_checked_against_the_release_asked_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--swap-space went in vLLM 0.18: an override of it passes for 0.17, not for 0.18."""
    base = ["Llama-2-7B", "--gpu", "RTX-3090", "--set", "swap-space=0", "-o", "args"]
    code, out, _ = run(capsys, *base, "--vllm-version", "0.17.0")
    assert code == 0 and "--swap-space 0" in out
    code, _, err = run(capsys, *base, "--vllm-version", "0.18.0")
    assert code == 2 and "vLLM 0.18.0 has no argument --swap-space" in err
