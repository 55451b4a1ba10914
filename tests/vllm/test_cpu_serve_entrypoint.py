"""The CPU serving image's ``vllm`` (``devenv/images/vllm-cpu``) against the real vLLM 0.32.

The image stands in for ``vllm/vllm-openai`` in the test cluster, so what matters is that a
pod fails or runs there as it would on a GPU node: vLLM's own parser judges the arguments
the operator renders (a flag this version lacks fails with its message and exit code 2),
only what one CPU cannot honour is changed, and the server drains on SIGTERM for the
rendered ``--shutdown-timeout``.

The pure rewrite (``adapt``) is tested without vLLM; everything else runs the script with the
CPU vLLM's python (``VLLM_CPU_SERVE_CHECK=1``: parse, adapt, print the final command, start
nothing), most runs in one shared process and a few each in its own, and one test starts a
real server through the shell shim.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from devenv.vllm_server import OneServer, VllmServer
from tests.specs import GOLDEN_CASES, isvc, plan_for
from vllm_operator.render.deployment import DRAIN_SECONDS, build_deployment

IMAGE_DIR = Path(__file__).parents[2] / "devenv" / "images" / "vllm-cpu"
SCRIPT = IMAGE_DIR / "vllm_serve.py"
SHIM = IMAGE_DIR / "vllm"
GOLDEN = Path(__file__).parents[1] / "golden"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_serve", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


serve = _load()


# ---- the pure rewrite, no vLLM needed ----------------------------------------------------

GMU = ["--gpu-memory-utilization", "0.3"]  # the stand-in's value, which adapt() keeps
KEPT = ["--served-model-name", "chat", "--max-model-len", "4096", "--enforce-eager"]

ADAPT_CASES = [
    pytest.param(
        ["m", "--tensor-parallel-size", "2", *GMU],
        ["m", "--tensor-parallel-size", "1", *GMU],
        ["--tensor-parallel-size 2 -> 1"],
        id="tensor parallelism above one becomes one",
    ),
    pytest.param(
        ["m", "-tp", "4", "--pipeline_parallel_size=2", *GMU],
        ["m", "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1", *GMU],
        ["--tensor-parallel-size 4 -> 1", "--pipeline-parallel-size 2 -> 1"],
        id="the short, underscore and = spellings are recognised",
    ),
    pytest.param(
        ["m", "--tensor-parallel-size", "1", *GMU],
        ["m", "--tensor-parallel-size", "1", *GMU],
        [],
        id="a size of one is kept as written and not logged",
    ),
    pytest.param(
        ["m", "--distributed-executor-backend", "mp", "--enable-expert-parallel", *GMU],
        ["m", *GMU],
        ["--distributed-executor-backend mp dropped", "--enable-expert-parallel dropped"],
        id="the executor backend and expert parallelism are dropped",
    ),
    pytest.param(
        ["m", "--no-enable-expert-parallel", *GMU],
        ["m", "--no-enable-expert-parallel", *GMU],
        [],
        id="expert parallelism turned off is kept",
    ),
    pytest.param(
        ["m", "--kv-cache-dtype", "fp8_e5m2", *GMU],
        ["m", "--kv-cache-dtype", "auto", *GMU],
        ["--kv-cache-dtype fp8_e5m2 -> auto"],
        id="an fp8 KV cache becomes auto",
    ),
    pytest.param(
        ["m", "--kv-cache-dtype", "auto", "--gpu-memory-utilization", "0.95"],
        ["m", "--kv-cache-dtype", "auto", *GMU],
        ["--gpu-memory-utilization 0.95 -> 0.3"],
        id="the GPU memory fraction becomes the CPU's host-memory fraction",
    ),
    pytest.param(
        ["m", "--port", "8000"],
        ["m", "--port", "8000", *GMU],
        ["--gpu-memory-utilization 0.3 added"],
        id="a missing memory fraction is added (vLLM's 0.92 does not fit)",
    ),
    pytest.param(
        ["m", *KEPT, *GMU, "--shutdown-timeout", "60"],
        ["m", *KEPT, *GMU, "--shutdown-timeout", "60"],
        [],
        id="everything else is kept exactly, in its place",
    ),
    pytest.param(
        ["m", "--tensor-parallel-size"],
        ["m", "--tensor-parallel-size", *GMU],
        ["--gpu-memory-utilization 0.3 added"],
        id="a flag without its value is left for vLLM to refuse",
    ),
]


FAST_START_CASES = [
    pytest.param(
        ["m", "--no-enforce-eager", *GMU],
        ["m", "--enforce-eager", *GMU],
        ["--no-enforce-eager -> --enforce-eager (fast start"],
        id="a rendered --no-enforce-eager runs eager, in its place",
    ),
    pytest.param(
        ["m", *GMU],
        ["m", *GMU, "--enforce-eager"],
        ["--enforce-eager added (fast start"],
        id="eager is added when the mode is not rendered",
    ),
    pytest.param(
        ["m", "--enforce-eager", *GMU],
        ["m", "--enforce-eager", *GMU],
        [],
        id="a rendered --enforce-eager is kept and not logged",
    ),
]


@pytest.mark.parametrize(("args", "adapted", "logged"), FAST_START_CASES)
def test_fast_start_runs_eager(args: list[str], adapted: list[str], logged: list[str]) -> None:
    out, changes = serve.adapt(args, memory_utilization="0.3", fast_start=True)
    assert out == adapted
    assert len(changes) == len(logged), changes
    for line, start in zip(changes, logged, strict=True):
        assert line.startswith(start), (line, start)
    # Without fast start the rendered mode is kept as written.
    assert serve.adapt(args, memory_utilization="0.3")[0] == args


@pytest.mark.parametrize(("args", "adapted", "logged"), ADAPT_CASES)
def test_adapt(args: list[str], adapted: list[str], logged: list[str]) -> None:
    out, changes = serve.adapt(args, memory_utilization="0.3")
    assert out == adapted
    assert len(changes) == len(logged), changes
    for line, start in zip(changes, logged, strict=True):
        assert line.startswith(start), (line, start)


def test_the_kv_cache_space_is_set_only_when_unset() -> None:
    assert serve.environment({})[0] == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert serve.environment({"VLLM_CPU_KVCACHE_SPACE": ""})[0] == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert serve.environment({"VLLM_CPU_KVCACHE_SPACE": "4"}) == ({}, [])


def test_a_subcommand_other_than_serve_is_refused_with_a_message() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "bench", "serve"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "'bench' is not provided" in done.stderr


def test_the_shim_execs_the_paths_the_image_build_uses() -> None:
    text = SHIM.read_text()
    assert text.startswith("#!/bin/sh\n")
    assert os.access(SHIM, os.X_OK)
    script = f"${{VLLM_CPU_SERVE_SCRIPT:-{serve.SCRIPT_PATH}}}"
    assert f'exec "${{VLLM_CPU_PYTHON:-python3}}" "{script}" "$@"\n' in text
    assert serve.SHIM_PATH in text


# ---- with the real vLLM 0.32 --------------------------------------------------------------


def _clean_environment() -> dict[str, str]:
    """This environment without the CPU stand-in's own settings (VLLM_CPU_*)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("VLLM_CPU_")}


