"""Workload: how long each request's prompt and output are, and the prompt text itself.

Real traffic is not fixed-length: prompts run from ten to thousands of tokens and outputs
from tens to over a thousand, and a benchmark with one length hides the tail
(docs/field-notes.md, 9). Lengths come from the distributions of the API
(:class:`~vllm_operator.models.workload.LengthDistribution`: Fixed, Uniform, Normal,
LogNormal, weighted Buckets; drawn by :func:`vllm_operator.models.lengths.sample`), from a
JSONL dataset of real prompts, or from a trace.

Prompts are built to an exact token count with the model's tokenizer (a local one, or the
server's ``/tokenize``, both behind :class:`Tokenizer`). The builder learns how many tokens
each word of a fixed word list takes (with a leading space, as it appears mid-text) and
concatenates seeded random words until the count is reached. With the pre-tokenizers of
the common tokenizers (byte-level BPE, SentencePiece) a token never spans a space, so the
counts add up; the builder checks that on sample prompts and, where they do not add up,
falls back to correcting each prompt by re-encoding it. Counts exclude special tokens and
any chat template: the server's usage then says what the model really saw, and the
records keep both.

Everything here is pure: randomness comes from a seeded ``random.Random`` passed in, and
the tokenizer is an object passed in (its I/O, if any, is the caller's).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from vllm_operator.models import lengths
from vllm_operator.models.workload import LengthDistribution


def bucket_edges(dist: LengthDistribution | None) -> list[tuple[int, int]]:
    """Prompt-length buckets to break results down by: the workload's own buckets when it
    has them, else powers of two (1-127, 128-255, ... up to 1-2M tokens)."""
    if dist is not None and dist.type == "Buckets" and dist.buckets:
        return sorted((b.min, b.max) for b in dist.buckets)
    edges = [(1, 127)]
    lo = 128
    while lo < 2**21:
        edges.append((lo, 2 * lo - 1))
        lo *= 2
    return edges


# --- datasets and traces -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DatasetEntry:
    """One line of a JSONL dataset: a prompt (or chat messages) and optional lengths."""

    prompt: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    output_tokens: int | None = None
    prompt_tokens: int | None = None


def parse_dataset(lines: Iterable[str]) -> list[DatasetEntry]:
    """Parse JSONL: each line has ``prompt`` (text) or ``messages`` (chat), and optionally
    ``output_tokens`` (alias ``max_tokens``) and ``prompt_tokens``. Blank lines are skipped."""
    entries = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"dataset line {number}: not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"dataset line {number}: not a JSON object")
        prompt = data.get("prompt")
        messages = data.get("messages")
        if (prompt is None) == (messages is None):
            raise ValueError(f"dataset line {number}: needs exactly one of prompt, messages")
        if messages is not None and not (
            isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
        ):
            raise ValueError(f"dataset line {number}: messages must be a list of objects")
        output = data.get("output_tokens", data.get("max_tokens"))
        entries.append(
            DatasetEntry(
                prompt=None if prompt is None else str(prompt),
                messages=None if messages is None else tuple(messages),
                output_tokens=None if output is None else _positive(output, number),
                prompt_tokens=(
                    None
                    if data.get("prompt_tokens") is None
                    else _positive(data["prompt_tokens"], number)
                ),
            )
        )
    if not entries:
        raise ValueError("dataset is empty")
    return entries


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One line of a trace: when to send (seconds from the start) and, optionally, lengths."""

    offset: float
    prompt_tokens: int | None = None
    output_tokens: int | None = None


def parse_trace(lines: Iterable[str]) -> list[TraceEntry]:
    """Parse a JSONL trace: ``timestamp`` (alias ``offset``; seconds, any origin), optional
    ``prompt_tokens``/``input_length`` and ``output_tokens``/``output_length``. The result
    is sorted by time and shifted so that the first request goes out at 0."""
    raw = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        data = json.loads(line)
        ts = data.get("timestamp", data.get("offset"))
        if not isinstance(ts, int | float) or not math.isfinite(ts):
            raise ValueError(f"trace line {number}: needs a numeric timestamp")
        prompt = data.get("prompt_tokens", data.get("input_length"))
        output = data.get("output_tokens", data.get("output_length"))
        raw.append(
            TraceEntry(
                float(ts),
                None if prompt is None else _positive(prompt, number),
                None if output is None else _positive(output, number),
            )
        )
    if not raw:
        raise ValueError("trace is empty")
    raw.sort(key=lambda e: e.offset)
    origin = raw[0].offset
    return [TraceEntry(e.offset - origin, e.prompt_tokens, e.output_tokens) for e in raw]


def _positive(value: Any, line: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"line {line}: token counts must be positive integers, got {value!r}")
    return value


