"""``vllm-operator warmup``: warm up one vLLM server, print the report, set the exit code.

Run as a Job per pod. The report goes to stdout as JSON and, compacted, to the container's
termination message (``/dev/termination-log`` unless told otherwise), where the operator
reads the verdict. Exit codes: 0 warmed up; 1 the server failed the warmup (the reason is
in the report's ``outcome``); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from vllm_operator.warmup.report import DEFAULT_TERMINATION_LOG, Api, write_termination_message
from vllm_operator.warmup.run import WarmupOptions, run_warmup

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need positive integers: {text}")
    return values


def _apis(text: str) -> tuple[Api, ...]:
    if text == "both":
        return (Api.COMPLETIONS, Api.CHAT)
    try:
        return (Api(text),)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"one of completions, chat, both: {text}") from exc


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the warmup flags to ``parser``; its ``func`` default runs the warmup."""
    d = WarmupOptions.model_fields
    parser.add_argument("--endpoint", required=True, help="vLLM base URL, e.g. http://pod:8000")
    parser.add_argument("--model", help="served model name (default: the first of /v1/models)")
    parser.add_argument(
        "--budget",
        dest="budget_s",
        type=float,
        default=d["budget_s"].default,
        help="seconds for the whole warmup, health wait included (default: %(default)s)",
    )
    parser.add_argument(
        "--max-ttft",
        dest="max_ttft_s",
        type=float,
        default=None,
        help="fail as TooSlow when the warm TTFT is above this many seconds",
    )
    parser.add_argument(
        "--max-failures",
        type=int,
        default=d["max_failures"].default,
        help="failed requests tolerated before ServerErrors (default: %(default)s)",
    )
    parser.add_argument(
        "--settle-window",
        type=int,
        default=d["settle_window"].default,
        help="probe requests per window when judging whether TTFT settled",
    )
    parser.add_argument(
        "--settle-tolerance",
        type=float,
        default=d["settle_tolerance"].default,
        help="relative change of the window median that still counts as settled",
    )
    parser.add_argument("--max-model-len", type=int, help="default: from /v1/models")
    parser.add_argument("--max-num-seqs", type=int, default=d["max_num_seqs"].default)
    parser.add_argument(
        "--max-num-batched-tokens", type=int, help="the chunked-prefill budget to cover"
    )
    parser.add_argument(
        "--cudagraph-capture-sizes",
        type=_int_list,
        help="comma-separated batch sizes (default: vLLM's default list)",
    )
    parser.add_argument("--max-tokens", type=int, default=d["max_tokens"].default)
    parser.add_argument("--max-concurrency", type=int, default=d["max_concurrency"].default)
    parser.add_argument(
        "--api",
        dest="apis",
        type=_apis,
        default=(Api.COMPLETIONS, Api.CHAT),
        help="completions, chat or both (default: both)",
    )
    parser.add_argument(
        "--adapter",
        dest="adapters",
        action="append",
        type=_adapter,
        default=[],
        metavar="NAME=PATH",
        help="a LoRA adapter to load before warming up, and to send one request through "
        "(repeatable)",
    )
    parser.add_argument(
        "--termination-log",
        default=DEFAULT_TERMINATION_LOG,
        help="where to write the compact report ('' for nowhere; default: %(default)s)",
    )
    parser.add_argument(
        "--full", action="store_true", help="include every request in the JSON on stdout"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log each step")
    parser.set_defaults(func=run_from_args)
    return parser


def _adapter(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=PATH")
    return name, path


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``warmup`` on a parent CLI's ``add_subparsers()`` object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "warmup",
        help="Warm up a vLLM server and report cold and warm TTFT.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return configure(parser)


def run_from_args(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    # One line per HTTP request drowns the step lines.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        options = WarmupOptions(
            endpoint=args.endpoint,
            model=args.model,
            budget_s=args.budget_s,
            max_ttft_s=args.max_ttft_s,
            max_failures=args.max_failures,
            settle_window=args.settle_window,
            settle_tolerance=args.settle_tolerance,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            cudagraph_capture_sizes=args.cudagraph_capture_sizes,
            max_tokens=args.max_tokens,
            max_concurrency=args.max_concurrency,
            apis=args.apis,
            adapters=tuple(args.adapters),
        )
    except ValidationError as exc:
        print(f"vllm-operator warmup: invalid arguments: {exc}", file=sys.stderr)
        return EXIT_USAGE
    report = asyncio.run(run_warmup(options))
    print(report.model_dump_json(indent=2) if args.full else json.dumps(report.summary(), indent=2))
    write_termination_message(report, args.termination_log or None)
    if not report.succeeded:
        print(f"Warmup failed ({report.outcome}): {report.message}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``python -m vllm_operator.warmup`` and for tests."""
    parser = configure(
        argparse.ArgumentParser(
            prog="vllm-operator warmup",
            description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    args = parser.parse_args(None if argv is None else list(argv))
    code: int = args.func(args)
    return code
