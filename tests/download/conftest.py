"""Fixtures of the download tests: the tiny model, the Hub stand-in serving it, and a way to
run ``vllm-operator download`` as its own process (the way the Job runs it)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from devenv import hub_standin
from devenv.ci import skip_or_fail
from devenv.vllm_server import TINY_MODEL_SCRIPT, VllmNotInstalledError, tiny_model

REPO = "tiny/llama"
GATED = "tiny/llama-gated"
TOKEN = "hf_test_token_for_the_gated_copy"


def _tiny_model_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_tiny_model", TINY_MODEL_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """scripts/make_tiny_model.py's tiny-llama: from its cache (its own cache function, so
    no torch is needed once it exists), else made with the vLLM venv's python."""
    script = _tiny_model_script()
    try:
        return Path(script.make("tiny-llama", root=script.cache_root()))
    except ImportError:  # not cached, and this venv has no torch to make it
        pass
    try:
        return tiny_model("tiny-llama")
    except VllmNotInstalledError as exc:
        skip_or_fail(f"the tiny model is not cached and cannot be made here: {exc}")


@pytest.fixture
def hub(tiny_model_dir: Path) -> Iterator[hub_standin.Running]:
    running = hub_standin.start(
        [
            hub_standin.Repo.load(REPO, tiny_model_dir),
            hub_standin.Repo.load(GATED, tiny_model_dir, gated=True),
        ],
        token=TOKEN,
    )
    yield running
    running.stop()


def control(hub: hub_standin.Running, what: str, **params: Any) -> Any:
    """POST one of the stand-in's /_ controls (or GET /_stats)."""
    if what == "stats":
        return httpx.get(f"{hub.url}/_stats").json()
    response = httpx.post(f"{hub.url}/_{what}", params=params)
    response.raise_for_status()
    return response.json()


def served(stats: dict[str, Any], file: str, repo: str = REPO) -> int:
    return int(stats["bytesServed"].get(repo, {}).get(file, 0))


def requests_for(stats: dict[str, Any], *, method: str, file: str, repo: str = REPO) -> int:
    return sum(
        r["count"]
        for r in stats["requests"]
        if r["method"] == method and r["repo"] == repo and r["file"] == file
    )


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str
    termination: dict[str, Any] | None

    @property
    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.stdout.strip().splitlines()[-1])
        return out


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The Job's environment: a writable HOME, no token and no Hub unless given."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("HF_") and k not in ("HUGGING_FACE_HUB_TOKEN",)
    }
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return env | {"HOME": str(home), "HF_HOME": str(home / "hf")} | extra


def command(
    hub_url: str, dest: Path, *args: str, repo: str = REPO, revision: str = "main"
) -> list[str]:
    return [
        sys.executable, "-m", "vllm_operator.download",
        "--repo", repo, "--revision", revision, "--dest", str(dest), "--endpoint", hub_url,
        *args,
    ]  # fmt: skip


def run_download(
    hub_url: str,
    dest: Path,
    tmp_path: Path,
    *args: str,
    repo: str = REPO,
    revision: str = "main",
    env: dict[str, str] | None = None,
) -> Result:
    log = tmp_path / "termination-log"
    log.unlink(missing_ok=True)
    done = subprocess.run(
        [
            *command(hub_url, dest, *args, repo=repo, revision=revision),
            "--termination-log",
            str(log),
        ],
        capture_output=True,
        text=True,
        env=env or clean_env(tmp_path),
        timeout=120,
        check=False,
    )
    termination = json.loads(log.read_text()) if log.exists() else None
    return Result(done.returncode, done.stdout, done.stderr, termination)
