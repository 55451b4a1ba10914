"""The commands' help is plain text: the docstrings that are their descriptions carry
reStructuredText markup (``x``, :func:`x`, ``::``), which a terminal would show as is."""

from __future__ import annotations

import argparse
import re

import pytest

from vllm_operator.cli import build_parser, plain

MARKUP = re.compile(r"``|:[a-z]+:`|::$", re.MULTILINE)


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += _parsers(sub)
    return found


@pytest.mark.parametrize("parser", _parsers(build_parser()), ids=lambda p: p.prog)
def test_every_help_page_is_plain_text(parser: argparse.ArgumentParser) -> None:
    text = parser.format_help()
    assert not MARKUP.search(text), MARKUP.search(text)


def test_markup_becomes_the_names_alone() -> None:
    doc = "``--output-dir``: see :func:`vllm_operator.bench.run.run_benchmark` and :class:`~x.Y`."
    assert plain(doc) == "--output-dir: see vllm_operator.bench.run.run_benchmark and x.Y."
    assert plain("By flags::\n\n    x") == "By flags:\n\n    x"
