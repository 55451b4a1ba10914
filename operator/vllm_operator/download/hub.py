"""The Hugging Face Hub, through ``huggingface_hub``: resolve a revision, fetch one file.

Resolving is one call, ``HfApi.model_info(files_metadata=True)``: the commit and every
file with its size, git blob id and (for LFS files) sha256. Fetching a file is what
``hf_hub_download`` does (a ``HEAD`` of ``/{repo}/resolve/{commit}/{file}`` for the
location, then a ``GET`` there, the ``Authorization`` header dropped when the location
leaves the Hub's host), but into a partial file that outlives the process:
``huggingface_hub`` 2.x no longer resumes across processes (since huggingface_hub#4228
each download writes a process-unique temporary file and deletes it on failure), so a
killed pod would start every file over. Here the partial file is ours and
``huggingface_hub.file_download.http_get`` continues it with ``Range: bytes=N-`` (it
also retries dropped connections within the process, and truncates when a server ignores
the range). It writes what it reads in chunks of ``DOWNLOAD_CHUNK_SIZE`` (10 MiB), each
held in memory until complete; set to 1 MiB here, a killed pod loses at most that much, and
the progress measured on disk moves in steps of it.

Xet is kept out of the way: the files come over plain HTTP (``HF_HUB_DISABLE_XET`` is set
before ``huggingface_hub`` is imported, by the CLI), which every Hub mirror and stand-in
speaks.

Errors are classified here, once: ``huggingface_hub``'s typed errors (from the Hub's
``X-Error-Code``) and HTTP statuses become a :class:`DownloadError` with its reason.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from pathlib import Path
from urllib.parse import urlsplit

from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # lazy re-export

from vllm_operator import __version__
from vllm_operator.constants import (
    DOWNLOAD_REASON_OUT_OF_SPACE,
    DOWNLOAD_REASON_REPO_NOT_FOUND,
    DOWNLOAD_REASON_REVISION_NOT_FOUND,
    DOWNLOAD_REASON_TRANSIENT,
    DOWNLOAD_REASON_UNAUTHORIZED,
)
from vllm_operator.download.folder import RemoteFile, Snapshot
from vllm_operator.download.report import DownloadError

logger = logging.getLogger(__name__)

LIBRARY = "vllm-operator"
# Seconds: the metadata calls; the body of a file has the library's own read timeout.
API_TIMEOUT = 30.0
# What the ModelCache's spec calls these, for the messages.
SPEC_REPO = "spec.source.huggingFace.repo"
SPEC_REVISION = "spec.source.huggingFace.revision"
SPEC_TOKEN = "spec.source.huggingFace.tokenSecretRef"
# Read by http_get on every call (file_download.py: iter_bytes(chunk_size=...)).
FETCH_CHUNK = 1024 * 1024
constants.DOWNLOAD_CHUNK_SIZE = FETCH_CHUNK


class Hub:
    """One Hub endpoint, with or without a token."""

    def __init__(self, *, endpoint: str, token: str | None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.token = token
        # False: send no token at all (never one found in HF_HOME).
        self._token: str | bool = token or False
        self._api = HfApi(
            endpoint=self.endpoint,
            token=self._token,
            library_name=LIBRARY,
            library_version=__version__,
        )

    def resolve(self, repo: str, revision: str) -> Snapshot:
        """The commit ``revision`` names and the repo's files there."""
        try:
            info = self._api.model_info(
                repo, revision=revision, files_metadata=True, timeout=API_TIMEOUT
            )
        except Exception as exc:
            raise self.classify(exc, repo=repo, revision=revision) from exc
        if not info.sha:
            raise DownloadError(
                DOWNLOAD_REASON_TRANSIENT,
                f"the Hub at {self.endpoint} answered no commit for {repo}@{revision}",
            )
        files = []
        for sibling in info.siblings or []:
            if sibling.size is None:
                raise DownloadError(
                    DOWNLOAD_REASON_TRANSIENT,
                    f"the Hub at {self.endpoint} listed {sibling.rfilename} of {repo} without "
                    "its size",
                )
            files.append(
                RemoteFile(
                    name=sibling.rfilename,
                    size=sibling.size,
                    blob_id=sibling.blob_id,
                    sha256=sibling.lfs.sha256 if sibling.lfs else None,
                )
            )
        return Snapshot(repo=repo, revision=revision, commit=info.sha, files=tuple(files))

    def fetch(self, snapshot: Snapshot, file: RemoteFile, partial: Path) -> int:
        """Bring ``partial`` up to the file's size, resuming what is there; return the
        bytes it held before."""
        url = hf_hub_url(snapshot.repo, file.name, revision=snapshot.commit, endpoint=self.endpoint)
        try:
            meta = get_hf_file_metadata(
                url,
                token=self._token,
                endpoint=self.endpoint,
                library_name=LIBRARY,
                library_version=__version__,
                retry_on_errors=True,
            )
            headers = build_hf_headers(
                token=self._token, library_name=LIBRARY, library_version=__version__
            )
            # A range of a compressed body is not a range of the file.
            headers["Accept-Encoding"] = "identity"
            location = meta.location or url
            if urlsplit(location).netloc != urlsplit(url).netloc:
                headers.pop("authorization", None)  # a CDN's signed URL: no token there
            partial.parent.mkdir(parents=True, exist_ok=True)
            if partial.exists() and partial.stat().st_size > file.size:
                partial.unlink()  # longer than the file: not a prefix of it
            with partial.open("ab") as fh:
                have = fh.tell()
                http_get(
                    location,
                    fh,
                    resume_size=have,
                    headers=headers,
                    expected_size=file.size,
                    displayed_filename=file.name,
                )
                fh.flush()
                with contextlib.suppress(OSError):
                    os.fsync(fh.fileno())
        except DownloadError:
            raise
        except Exception as exc:
            raise self.classify(
                exc, repo=snapshot.repo, revision=snapshot.revision, file=file.name
            ) from exc
        return have

    def classify(
        self, exc: BaseException, *, repo: str, revision: str, file: str | None = None
    ) -> DownloadError:
        """The reason and message for what ``huggingface_hub`` raised."""
        where = f"{repo}@{revision}" + (f" ({file})" if file else "")
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return DownloadError(
                DOWNLOAD_REASON_OUT_OF_SPACE,
                f"the volume filled up while writing {where}: {exc.strerror}; give the "
                "cache more room (spec.storage.size)",
            )
        if isinstance(exc, RevisionNotFoundError):
            return DownloadError(
                DOWNLOAD_REASON_REVISION_NOT_FOUND,
                f"revision {revision!r} not found in {repo}: check {SPEC_REVISION}",
            )
        if isinstance(exc, GatedRepoError):  # before RepositoryNotFoundError, its base
            how = (
                "the token may not read it: check that its account was granted access"
                if self.token
                else f"no token was given: set {SPEC_TOKEN} to a Secret with a token"
            )
            return DownloadError(
                DOWNLOAD_REASON_UNAUTHORIZED, f"{repo} is gated at {self.endpoint}; {how}"
            )
        if isinstance(exc, RepositoryNotFoundError | HFValidationError):
            private = " (or it is private and the token cannot read it)" if self.token else (
                f" (or it is private: set {SPEC_TOKEN})"
            )  # fmt: skip
            return DownloadError(
                DOWNLOAD_REASON_REPO_NOT_FOUND,
                f"repo {repo!r} not found at {self.endpoint}{private}: check {SPEC_REPO}",
            )
        if isinstance(exc, RemoteEntryNotFoundError):
            # The file list came from the Hub a moment ago: a race with a push, retried.
            return DownloadError(
                DOWNLOAD_REASON_TRANSIENT, f"{where}: the Hub no longer has the file"
            )
        if isinstance(exc, HfHubHTTPError):
            status = exc.response.status_code
            if status in (401, 403):
                return DownloadError(
                    DOWNLOAD_REASON_UNAUTHORIZED,
                    f"the Hub refused {where} with {status}"
                    + (f" ({exc.server_message})" if exc.server_message else "")
                    + f": check the token in {SPEC_TOKEN}",
                )
            return DownloadError(
                DOWNLOAD_REASON_TRANSIENT,
                f"the Hub answered {status} for {where}; the Job retries and resumes",
            )
        return DownloadError(
            DOWNLOAD_REASON_TRANSIENT,
            f"{where} from {self.endpoint}: {type(exc).__name__}: {_first_line(exc)}; the Job "
            "retries and resumes",
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else "(no message)"
