"""``vllm-operator download``: fetch a Hugging Face repo at one revision into a folder.

The ModelCache's download Job runs it with the cache's volume mounted. The folder ends up
holding the repo's files, as ``vllm serve DIR`` reads them, and the marker
``DIR/.vllm-operator-complete.json`` (repo, revision, commit, files with sizes, bytes).
Run again on a complete folder, it checks and exits at once; run again after a pod was
killed, it resumes the file it was fetching.

The token is read from --token-file (a mounted Secret key), else HF_TOKEN; the Hub from
--endpoint, else HF_ENDPOINT, else https://huggingface.co. While it runs, GET /progress on
--progress-port answers the progress as JSON (phase, commit, bytesDownloaded, bytesTotal,
filesDone, filesTotal, reason, message); the same JSON, compact, is written to
--termination-log at the end.

SIGTERM (the pod deleted or evicted) stops it at once: the partial file stays for the
next run to resume, and the result says Interrupted. (The command is its container's
PID 1, for which the kernel drops a SIGTERM nothing handles: without the handler the
download would go on through the whole grace period.)

Exit codes (the Job's podFailurePolicy fails at once on 2 and 10-14): 0 complete; 1 a
transient failure or SIGTERM, retried (the network, the Hub's 5xx); 2 bad arguments;
10 RepoNotFound; 11 RevisionNotFound; 12 Unauthorized; 13 OutOfSpace; 14 VerificationFailed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from vllm_operator.constants import (
    DOWNLOAD_EXIT_CODES,
    DOWNLOAD_REASON_INTERRUPTED,
    DOWNLOAD_REASON_INVALID_ARGUMENTS,
    DOWNLOAD_REASON_TRANSIENT,
)
from vllm_operator.download.report import (
    DEFAULT_TERMINATION_LOG,
    DownloadError,
    Phase,
    Report,
    write_termination_message,
)

logger = logging.getLogger("vllm_operator.download")

DEFAULT_ENDPOINT = "https://huggingface.co"


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the download flags to ``parser``; its ``func`` default runs the download."""
    parser.add_argument("--repo", required=True, metavar="ORG/NAME", help="the model repo")
    parser.add_argument("--revision", required=True, metavar="REV", help="a branch, tag or commit")
    parser.add_argument(
        "--dest", required=True, type=Path, metavar="DIR", help="the model folder to fill"
    )
    parser.add_argument(
        "--token-file", type=Path, metavar="PATH", help="file holding the token (default: HF_TOKEN)"
    )
    parser.add_argument(
        "--endpoint",
        metavar="URL",
        help=f"the Hub (default: HF_ENDPOINT, else {DEFAULT_ENDPOINT})",
    )
    parser.add_argument(
        "--progress-port",
        type=int,
        default=0,
        metavar="PORT",
        help="serve GET /progress on this port while running (0: off; default: 0)",
    )
    parser.add_argument(
        "--termination-log",
        default=DEFAULT_TERMINATION_LOG,
        metavar="PATH",
        help="where to write the compact result ('' for nowhere; default: %(default)s)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log the library's steps")
    parser.set_defaults(func=run_from_args)
    return parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``download`` on a parent CLI's ``add_subparsers()`` object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "download",
        help="Download a Hugging Face model repo into a folder, resumably (the ModelCache Job).",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return configure(parser)


def _hub_environment(endpoint: str) -> None:
    """What ``huggingface_hub`` reads when it is imported: set before importing it."""
    # Plain HTTP for every file (a mirror or the stand-in speaks no Xet; the fetch is ours).
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    # The library's own side requests (its agent registry) go to the same Hub.
    os.environ["HF_ENDPOINT"] = endpoint


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file is not None:
        token: str = args.token_file.read_text().strip()
        if not token:
            raise DownloadError(
                DOWNLOAD_REASON_INVALID_ARGUMENTS, f"the token file {args.token_file} is empty"
            )
        return token
    return os.environ.get("HF_TOKEN") or None


class Stopped(BaseException):
    """Raised in the main thread by SIGTERM. A BaseException, so that no ``except
    Exception`` on the way (the Hub client's error mapping) takes it for a Hub error."""


@contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """SIGTERM raises :class:`Stopped` while the download runs (main thread only: a test
    calling :func:`main` from another thread keeps the default)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        raise Stopped

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_from_args(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    endpoint = (args.endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    report = Report(message=f"Starting the download of {args.repo}@{args.revision}.")
    try:
        with _stop_on_sigterm():
            code = _run(args, endpoint, report)
    except Stopped:
        report.update(
            phase=Phase.FAILED,
            reason=DOWNLOAD_REASON_INTERRUPTED,
            message=f"{args.repo}@{args.revision}: stopped by SIGTERM; the next run resumes "
            "the files already fetched",
        )
        code = DOWNLOAD_EXIT_CODES[DOWNLOAD_REASON_INTERRUPTED]
        logger.warning("%s", report.message)
    print(json.dumps(report.document()), flush=True)
    write_termination_message(report, args.termination_log or None)
    return code


def _run(args: argparse.Namespace, endpoint: str, report: Report) -> int:
    server = None
    try:
        try:
            token = _token(args)
        except OSError as exc:
            raise DownloadError(
                DOWNLOAD_REASON_INVALID_ARGUMENTS,
                f"cannot read the token file {args.token_file}: {exc.strerror}",
            ) from exc
        if args.progress_port:
            from vllm_operator.download.progress import ProgressServer

            server = ProgressServer(report, port=args.progress_port).start()
        _hub_environment(endpoint)
        from vllm_operator.download.run import DownloadOptions, run_download

        options = DownloadOptions(
            repo=args.repo,
            revision=args.revision,
            dest=args.dest,
            endpoint=endpoint,
            token=token,
        )
        reason = run_download(options, report)
        code = DOWNLOAD_EXIT_CODES[reason]
        logger.info("%s", report.message)
    except DownloadError as err:
        report.update(phase=Phase.FAILED, reason=err.reason, message=err.message)
        code = err.exit_code
        logger.error("Download failed (%s): %s", err.reason, err.message)
    except Exception as exc:  # a bug, or what nothing classified: retried like the network
        logger.exception("Download failed")
        report.update(
            phase=Phase.FAILED,
            reason=DOWNLOAD_REASON_TRANSIENT,
            message=f"{args.repo}@{args.revision}: {type(exc).__name__}: {exc}",
        )
        code = DOWNLOAD_EXIT_CODES[DOWNLOAD_REASON_TRANSIENT]
    finally:
        if server is not None:
            server.stop()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``python -m vllm_operator.download`` and for tests."""
    parser = configure(
        argparse.ArgumentParser(
            prog="vllm-operator download",
            description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    args = parser.parse_args(None if argv is None else list(argv))
    code: int = args.func(args)
    return code