def _run(
    python: Path, *args: str, env: Mapping[str, str] | None = None, check_only: bool = True
) -> subprocess.CompletedProcess[str]:
    """The script, as the shim runs it, with a clean CPU-stand-in environment."""
    full = _clean_environment()
    if check_only:
        full[serve.CHECK_ENV] = "1"
    full.update(env or {})
    return subprocess.run(
        [str(python), str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=300,
        check=False,
    )


# The check runs of this module, made in one process of the CPU vLLM's python: importing
# vLLM and building its parser takes ~8 s a process on this machine, the check itself well
# under one. Each run starts from the environment and sys.argv it was given; the script
# imports vLLM's modules once, as a pod's one process does.
_MANY = """
import contextlib, importlib.util, io, json, os, sys
spec = importlib.util.spec_from_file_location("vllm_serve", sys.argv[1])
serve = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve)
base, argv = dict(os.environ), list(sys.argv)
results = {}
for key, (args, env) in json.loads(open(sys.argv[2]).read()).items():
    os.environ.clear()
    os.environ.update({**base, **env})
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = serve.main(args)
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
    sys.argv = list(argv)
    results[key] = [code, out.getvalue(), err.getvalue()]
open(sys.argv[3], "w").write(json.dumps(results))
"""


def _run_many(
    python: Path, runs: Mapping[str, tuple[list[str], Mapping[str, str]]], tmp: Path
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Each of ``runs`` (its arguments and extra environment) as ``_run`` makes it, check
    mode on, in one process; a run's stdout and stderr are its own."""
    cases, results = tmp / "runs.json", tmp / "results.json"
    checked = {key: [args, {serve.CHECK_ENV: "1", **env}] for key, (args, env) in runs.items()}
    cases.write_text(json.dumps(checked))
    done = subprocess.run(
        [str(python), "-c", _MANY, str(SCRIPT), str(cases), str(results)],
        capture_output=True, text=True, env=_clean_environment(), timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return {
        key: subprocess.CompletedProcess([key], code, out, err)
        for key, (code, out, err) in json.loads(results.read_text()).items()
    }


def _checked(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# What the LeaderWorkerSet controller sets in each pod of a group, for the $(VAR)s of the
# multi-node launch lines (a worker of index 1; the leader's address as LWS names it).
LWS_ENV = {"LWS_LEADER_ADDRESS": "big-0.big.team", "LWS_WORKER_INDEX": "1"}


def _expand(args: list[str], env: Mapping[str, str]) -> list[str]:
    """``$(VAR)`` references replaced as the kubelet does: a defined variable by its value,
    an undefined one left as written."""
    out = []
    for arg in args:
        for name, value in env.items():
            arg = arg.replace(f"$({name})", value)
        out.append(arg)
    return out


def _golden_args() -> list[Any]:
    params = []
    for path in sorted(GOLDEN.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            kind = (doc or {}).get("kind")
            if kind == "Deployment":
                container = doc["spec"]["template"]["spec"]["containers"][0]
                assert container["command"] == ["vllm", "serve"]
                params.append(pytest.param(container["args"], id=f"golden {path.stem}"))
            elif kind == "LeaderWorkerSet":
                group = doc["spec"]["leaderWorkerTemplate"]
                for role in ("leader", "worker"):
                    container = group[f"{role}Template"]["spec"]["containers"][0]
                    assert container["command"] == ["vllm", "serve"]
                    args = _expand(container["args"], LWS_ENV)
                    assert not any("$(" in a for a in args), args
                    params.append(pytest.param(args, id=f"golden {path.stem} {role}"))
    return params


# InferenceServices beyond the golden files that render other planner arguments.
EXTRA_SPECS: dict[str, dict[str, Any]] = {
    "two PCIe GPUs (custom all-reduce off)": {
        "gpu": {"count": 2, "products": ["NVIDIA-GeForce-RTX-4090"]}
    },
    "a Latency profile on auto GPUs": {"gpu": {"count": "auto"}, "tuning": {"profile": "Latency"}},
    "an AWQ model": {
        "model": {
            "source": {"huggingFace": {"repo": "Qwen/Qwen2.5-7B-Instruct-AWQ"}},
            "quantization": {"method": "AWQ", "bits": 4},
        },
        "gpu": {"count": 1},
    },
    "overrides: fp8 KV cache and two pipeline stages": {
        "gpu": {"count": 2, "products": ["NVIDIA-H100-80GB-HBM3"]},
        "tuning": {
            "overrides": {
                "kv-cache-dtype": "fp8",
                "pipeline-parallel-size": "2",
                "tensor-parallel-size": "1",
            }
        },
    },
    "a 70B model over four GPUs": {
        "model": {"source": {"huggingFace": {"repo": "meta-llama/Llama-3.1-70B-Instruct"}}},
        "gpu": {"count": 4},
    },
}


def _rendered_args(spec: dict[str, Any]) -> list[str]:
    svc = isvc(**spec)
    deployment = build_deployment(svc, plan_for(svc), image="x", replicas=1)
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


RENDERED = _golden_args() + [
    pytest.param(_rendered_args(spec), id=name) for name, spec in EXTRA_SPECS.items()
]
BAD_VALUES = [
    pytest.param(
        ["--tensor-parallel-size", "two"],
        "argument --tensor-parallel-size/-tp: invalid int value: 'two'",
        id="a word for a number",
    ),
    pytest.param(
        ["--kv-cache-dtype", "fp9"],
        "argument --kv-cache-dtype: invalid choice: 'fp9'",
        id="a value outside the choices",
    ),
]
ADAPTED = ["m", "-tp", "2", "--pipeline-parallel-size", "2",
           "--distributed-executor-backend", "mp", "--enable-expert-parallel",
           "--kv-cache-dtype", "fp8", "--gpu-memory-utilization", "0.9",
           "--shutdown-timeout", "60"]  # fmt: skip
ONE_GPU = _rendered_args({"gpu": {"count": 1}})
# Every check-mode run of the tests below, by name: made together (_run_many).
RUNS: dict[str, tuple[list[str], dict[str, str]]] = {
    **{f"rendered {p.id}": (["serve", *p.values[0]], {}) for p in RENDERED},
    **{f"bad {p.id}": (["serve", "m", *p.values[0]], {}) for p in BAD_VALUES},
    "fast start off": (["serve", *ONE_GPU], {"VLLM_CPU_FAST_START": "0"}),
    "unknown flag": (["serve", "m", "--no-such-flag"], {}),
    "adapted": (["serve", *ADAPTED], {"VLLM_CPU_MEMORY_UTILIZATION": "0.25"}),
    "abbreviated": (["serve", "m", "--tensor-parallel", "2"], {}),
}


@pytest.fixture(scope="module")
def runs(
    vllm_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, subprocess.CompletedProcess[str]]:
    return _run_many(vllm_python, RUNS, tmp_path_factory.mktemp("serve-checks"))


def test_the_rendered_cases_cover_every_golden_file() -> None:
    ids = {p.id for p in RENDERED}
    for case in GOLDEN_CASES:
        assert (
            f"golden {case}" in ids
            or {
                f"golden {case} leader",
                f"golden {case} worker",
            }
            <= ids
        ), case


@pytest.mark.vllm
@pytest.mark.parametrize("args", RENDERED)
def test_vllm_accepts_what_the_operator_renders(
    runs: dict[str, subprocess.CompletedProcess[str]],
    args: list[str],
    request: pytest.FixtureRequest,
) -> None:
    result = _checked(runs[f"rendered {request.node.callspec.id}"])
    adapted, _ = serve.adapt(args, fast_start=True)  # the image's default
    assert result == {
        "command": ["vllm", "serve", *adapted],
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
    }


@pytest.mark.vllm
def test_fast_start_off_keeps_the_rendered_mode(
    runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    assert "--no-enforce-eager" in ONE_GPU
    kept = _checked(runs["fast start off"])
    assert kept["command"] == ["vllm", "serve", *serve.adapt(ONE_GPU)[0]]
    assert "--enforce-eager" not in kept["command"]


@pytest.mark.vllm
def test_one_process_judges_a_run_as_a_process_of_its_own_does(
    runs: dict[str, subprocess.CompletedProcess[str]], vllm_python: Path
) -> None:
    """What the shared process answers is what separate processes answer: one that
    passes and one that fails, each also run alone."""
    for name in ("fast start off", "abbreviated"):
        args, env = RUNS[name]
        alone = _run(vllm_python, *args, env=env)
        shared = runs[name]
        assert (shared.returncode, shared.stdout) == (alone.returncode, alone.stdout), name
        ours = [line for line in alone.stderr.splitlines() if line.startswith("vllm-cpu-serve")]
        assert ours == [line for line in shared.stderr.splitlines()
                        if line.startswith("vllm-cpu-serve")], name  # fmt: skip


@pytest.mark.vllm
def test_an_unknown_flag_fails_as_vllm_serve_does(
    runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    done = runs["unknown flag"]
    assert done.returncode == 2
    assert "error: unrecognized arguments: --no-such-flag" in done.stderr
    assert done.stdout == ""


@pytest.mark.vllm
@pytest.mark.parametrize(("args", "message"), BAD_VALUES)
def test_a_bad_value_fails_with_vllms_message(
    runs: dict[str, subprocess.CompletedProcess[str]],
    args: list[str],
    message: str,
    request: pytest.FixtureRequest,
) -> None:
    done = runs[f"bad {request.node.callspec.id}"]
    assert RUNS[f"bad {request.node.callspec.id}"][0][2:] == args
    assert done.returncode == 2
    assert "usage: vllm serve" in done.stderr
    assert message in done.stderr


@pytest.mark.vllm
def test_the_adaptations_are_made_and_logged(
    runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    done = runs["adapted"]
    result = _checked(done)
    assert result["command"] == [
        "vllm", "serve", "m",
        "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1",
        "--kv-cache-dtype", "auto", "--gpu-memory-utilization", "0.25",
        "--shutdown-timeout", "60", "--enforce-eager",
    ]  # fmt: skip
    logged = [line for line in done.stderr.splitlines() if line.startswith("vllm-cpu-serve: ")]
    assert [line.split(" (")[0] for line in logged] == [
        "vllm-cpu-serve: --tensor-parallel-size 2 -> 1",
        "vllm-cpu-serve: --pipeline-parallel-size 2 -> 1",
        "vllm-cpu-serve: --distributed-executor-backend mp dropped",
        "vllm-cpu-serve: --enable-expert-parallel dropped",
        "vllm-cpu-serve: --kv-cache-dtype fp8 -> auto",
        "vllm-cpu-serve: --gpu-memory-utilization 0.9 -> 0.25",
        "vllm-cpu-serve: --enforce-eager added",
        "vllm-cpu-serve: VLLM_CPU_KVCACHE_SPACE=1 set",
    ]


@pytest.mark.vllm
def test_an_abbreviated_flag_that_escapes_the_rewrite_is_refused(
    runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    # argparse takes --tensor-parallel for --tensor-parallel-size; the rewrite does not.
    done = runs["abbreviated"]
    assert done.returncode == 2
    assert "could not adapt tensor_parallel_size=2" in done.stderr


@pytest.mark.vllm
def test_version_and_help(vllm_python: Path) -> None:
    version = _run(vllm_python, "--version", check_only=False)
    assert version.returncode == 0 and version.stdout.strip() == "0.32.0", version
    helped = _run(vllm_python, "serve", "--help", check_only=False)
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert helped.stdout.startswith("usage: vllm serve [model_tag] [options]")


class ShimServer(VllmServer):
    """A server started as the pod starts it: ``vllm serve MODEL ARGS`` through the shim."""

    def __init__(self, model: Path, *, python: Path, args: list[str], log_path: Path) -> None:
        super().__init__(model, python=python, log_path=log_path)
        self.args = args

    def command(self) -> list[str]:
        where = ["--host", self.host, "--port", str(self.port)]
        return [str(SHIM), "serve", str(self.settings.model), *where, *self.args]

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in super().environment().items() if not k.startswith("VLLM_CPU_")}
        return env | {"VLLM_CPU_PYTHON": str(self.python), "VLLM_CPU_SERVE_SCRIPT": str(SCRIPT)}


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_the_server_runs_through_the_shim_and_drains_on_sigterm(
    vllm_servers: OneServer,
    vllm_python: Path,
    tiny_models: dict[str, Path],
    vllm_log_dir: Path,
) -> None:
    vllm_servers.stop()  # one server at a time on two cores
    args = ["--served-model-name", "tiny", "--tensor-parallel-size", "2"]
    args += ["--gpu-memory-utilization", "0.95", "--shutdown-timeout", str(DRAIN_SECONDS)]
    server = ShimServer(
        tiny_models["tiny-llama"],
        python=vllm_python,
        args=args,
        log_path=vllm_log_dir / "vllm-cpu-serve-shim.log",
    )
    with server:
        assert server.process is not None
        # The shim exec'd python: the process the kubelet would signal is the server.
        cmdline = Path(f"/proc/{server.process.pid}/cmdline").read_bytes().split(b"\0")
        assert str(SCRIPT).encode() in cmdline
        with urllib.request.urlopen(f"{server.url}/v1/models", timeout=10) as response:
            assert [m["id"] for m in json.load(response)["data"]] == ["tiny"]
        server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(timeout=DRAIN_SECONDS + 15)
        log = server.log()
    assert code == 0, server.log_tail()
    assert "vllm-cpu-serve: --tensor-parallel-size 2 -> 1" in log
    assert f"mode=drain timeout={DRAIN_SECONDS}s" in log, server.log_tail()
