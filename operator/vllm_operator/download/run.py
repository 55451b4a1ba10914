"""The steps of a download, in order; each one safe to interrupt.

1. **Resolving**: the revision to a commit and the file list with sizes and hashes (one
   Hub call). A folder whose marker names this repo at this commit, with every file of
   its size, is complete: nothing is fetched. (Given a commit as the revision, a complete
   folder is recognised without asking the Hub at all.)
2. **Verifying** what is already there: the marker goes first (a folder being changed is
   never taken for complete), files of another revision go, each file in place is checked
   once (its record, else its hash) and kept or removed.
3. The free space on the volume against what is still missing (partial files count for
   what they hold): too little fails at once as ``OutOfSpace``, before a byte is fetched.
4. **Downloading** each missing file into its partial file (resumed where a killed pod
   stopped), checked against the Hub's size and sha256 (LFS files) or git blob id, then
   renamed into place. A file that does not match is fetched once more from the start;
   a second mismatch is ``VerificationFailed``.
5. **Verifying**: every file in place with its size; then the marker. **Complete**.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

from vllm_operator.constants import (
    DOWNLOAD_REASON_ALREADY_COMPLETE,
    DOWNLOAD_REASON_DOWNLOADED,
    DOWNLOAD_REASON_OUT_OF_SPACE,
    DOWNLOAD_REASON_TRANSIENT,
    DOWNLOAD_REASON_VERIFICATION_FAILED,
)
from vllm_operator.download import folder as folder_module
from vllm_operator.download.folder import ModelFolder, RemoteFile, Snapshot, file_problem, safe_name
from vllm_operator.download.hub import Hub
from vllm_operator.download.report import DownloadError, Phase, Report

logger = logging.getLogger(__name__)

COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class DownloadOptions:
    repo: str
    revision: str
    dest: Path
    endpoint: str
    token: str | None = None


def run_download(options: DownloadOptions, report: Report) -> str:
    """Fill ``options.dest``; return the success reason, or raise :class:`DownloadError`
    (the report then says Failed with its reason and message)."""
    try:
        reason = _download(options, report)
    except DownloadError as err:
        report.update(phase=Phase.FAILED, reason=err.reason, message=err.message)
        raise
    except OSError as exc:
        failure = _os_error(exc, options)
        report.update(phase=Phase.FAILED, reason=failure.reason, message=failure.message)
        raise failure from exc
    return reason


def _os_error(exc: OSError, options: DownloadOptions) -> DownloadError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DownloadError(
            DOWNLOAD_REASON_OUT_OF_SPACE,
            f"the volume at {options.dest} filled up while writing {options.repo}@"
            f"{options.revision}: give the cache more room (spec.storage.size)",
        )
    return DownloadError(
        DOWNLOAD_REASON_TRANSIENT,
        f"writing {options.repo}@{options.revision} into {options.dest}: {exc}",
    )


def _download(options: DownloadOptions, report: Report) -> str:
    dest = options.dest
    dest.mkdir(parents=True, exist_ok=True)
    folder = ModelFolder(dest)

    if COMMIT.match(options.revision):
        marker = folder.complete_for(options.repo, options.revision)
        if marker is not None:
            return _already_complete(report, marker, options)

    hub = Hub(endpoint=options.endpoint, token=options.token)
    report.update(phase=Phase.RESOLVING, message=f"Resolving {options.repo}@{options.revision}.")
    snapshot = hub.resolve(options.repo, options.revision)
    for f in snapshot.files:
        if not safe_name(f.name):
            raise DownloadError(
                DOWNLOAD_REASON_VERIFICATION_FAILED,
                f"{options.repo}@{snapshot.commit} lists a file outside the folder: {f.name!r}",
            )
    done: set[str] = set()
    report.update(
        commit=snapshot.commit,
        bytes_total=snapshot.bytes_total,
        files_total=len(snapshot.files),
        on_disk=lambda: folder.bytes_on_disk(snapshot.files, done),
    )
    logger.info(
        "Resolved %s@%s to commit %s: %d files, %d bytes.",
        snapshot.repo,
        snapshot.revision,
        snapshot.commit,
        len(snapshot.files),
        snapshot.bytes_total,
    )
    marker = folder.complete_for(snapshot.repo, snapshot.commit)
    if marker is not None and _same_files(marker, snapshot):
        done.update(f.name for f in snapshot.files)
        return _already_complete(report, marker, options)

    report.update(phase=Phase.VERIFYING, message=f"Checking the files already in {dest}.")
    folder.remove_marker()
    removed = folder.remove_strays(snapshot)
    if removed:
        logger.info("Removed %d files the commit does not have: %s.", len(removed), removed)
    verified = folder.verified()
    for f in snapshot.files:
        if folder.in_place(f, verified):
            done.add(f.name)
        elif folder.final(f).exists():
            if file_problem(folder.final(f), f) is None:
                done.add(f.name)
            else:
                folder.final(f).unlink()
    # Records of files gone or changed are dropped here.
    folder.record(f for f in snapshot.files if f.name in done)
    report.update(files_done=len(done))

    todo = [f for f in snapshot.files if f.name not in done]
    missing = sum(f.size - folder.partial_size(f) for f in todo)
    free = folder_module.free_bytes(dest)
    if missing > free:
        raise DownloadError(
            DOWNLOAD_REASON_OUT_OF_SPACE,
            f"{snapshot.repo}@{snapshot.revision} needs {_size(missing)} more and the volume "
            f"at {dest} has {_size(free)} free ({_size(snapshot.bytes_total)} in all): give "
            "the cache more room (spec.storage.size)",
        )

    report.update(
        phase=Phase.DOWNLOADING,
        message=f"Downloading {len(todo)} of {len(snapshot.files)} files "
        f"({_size(missing)}) of {snapshot.repo}@{snapshot.commit[:12]}.",
    )
    for f in todo:
        _fetch_verified(hub, folder, snapshot, f)
        done.add(f.name)
        folder.record(g for g in snapshot.files if g.name in done)
        report.update(files_done=len(done))

    report.update(phase=Phase.VERIFYING, message=f"Checking every file in {dest}.")
    for f in snapshot.files:
        size = folder.final(f).stat().st_size if folder.final(f).exists() else None
        if size != f.size:
            done.discard(f.name)
            raise DownloadError(
                DOWNLOAD_REASON_TRANSIENT,
                f"{f.name} of {snapshot.repo} changed on disk during the download "
                f"({size} bytes, the Hub lists {f.size}); the Job retries",
            )
    folder.write_marker(snapshot)
    report.update(
        config=_config(dest),
        phase=Phase.COMPLETE,
        reason=DOWNLOAD_REASON_DOWNLOADED,
        message=f"{snapshot.repo}@{snapshot.revision} is complete in {dest} at commit "
        f"{snapshot.commit}: {len(snapshot.files)} files, {_size(snapshot.bytes_total)}.",
    )
    return DOWNLOAD_REASON_DOWNLOADED


def _fetch_verified(hub: Hub, folder: ModelFolder, snapshot: Snapshot, file: RemoteFile) -> None:
    """Fetch ``file`` until it matches the Hub's list, at most twice from the start."""
    problem = None
    for attempt in (1, 2):
        began = time.monotonic()
        resumed = hub.fetch(snapshot, file, folder.partial(file))
        problem = file_problem(folder.partial(file), file)
        if problem is None:
            folder.place(file)
            logger.info(
                "Downloaded %s (%s)%s in %.1f s.",
                file.name,
                _size(file.size),
                f", resumed at {_size(resumed)}" if resumed else "",
                time.monotonic() - began,
            )
            return
        folder.partial(file).unlink(missing_ok=True)
        logger.warning(
            "Discarded %s of %s after attempt %d: %s.", file.name, snapshot.repo, attempt, problem
        )
    raise DownloadError(
        DOWNLOAD_REASON_VERIFICATION_FAILED,
        f"{file.name} of {snapshot.repo}@{snapshot.commit[:12]} does not match the Hub's list "
        f"after two downloads ({problem}): something between the Hub and the pod changes the "
        "bytes; check HF_ENDPOINT and any proxy",
    )


def _same_files(marker: dict[str, object], snapshot: Snapshot) -> bool:
    listed = marker.get("files")
    if not isinstance(listed, list):
        return False
    return sorted((e.get("name"), e.get("size")) for e in listed) == sorted(
        (f.name, f.size) for f in snapshot.files
    )


def _already_complete(report: Report, marker: dict[str, object], options: DownloadOptions) -> str:
    files = marker.get("files")
    count = len(files) if isinstance(files, list) else 0
    total = marker.get("bytes")
    total = total if isinstance(total, int) else 0
    report.update(
        phase=Phase.COMPLETE,
        commit=marker.get("commit"),
        bytes_total=total,
        files_total=count,
        files_done=count,
        on_disk=lambda: total,
        config=_config(options.dest),
        reason=DOWNLOAD_REASON_ALREADY_COMPLETE,
        message=f"{options.repo}@{options.revision} was already complete in {options.dest} "
        f"at commit {marker.get('commit')}: nothing downloaded.",
    )
    return DOWNLOAD_REASON_ALREADY_COMPLETE


def _config(dest: Path) -> dict[str, object] | None:
    """The model's config.json in ``dest``, when it has one that is a JSON object."""
    try:
        config = json.loads((dest / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
