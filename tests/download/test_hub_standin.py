"""devenv/hub_standin.py speaks what huggingface_hub reads: its own client gets its own typed
errors, and snapshot_download (what vLLM does with HF_ENDPOINT) gets the model's files."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from devenv import hub_standin
from tests.download.conftest import GATED, REPO, TOKEN, control, requests_for, served

WEIGHTS = "model.safetensors"


def test_a_folder_is_one_commit_that_changes_with_its_content(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    first = hub_standin.Repo.load(REPO, tiny_model_dir).commit
    assert hub_standin.Repo.load("other/name", copy).commit == first
    (copy / "config.json").write_text("{}")
    assert hub_standin.Repo.load(REPO, copy).commit != first
    assert len(first) == 40


def test_model_info_lists_sizes_and_lfs_hashes(
    hub: hub_standin.Running, tiny_model_dir: Path
) -> None:
    api = HfApi(endpoint=hub.url, token=False)
    info = api.model_info(REPO, files_metadata=True)
    assert info.sha == hub.repo(REPO).commit
    siblings = {s.rfilename: s for s in info.siblings or []}
    assert set(siblings) == {p.name for p in tiny_model_dir.iterdir() if p.is_file()}
    weights = siblings[WEIGHTS]
    data = (tiny_model_dir / WEIGHTS).read_bytes()
    assert weights.size == len(data) and weights.lfs is not None
    assert weights.lfs.sha256 == hashlib.sha256(data).hexdigest()
    config = siblings["config.json"]
    raw = (tiny_model_dir / "config.json").read_bytes()
    assert config.lfs is None
    assert config.blob_id == hashlib.sha1(b"blob %d\0" % len(raw) + raw).hexdigest()
    # Without blobs, names only (as the Hub); at the commit itself, the same.
    plain = api.model_info(REPO, revision=info.sha)
    assert plain.sha == info.sha and all(s.size is None for s in plain.siblings or [])


def test_resolve_sends_the_headers_the_library_keys_on(
    hub: hub_standin.Running, tiny_model_dir: Path
) -> None:
    commit = hub.repo(REPO).commit
    meta = get_hf_file_metadata(hf_hub_url(REPO, WEIGHTS, endpoint=hub.url), token=False)
    data = (tiny_model_dir / WEIGHTS).read_bytes()
    assert meta.commit_hash == commit
    assert meta.etag == hashlib.sha256(data).hexdigest()  # X-Linked-Etag of an LFS file
    assert meta.size == len(data)
    url = f"{hub.url}/{REPO}/resolve/main/{WEIGHTS}"
    part = httpx.get(url, headers={"Range": "bytes=100-"})
    assert part.status_code == 206 and part.content == data[100:]
    assert part.headers["Content-Range"] == f"bytes 100-{len(data) - 1}/{len(data)}"
    assert httpx.get(url, headers={"Range": "bytes=10-19"}).content == data[10:20]
    past = httpx.get(url, headers={"Range": f"bytes={len(data)}-"})
    assert past.status_code == 416 and past.headers["Content-Range"] == f"bytes */{len(data)}"


@pytest.mark.parametrize(
    ("repo", "revision", "file", "token", "error", "status"),
    [
        ("tiny/nothing", "main", "config.json", False, RepositoryNotFoundError, 404),
        (REPO, "v9", "config.json", False, RevisionNotFoundError, 404),
        (REPO, "main", "nothing.bin", False, RemoteEntryNotFoundError, 404),
        (GATED, "main", "config.json", False, GatedRepoError, 401),
        (GATED, "main", "config.json", "hf_wrong", GatedRepoError, 403),
    ],
    ids=["a missing repo", "a missing revision", "a missing file",
         "a gated repo without a token", "a gated repo with a wrong token"],
)  # fmt: skip
def test_errors_come_as_the_libraries_typed_errors(
    hub: hub_standin.Running,
    repo: str,
    revision: str,
    file: str,
    token: str | bool,
    error: type[Exception],
    status: int,
) -> None:
    url = hf_hub_url(repo, file, revision=revision, endpoint=hub.url)
    with pytest.raises(error) as caught:
        get_hf_file_metadata(url, token=token)
    assert caught.value.response.status_code == status  # type: ignore[attr-defined]


def test_a_gated_repo_serves_its_files_with_the_token(hub: hub_standin.Running) -> None:
    url = hf_hub_url(GATED, "config.json", endpoint=hub.url)
    assert get_hf_file_metadata(url, token=TOKEN).commit_hash == hub.repo(GATED).commit
    # Its model info is public, as on the Hub.
    assert HfApi(endpoint=hub.url, token=False).model_info(GATED).gated == "manual"


def test_snapshot_download_gets_the_model_and_the_counts_show_it(
    hub: hub_standin.Running, tiny_model_dir: Path, tmp_path: Path
) -> None:
    folder = Path(
        snapshot_download(REPO, endpoint=hub.url, token=False, cache_dir=str(tmp_path / "hub"))
    )
    assert folder.name == hub.repo(REPO).commit
    for source in tiny_model_dir.iterdir():
        if source.is_file():
            assert (folder / source.name).read_bytes() == source.read_bytes(), source.name
    stats = control(hub, "stats")
    size = hub.repo(REPO).files[WEIGHTS].size
    assert served(stats, WEIGHTS) == size
    assert requests_for(stats, method="GET", file=WEIGHTS) == 1
    assert control(hub, "reset") == {"reset": True}
    assert control(hub, "stats")["totalRequests"] == 0


def test_corruption_serves_wrong_bytes_of_the_same_length(
    hub: hub_standin.Running, tiny_model_dir: Path
) -> None:
    url = f"{hub.url}/{REPO}/resolve/main/config.json"
    good = (tiny_model_dir / "config.json").read_bytes()
    control(hub, "corrupt", repo=REPO, file="config.json", times=1)
    bad = httpx.get(url).content
    assert len(bad) == len(good) and bad != good
    assert httpx.get(url).content == good  # times=1: once only


def test_the_command_says_where_it_listens(tiny_model_dir: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(Path(hub_standin.__file__)), "--port", "0",
         "--repo", f"{REPO}={tiny_model_dir}", "--gated", f"{GATED}={tiny_model_dir}",
         "--token", TOKEN],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        assert lines[-1].startswith("listening on 127.0.0.1:"), lines
        port = int(lines[-1].strip().rsplit(":", 1)[1])
        info = httpx.get(f"http://127.0.0.1:{port}/api/models/{GATED}").json()
        assert info["gated"] == "manual"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_stand_in_imports_only_the_standard_library() -> None:
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        f"import runpy; runpy.run_path({str(Path(hub_standin.__file__))!r}, run_name='x')\n"
        "import sysconfig; std = sysconfig.get_paths()['stdlib']\n"
        "bad = sorted(n for n, m in sys.modules.items() if n not in before and "
        "getattr(m, '__file__', None) and not m.__file__.startswith(std))\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == ""
