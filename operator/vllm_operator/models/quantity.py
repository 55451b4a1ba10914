"""Kubernetes resource quantities ("64Gi", "1.5G", "500m") as exact numbers: the one
parser of the package (the renderer's resources, the tuner's memory and /dev/shm from the
spec, the operator's settings).

Hand-written (about twenty lines) because the pure layers must not import a Kubernetes
client, which is where the usual parser lives.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Final

_SUFFIXES: Final[dict[str, Decimal]] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_PATTERN: Final = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([eE][0-9]+|[numkMGTPE]i?|Ki|)?$")


def parse_quantity(text: str | int) -> Decimal:
    """The value of a quantity; raises ValueError naming the text when it is not one."""
    if isinstance(text, int):
        return Decimal(text)
    match = _PATTERN.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix[:1] in ("e", "E") and suffix[1:].isdigit():  # an exponent; "E" and "Ei" are units
        return number * Decimal(10) ** int(suffix[1:])
    if suffix not in _SUFFIXES:
        raise ValueError(f"{text!r} has an unknown suffix {suffix!r}")
    return number * _SUFFIXES[suffix]


def to_bytes(text: str | int) -> int:
    """A memory quantity in whole bytes (rounded up)."""
    value = parse_quantity(text)
    whole = int(value)
    return whole if whole == value else whole + 1


def format_mebibytes(num_bytes: int) -> str:
    """Bytes as a Mi quantity, rounded up: stable text for manifests."""
    return f"{-(-num_bytes // 2**20)}Mi"