# --- planned requests --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """What one request asks for. ``prompt``/``messages`` are set for dataset entries and
    after prompt building; ``prompt_tokens`` is the planned length (no special tokens)."""

    index: int
    prompt_tokens: int
    output_tokens: int
    prompt: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None


def plan_requests(
    n: int,
    rng: random.Random,
    *,
    prompt_tokens: LengthDistribution | None = None,
    output_tokens: LengthDistribution | None = None,
    dataset: Sequence[DatasetEntry] | None = None,
    trace: Sequence[TraceEntry] | None = None,
    default_output_tokens: int = 128,
) -> list[RequestPlan]:
    """Plan ``n`` requests.

    Lengths come, in order of precedence, from the trace entry of the same index, the
    dataset entry, and the distributions. Dataset entries are used in a seeded random
    order, each once before any is reused.

    Prompt lengths, output lengths and the dataset order each draw from their own stream
    (seeded from ``rng``), so the first ``k`` plans are the same whatever ``n >= k`` is: a
    run can plan more requests later without changing the ones it already sent.
    """
    if dataset is None and prompt_tokens is None:
        raise ValueError("need a prompt length distribution or a dataset")
    prompt_rng, output_rng, order_rng = (random.Random(rng.getrandbits(64)) for _ in range(3))
    prompts = lengths.sample(prompt_tokens, n, prompt_rng) if prompt_tokens is not None else None
    outputs = lengths.sample(output_tokens, n, output_rng) if output_tokens is not None else None
    order: list[int] = []
    plans = []
    for i in range(n):
        t = trace[i] if trace is not None and i < len(trace) else None
        out = (
            t.output_tokens
            if t is not None and t.output_tokens is not None
            else (outputs[i] if outputs is not None else None)
        )
        if dataset is not None:
            if not order:
                order = list(range(len(dataset)))
                order_rng.shuffle(order)
            entry = dataset[order.pop()]
            if out is None:
                out = entry.output_tokens
            planned = entry.prompt_tokens or (
                len((entry.prompt or "").split()) if entry.messages is None else 0
            )
            plans.append(
                RequestPlan(
                    index=i,
                    prompt_tokens=planned,
                    output_tokens=out or default_output_tokens,
                    prompt=entry.prompt,
                    messages=entry.messages,
                )
            )
            continue
        assert prompts is not None
        p = t.prompt_tokens if t is not None and t.prompt_tokens is not None else prompts[i]
        plans.append(RequestPlan(i, p, out or default_output_tokens))
    return plans


# --- prompts of exact token counts -------------------------------------------------------


class Tokenizer(Protocol):
    """Encodes text to token ids without special tokens (BOS, chat template)."""

    def encode(self, text: str) -> list[int]: ...


# Common words; which of them are single tokens depends on the tokenizer. Lowercase words
# of a few letters are single tokens in every large vocabulary.
_WORD_TEXT = """the of and to in is was for on that with as by at from his her it an were are which
    this be or has had not but first one their its new after who they two have more also
    time some other only into most can over such all when there many then these may where
    between years world during state city both would about like under up out made
    used through while three year make high part use long well small end day life same way
    just each how old light water place work back name good very night left house hand sea
    river line point land road power book air news sun room tree door bird blue green red
    white black cold warm fast slow open close early late near far rain wind stone field"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


class PromptBuilder:
    """Builds prompt text of an exact number of tokens; see the module docstring.

    ``calibrate`` must be called once (it encodes every word and a few sample prompts);
    afterwards ``build`` needs the tokenizer only when the counts were found not to add up.
    """

    def __init__(self, tokenizer: Tokenizer, *, words: Sequence[str] = WORDS) -> None:
        self.tokenizer = tokenizer
        self.words = tuple(dict.fromkeys(words))
        self.cost: dict[str, int] = {}
        self.singles: list[str] = []
        self.additive = False

    def calibrate(self, rng: random.Random) -> None:
        for word in self.words:
            self.cost[word] = len(self.tokenizer.encode(" " + word))
        self.singles = [w for w in self.words if self.cost[w] == 1]
        self.additive = bool(self.singles)
        if self.additive:
            # Counts add up only if tokens never span words: check on a few prompts.
            for n in (1, 7, 64, 333):
                text = self._compose(n, rng)
                if len(self.tokenizer.encode(text)) != n:
                    self.additive = False
                    break

    def _compose(self, n: int, rng: random.Random) -> str:
        parts: list[str] = []
        remaining = n
        words = self.words
        while remaining > 0:
            word = words[rng.randrange(len(words))]
            cost = self.cost[word]
            if cost > remaining or cost == 0:
                word = self.singles[rng.randrange(len(self.singles))]
                cost = 1
            parts.append(word)
            remaining -= cost
        return " " + " ".join(parts)

    def build(self, n: int, rng: random.Random) -> tuple[str, int]:
        """Text of ``n`` tokens and its actual count (equal to ``n`` unless the tokenizer
        made that impossible within a few corrections; then the closest count found)."""
        if not self.cost:
            raise RuntimeError("call calibrate() first")
        if self.additive:
            return self._compose(n, rng), n
        return self._corrected(n, rng)

    def _corrected(self, n: int, rng: random.Random) -> tuple[str, int]:
        # Compose as if counts added up, then add or drop words until the count is exact.
        parts = self._compose_words(n, rng)
        best: tuple[int, str] | None = None
        for _ in range(12):
            text = " " + " ".join(parts)
            count = len(self.tokenizer.encode(text))
            if best is None or abs(count - n) < abs(best[0] - n):
                best = (count, text)
            if count == n:
                return text, n
            if count > n:
                if len(parts) <= 1:
                    break
                # Each word is at least one token: drop about as many as we are over.
                del parts[max(1, len(parts) - (count - n)) :]
            else:
                parts += self._compose_words(n - count, rng)
        assert best is not None
        return best[1], best[0]

    def _compose_words(self, n: int, rng: random.Random) -> list[str]:
        return self._compose(n, rng).split() if self.singles else ["a"] * n


class WordTokenizer:
    """A stand-in when no tokenizer is available: one token per whitespace-separated word.

    Prompt lengths are then approximate for a real model; the server's usage records what
    the model actually saw.
    """

    def encode(self, text: str) -> list[int]:
        return list(range(len(text.split())))
