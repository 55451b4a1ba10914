"""Two small helpers the planner's modules share: bytes as GiB for the reasons' text, and
integer rounding up to a step (contexts, batch budgets, pod memory, startup seconds)."""

from __future__ import annotations

from vllm_operator.tuning.memory import GIB

__all__ = ["gib", "round_up"]


def gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.1f} GiB"


def round_up(value: int, step: int) -> int:
    return -(-value // step) * step
