"""The package's one quantity parser (vllm_operator.models.quantity) and the tuner's
lenient reading of the spec through it."""

from __future__ import annotations

from decimal import Decimal

import pytest

from vllm_operator.models.quantity import format_mebibytes, parse_quantity, to_bytes
from vllm_operator.tuning.pod import spec_bytes


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("2", Decimal(2)),
        (3, Decimal(3)),
        ("1.5G", Decimal(1_500_000_000)),
        ("64Gi", Decimal(64 * 2**30)),
        ("128Ki", Decimal(128 * 1024)),
        ("1e3", Decimal(1000)),
        # E and Ei are units (exa, exbi), not the start of an exponent.
        ("1E", Decimal(10**18)),
        ("7Ei", Decimal(7 * 2**60)),
    ],
)
def test_quantities_are_read_exactly(text: str | int, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["lots", "1.2.3Gi", "5Qi", ""])
def test_a_bad_quantity_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match=repr(text).replace("\\", "\\\\")):
        parse_quantity(text)


def test_bytes_round_up_and_mebibytes_format_up() -> None:
    assert to_bytes("1.5Ki") == 1536
    assert to_bytes("0.5") == 1
    assert format_mebibytes(2**20 + 1) == "2Mi"


def test_the_tuner_reads_the_spec_through_the_same_parser() -> None:
    # Once two parsers disagreed: this one truncated where the renderer rounded up, and
    # read "500m" as None where the renderer read half a byte.
    assert spec_bytes("1.5Gi") == to_bytes("1.5Gi")
    assert spec_bytes("500m") == 1
    assert spec_bytes("lots") is None
