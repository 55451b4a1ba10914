"""The installed real vLLM against what the operator knows of it: its parser accepts every
golden Deployment's command line, and its arguments are the table's for its release."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from vllm_operator.releases.arguments import arguments_for
from vllm_operator.releases.version import TESTED_VERSION

GOLDEN = Path(__file__).parents[1] / "golden"

# The parser `vllm serve` builds (vLLM 0.32 moved it under launchers/); the model is a
# positional there and --model here, the same value.
_PARSE = """
import json, sys
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
if sys.argv[1] == "options":
    print(json.dumps(sorted(o for a in parser._actions for o in a.option_strings)))
    sys.exit(0)
for argv in json.loads(sys.argv[1]):
    parser.parse_args(["--model", *argv])
print("parsed", len(json.loads(sys.argv[1])))
"""


def _golden_command_lines() -> list[list[str]]:
    lines = []
    for path in sorted(GOLDEN.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Deployment":
                for c in doc["spec"]["template"]["spec"]["containers"]:
                    if c.get("command") == ["vllm", "serve"]:
                        lines.append(list(c["args"]))
    return lines


@pytest.mark.vllm
def test_the_real_vllm_parses_every_golden_command_line(vllm_python: Path) -> None:
    lines = _golden_command_lines()
    assert len(lines) >= 5, "the golden corpus holds the Deployments"
    done = subprocess.run(
        [str(vllm_python), "-c", _PARSE, json.dumps(lines)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"parsed {len(lines)}" in done.stdout


@pytest.mark.vllm
def test_the_table_holds_the_installed_releases_arguments(vllm_python: Path) -> None:
    done = subprocess.run(
        [str(vllm_python), "-c", _PARSE, "options"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    installed = {o.lstrip("-") for o in json.loads(done.stdout) if o.startswith("--")} - {"help"}
    table = arguments_for(TESTED_VERSION).arguments
    assert table is not None and table.release == TESTED_VERSION
    known = set(table.flags) | set(table.negations.values())
    assert installed - known == set(), "flags of the installed vLLM the table lacks"
    assert set(table.flags) - installed == set(), "flags in the table the installed vLLM lacks"
