"""``vllm-operator download`` against the Hub stand-in on 127.0.0.1, run as its own process
the way the Job runs it (in-process where a test replaces the free-space probe)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from devenv import hub_standin
from devenv.ci import skip_or_fail
from tests.download.conftest import (
    GATED,
    REPO,
    TOKEN,
    clean_env,
    command,
    control,
    requests_for,
    run_download,
    served,
)
from vllm_operator.constants import DOWNLOAD_EXIT_CODES, DOWNLOAD_MARKER
from vllm_operator.download import cli, folder

WEIGHTS = "model.safetensors"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _visible(dest: Path) -> list[str]:
    return sorted(
        p.relative_to(dest).as_posix()
        for p in dest.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(dest).parts)
    )


def _assert_same_files(dest: Path, source: Path) -> None:
    wanted = _visible(source)
    assert _visible(dest) == wanted
    for name in wanted:
        assert _sha256(dest / name) == _sha256(source / name), name


def test_a_download_fills_the_folder_and_writes_the_marker(
    hub: hub_standin.Running, tiny_model_dir: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "cache" / "model"
    result = run_download(hub.url, dest, tmp_path)
    assert result.code == 0, result.stderr
    _assert_same_files(dest, tiny_model_dir)
    repo = hub.repo(REPO)
    total = sum(f.size for f in repo.files.values())
    marker = json.loads((dest / DOWNLOAD_MARKER).read_text())
    assert marker == {
        "repo": REPO,
        "revision": "main",
        "commit": repo.commit,
        "files": [{"name": f.name, "size": f.size} for f in repo.files.values()],
        "bytes": total,
    }
    expected = {
        "phase": "Complete",
        "commit": repo.commit,
        "bytesDownloaded": total,
        "bytesTotal": total,
        "filesDone": len(repo.files),
        "filesTotal": len(repo.files),
        "reason": "Downloaded",
    }
    assert result.termination is not None and result.termination.items() >= expected.items()
    assert result.document == result.termination
    # The model's config.json goes with the result: the operator plans from it.
    assert result.termination["config"] == json.loads((tiny_model_dir / "config.json").read_text())
    # Every file once, nothing more.
    stats = control(hub, "stats")
    assert served(stats, WEIGHTS) == repo.files[WEIGHTS].size
    assert requests_for(stats, method="GET", file=WEIGHTS) == 1


def test_a_rerun_on_a_complete_folder_downloads_nothing(
    hub: hub_standin.Running, tmp_path: Path
) -> None:
    dest = tmp_path / "model"
    assert run_download(hub.url, dest, tmp_path).code == 0
    control(hub, "reset")
    again = run_download(hub.url, dest, tmp_path)
    assert again.code == 0, again.stderr
    assert again.termination is not None and again.termination["reason"] == "AlreadyComplete"
    stats = control(hub, "stats")
    assert stats["totalBytes"] == 0
    assert not [r for r in stats["requests"] if r["endpoint"] == "resolve"]
    # Given the commit itself, a complete folder does not even ask the Hub.
    control(hub, "reset")
    pinned = run_download(hub.url, dest, tmp_path, revision=hub.repo(REPO).commit)
    assert pinned.code == 0 and pinned.document["reason"] == "AlreadyComplete"
    assert [r for r in control(hub, "stats")["requests"] if r["repo"]] == []


def _partial(dest: Path) -> Path | None:
    parts = list((dest / ".cache" / "vllm-operator" / "partial").glob("*.part"))
    return parts[0] if parts else None


def _wait_for(predicate: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def test_a_download_killed_mid_file_resumes_it(
    hub: hub_standin.Running, tiny_model_dir: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "model"
    size = hub.repo(REPO).files[WEIGHTS].size
    control(hub, "throttle", bytesPerSecond=size // 4)  # about 4 s for the weights
    proc = subprocess.Popen(
        [*command(hub.url, dest), "--termination-log", ""],
        env=clean_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def some_weights_on_disk() -> bool:
            part = _partial(dest)
            return part is not None and part.stat().st_size > size // 3

        _wait_for(some_weights_on_disk)
    finally:
        proc.send_signal(signal.SIGKILL)  # the kubelet's last word, after the grace period
        proc.wait(timeout=10)
    part = _partial(dest)
    assert part is not None
    kept = part.stat().st_size
    assert size // 3 < kept < size
    assert not (dest / WEIGHTS).exists() and not (dest / DOWNLOAD_MARKER).exists()

    control(hub, "throttle", bytesPerSecond=0)
    result = run_download(hub.url, dest, tmp_path)
    assert result.code == 0, result.stderr
    _assert_same_files(dest, tiny_model_dir)
    assert "resumed at" in result.stderr
    stats = control(hub, "stats")
    # The first pod's bytes plus the rest, not the file twice.
    assert served(stats, WEIGHTS) < 1.5 * size, (served(stats, WEIGHTS), size, kept)
    assert requests_for(stats, method="GET", file=WEIGHTS) == 2
    assert _partial(dest) is None


def test_sigterm_stops_a_download_at_once_and_keeps_the_partial_file(
    hub: hub_standin.Running, tmp_path: Path
) -> None:
    """The kubelet's first word to a deleted pod is SIGTERM, and the command is PID 1 in its
    container, where an unhandled SIGTERM is dropped: it must stop on its own, say why in
    the termination message, and leave the partial file for the next pod."""
    dest = tmp_path / "model"
    size = hub.repo(REPO).files[WEIGHTS].size
    control(hub, "throttle", bytesPerSecond=size // 8)  # about 8 s for the weights
    log = tmp_path / "termination-log"
    proc = subprocess.Popen(
        [*command(hub.url, dest), "--termination-log", str(log)],
        env=clean_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        _wait_for(lambda: (part := _partial(dest)) is not None and part.stat().st_size > 0)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=5)  # not the 8 s the rest of the file takes
    finally:
        proc.kill()
    assert proc.returncode == DOWNLOAD_EXIT_CODES["Interrupted"] == 1
    report = json.loads(log.read_text())
    assert report["reason"] == "Interrupted" and report["phase"] == "Failed"
    assert "stopped by SIGTERM" in report["message"]
    assert json.loads(out.strip().splitlines()[-1])["reason"] == "Interrupted"
    part = _partial(dest)
    assert part is not None and 0 < part.stat().st_size < size
    assert not (dest / DOWNLOAD_MARKER).exists()


@pytest.mark.parametrize(
    ("args", "repo", "revision", "reason", "words"),
    [
        ((), REPO, "v9", "RevisionNotFound",
         "revision 'v9' not found in tiny/llama: check spec.source.huggingFace.revision"),
        ((), "tiny/nothing", "main", "RepoNotFound",
         "repo 'tiny/nothing' not found at"),
        ((), GATED, "main", "Unauthorized",
         "no token was given: set spec.source.huggingFace.tokenSecretRef"),
        (("--token-file", "WRONG"), GATED, "main", "Unauthorized",
         "the token may not read it"),
    ],
    ids=["a wrong revision is RevisionNotFound",
         "a missing repo is RepoNotFound",
         "a gated repo without a token is Unauthorized",
         "a gated repo with a wrong token is Unauthorized"],
)  # fmt: skip
def test_a_permanent_failure_exits_with_its_code_and_says_what_to_do(
    hub: hub_standin.Running,
    tmp_path: Path,
    args: tuple[str, ...],
    repo: str,
    revision: str,
    reason: str,
    words: str,
) -> None:
    if args and args[-1] == "WRONG":
        (tmp_path / "token").write_text("hf_not_the_token\n")
        args = (*args[:-1], str(tmp_path / "token"))
    result = run_download(
        hub.url, tmp_path / "model", tmp_path, *args, repo=repo, revision=revision
    )
    assert result.code == DOWNLOAD_EXIT_CODES[reason], result.stderr
    assert result.termination is not None
    assert result.termination["phase"] == "Failed" and result.termination["reason"] == reason
    assert words in result.termination["message"]
    assert served(control(hub, "stats"), WEIGHTS, repo=repo) == 0


def test_a_gated_repo_downloads_with_the_right_token(
    hub: hub_standin.Running, tiny_model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(f"{TOKEN}\n")  # a Secret key, with its newline
    by_file = run_download(
        hub.url, tmp_path / "a", tmp_path, "--token-file", str(tmp_path / "token"), repo=GATED
    )
    assert by_file.code == 0, by_file.stderr
    _assert_same_files(tmp_path / "a", tiny_model_dir)
    by_env = run_download(
        hub.url, tmp_path / "b", tmp_path, repo=GATED, env=clean_env(tmp_path, HF_TOKEN=TOKEN)
    )
    assert by_env.code == 0, by_env.stderr


def _in_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: list[str]
) -> tuple[int, dict[str, Any]]:
    """Run the command in this process, its environment changes undone afterwards."""
    for name in ("HF_HUB_DISABLE_XET", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_PROGRESS_BARS",
                 "HF_ENDPOINT", "HF_TOKEN"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    log = tmp_path / "termination-log"
    code = cli.main([*argv, "--termination-log", str(log)])
    return code, json.loads(log.read_text())


def test_too_little_free_space_fails_before_fetching_a_byte(
    hub: hub_standin.Running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(folder, "free_bytes", lambda _path: 1_000_000)
    code, result = _in_process(monkeypatch, tmp_path, command(hub.url, tmp_path / "model")[3:])
    assert code == 13 and result["reason"] == "OutOfSpace"
    assert "needs 2.8 MiB more" in result["message"] and "976.6 KiB free" in result["message"]
    assert "spec.storage.size" in result["message"]
    assert control(hub, "stats")["totalBytes"] == 0


@pytest.fixture
def small_volume(tmp_path: Path) -> Any:
    """A 1 MiB tmpfs: smaller than the weights."""
    mount = tmp_path / "volume"
    mount.mkdir()
    if os.geteuid() != 0:
        skip_or_fail("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        skip_or_fail(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_volume_that_fills_up_while_writing_is_out_of_space(
    hub: hub_standin.Running, tmp_path: Path, small_volume: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The early check passes (as on a volume whose free space another writer takes).
    monkeypatch.setattr(folder, "free_bytes", lambda _path: 1 << 40)
    code, result = _in_process(monkeypatch, tmp_path, command(hub.url, small_volume / "m")[3:])
    assert code == 13 and result["reason"] == "OutOfSpace", result
    assert "filled up" in result["message"]


def test_a_file_served_wrong_twice_fails_verification(
    hub: hub_standin.Running, tmp_path: Path
) -> None:
    control(hub, "corrupt", repo=REPO, file=WEIGHTS)
    dest = tmp_path / "model"
    result = run_download(hub.url, dest, tmp_path)
    assert result.code == 14, result.stderr
    assert result.termination is not None and result.termination["reason"] == "VerificationFailed"
    assert "model.safetensors of tiny/llama@" in result.termination["message"]
    assert "sha256" in result.termination["message"]
    assert requests_for(control(hub, "stats"), method="GET", file=WEIGHTS) == 2
    assert not (dest / WEIGHTS).exists() and not (dest / DOWNLOAD_MARKER).exists()


def test_a_file_served_wrong_once_is_downloaded_again(
    hub: hub_standin.Running, tiny_model_dir: Path, tmp_path: Path
) -> None:
    control(hub, "corrupt", repo=REPO, file=WEIGHTS, times=1)
    result = run_download(hub.url, tmp_path / "model", tmp_path)
    assert result.code == 0, result.stderr
    _assert_same_files(tmp_path / "model", tiny_model_dir)
    assert requests_for(control(hub, "stats"), method="GET", file=WEIGHTS) == 2


def test_files_of_another_revision_are_removed(
    hub: hub_standin.Running, tiny_model_dir: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "model-00002-of-00002.safetensors").write_bytes(b"old shard")
    (dest / "config.json").write_text("{}")  # same name, other content
    (dest / DOWNLOAD_MARKER).write_text(json.dumps({"repo": REPO, "commit": "0" * 40}))
    (dest / "lost+found").mkdir()
    result = run_download(hub.url, dest, tmp_path)
    assert result.code == 0, result.stderr
    _assert_same_files(dest, tiny_model_dir)
    assert (dest / "lost+found").is_dir()
    assert json.loads((dest / DOWNLOAD_MARKER).read_text())["commit"] == hub.repo(REPO).commit


def test_an_unreachable_hub_is_transient(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = run_download(f"http://127.0.0.1:{port}", tmp_path / "model", tmp_path)
    assert result.code == 1, result.stderr
    assert result.termination is not None and result.termination["reason"] == "TransientError"
    assert "the Job retries and resumes" in result.termination["message"]


def test_an_unwritable_termination_log_changes_nothing(
    hub: hub_standin.Running, tmp_path: Path
) -> None:
    done = subprocess.run(
        [*command(hub.url, tmp_path / "model"), "--termination-log", "/nonexistent/dir/log"],
        capture_output=True, text=True, env=clean_env(tmp_path), timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Could not write the termination message" in done.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_progress_is_served_while_downloading(hub: hub_standin.Running, tmp_path: Path) -> None:
    repo = hub.repo(REPO)
    total = sum(f.size for f in repo.files.values())
    control(hub, "throttle", bytesPerSecond=total // 3)  # about 3 s
    port = _free_port()
    proc = subprocess.Popen(
        [*command(hub.url, tmp_path / "model"), "--progress-port", str(port),
         "--termination-log", str(tmp_path / "log")],
        env=clean_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen: list[dict[str, Any]] = []
    try:
        while proc.poll() is None:
            with contextlib.suppress(httpx.TransportError):  # not listening yet, or stopped
                seen.append(httpx.get(f"http://127.0.0.1:{port}/progress", timeout=2).json())
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    downloading = [d for d in seen if d["phase"] == "Downloading"]
    assert len(downloading) >= 5, seen
    for doc in downloading:
        assert doc["commit"] == repo.commit and doc["bytesTotal"] == total
        assert doc["filesTotal"] == len(repo.files) and 0 <= doc["filesDone"] < len(repo.files)
        assert 0 <= doc["bytesDownloaded"] <= total and doc["reason"] is None
    steps = [d["bytesDownloaded"] for d in downloading]
    assert steps == sorted(steps) and steps[-1] > steps[0]
    # Bytes of the weights file counted while it is still partial.
    assert any(0 < d["bytesDownloaded"] - 22_000 < repo.files[WEIGHTS].size for d in downloading)
    final = json.loads((tmp_path / "log").read_text())
    assert final["phase"] == "Complete" and final["bytesDownloaded"] == total


def test_the_report_carries_config_json_within_the_termination_limit() -> None:
    from vllm_operator.download.report import TERMINATION_MESSAGE_LIMIT, Phase, Report

    config = {
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "id2label": {str(i): "x" * 40 for i in range(200)},
    }
    report = Report(phase=Phase.COMPLETE, config=config)
    doc = json.loads(report.termination_message())
    assert len(report.termination_message().encode()) <= TERMINATION_MESSAGE_LIMIT
    assert doc["config"] == {"num_hidden_layers": 2, "hidden_size": 256}  # the label map went
    small = Report(phase=Phase.COMPLETE, config={"hidden_size": 256})
    assert json.loads(small.termination_message())["config"] == {"hidden_size": 256}
