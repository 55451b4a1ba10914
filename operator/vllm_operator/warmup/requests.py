"""Which requests a warmup sends, as a pure function of the serving settings.

A vLLM pod that answers ``/health`` still pays, on its first requests, for CUDA-graph
replays of batch sizes it has not run yet, for compiling kernels at new prompt shapes, for
the first chunked prefill and for growing its allocations. The warmup therefore covers:

- **prompt lengths**: geometric buckets from a short prompt up to the longest prompt the
  context allows, including one at and one beyond the chunked-prefill budget
  (``--max-num-batched-tokens``), so a prefill is split into chunks at least once;
- **batch sizes**: concurrent decodes at a geometric subset of the CUDA-graph capture
  sizes, up to ``--max-num-seqs`` and a concurrency cap;
- a **mixed prefill** step whose prompts together exceed the chunked-prefill budget;
- both **APIs** (completions and chat) and both **streaming** and non-streaming responses.

After these steps the runner repeats a fixed short *probe* request until its TTFT settles;
cold TTFT is the probe's first run, warm TTFT the median of the last runs.

Prompts are text, sized in tokens through a tokens-per-word ratio the runner measures with
the server's ``/tokenize``. Each request starts with its own serial word, so prefix caching
cannot turn a later request into a cache hit of an earlier one.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vllm_operator.warmup.report import Api

# Words whose byte-level BPE split is short in most vocabularies.
_WORDS = [
    "the",
    "model",
    "serves",
    "requests",
    "while",
    "the",
    "operator",
    "measures",
    "time",
    "to",
    "first",
    "token",
    "and",
    "the",
    "latency",
    "of",
    "every",
    "batch",
    "on",
    "each",
    "node",
    "of",
    "the",
    "cluster",
    "before",
    "it",
    "takes",
    "traffic",
]


def default_cudagraph_capture_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes vLLM captures CUDA graphs for when none are configured.

    vLLM (V1 engine) captures 1, 2, 4, then every multiple of 8 below 256, then every
    multiple of 16, up to ``min(2 * max_num_seqs, 512)``.
    """
    largest = min(2 * max_num_seqs, 512)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)]
    return [s for s in sizes if s <= largest]


class PlanInputs(BaseModel):
    """The serving settings a warmup covers (the same values the pod's vLLM runs with)."""

    model_config = ConfigDict(frozen=True)

    max_model_len: int = Field(ge=32, description="--max-model-len")
    max_num_seqs: int = Field(default=256, ge=1, description="--max-num-seqs")
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, description="--max-num-batched-tokens (chunked-prefill budget)"
    )
    cudagraph_capture_sizes: tuple[int, ...] | None = Field(
        default=None, description="vLLM's capture sizes; vLLM's default list when unset"
    )
    max_tokens: int = Field(default=8, ge=1, description="output tokens per request")
    max_concurrency: int = Field(default=16, ge=1, description="cap on concurrent requests")
    min_prompt_tokens: int = Field(default=16, ge=1)
    bucket_factor: int = Field(default=4, ge=2, description="ratio between prompt buckets")
    apis: tuple[Api, ...] = (Api.COMPLETIONS, Api.CHAT)

    @model_validator(mode="after")
    def _fits(self) -> PlanInputs:
        if self.min_prompt_tokens + self.max_tokens > self.max_model_len:
            raise ValueError("the shortest prompt plus its output exceeds max_model_len")
        if not self.apis:
            raise ValueError("at least one API is needed")
        return self

    @property
    def longest_prompt(self) -> int:
        # A little room for the chat template's own tokens and for the word-based estimate.
        margin = max(16, self.max_model_len // 16)
        return max(self.min_prompt_tokens, self.max_model_len - self.max_tokens - margin)


class RequestSpec(BaseModel):
    """One request to send: its size, API and whether to stream."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int
    api: Api
    stream: bool


class Step(BaseModel):
    """Requests sent together (concurrently); the next step starts when all have ended."""

    model_config = ConfigDict(frozen=True)

    name: str
    requests: tuple[RequestSpec, ...]

    @property
    def concurrency(self) -> int:
        return len(self.requests)


class WarmupPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    probe: RequestSpec = Field(description="sent first (cold TTFT) and repeated to settle")
    steps: tuple[Step, ...]
    max_tokens: int

    @property
    def request_count(self) -> int:
        return sum(s.concurrency for s in self.steps)


def prompt_buckets(inputs: PlanInputs) -> list[int]:
    """Prompt lengths in tokens: geometric, plus the chunked-prefill budget and beyond it."""
    longest = inputs.longest_prompt
    buckets = set()
    size = inputs.min_prompt_tokens
    while size < longest:
        buckets.add(size)
        size *= inputs.bucket_factor
    buckets.add(longest)
    budget = inputs.max_num_batched_tokens
    if budget is not None:
        buckets.add(min(budget, longest))
        # Longer than one prefill chunk, so vLLM must split it.
        buckets.add(min(budget + budget // 2, longest))
    return sorted(buckets)


def batch_sizes(inputs: PlanInputs) -> list[int]:
    """Concurrent request counts: a geometric subset of the capture sizes, capped."""
    limit = min(inputs.max_num_seqs, inputs.max_concurrency)
    capture = inputs.cudagraph_capture_sizes or tuple(
        default_cudagraph_capture_sizes(inputs.max_num_seqs)
    )
    allowed = sorted({s for s in capture if 1 <= s <= limit} | {1})
    chosen: list[int] = []
    for size in allowed:
        if not chosen or size >= 2 * chosen[-1]:
            chosen.append(size)
    if allowed[-1] != chosen[-1]:
        chosen.append(allowed[-1])
    return chosen


def _mixed(index: int, prompt_tokens: int, apis: Sequence[Api]) -> RequestSpec:
    """Alternate streaming, and cycle the APIs, so every combination is exercised."""
    api = apis[(index // 2) % len(apis)]
    return RequestSpec(prompt_tokens=prompt_tokens, api=api, stream=index % 2 == 0)


def build_plan(inputs: PlanInputs) -> WarmupPlan:
    """The probe and the ordered steps of a warmup for these serving settings."""
    short = inputs.min_prompt_tokens
    probe = RequestSpec(prompt_tokens=short, api=inputs.apis[0], stream=True)
    steps: list[Step] = []
    for bucket in prompt_buckets(inputs):
        # Each prompt length alone, through every API, streamed and not.
        for api in inputs.apis:
            for stream in (True, False):
                mode = "stream" if stream else "full"
                request = RequestSpec(prompt_tokens=bucket, api=api, stream=stream)
                steps.append(Step(name=f"prompt-{bucket}-{api}-{mode}", requests=(request,)))
    for size in batch_sizes(inputs):
        if size == 1:
            continue
        requests = tuple(_mixed(i, short, inputs.apis) for i in range(size))
        steps.append(Step(name=f"batch-{size}", requests=requests))
    budget = inputs.max_num_batched_tokens
    limit = min(inputs.max_num_seqs, inputs.max_concurrency)
    if budget is not None and limit > 1:
        # Several prompts whose sum exceeds one step's token budget: a mixed, chunked prefill.
        concurrency = min(limit, 4)
        each = min(inputs.longest_prompt, budget // concurrency + 1)
        if each * concurrency > budget:
            steps.append(
                Step(
                    name=f"chunked-prefill-{concurrency}x{each}",
                    requests=tuple(_mixed(i, each, inputs.apis) for i in range(concurrency)),
                )
            )
    return WarmupPlan(probe=probe, steps=tuple(steps), max_tokens=inputs.max_tokens)


def prompt_text(prompt_tokens: int, *, tokens_per_word: float, serial: int) -> str:
    """A prompt of about ``prompt_tokens`` tokens that starts with its own serial word.

    ``tokens_per_word`` comes from the server's tokenizer; the estimate errs short, never
    long, because a prompt longer than the context is rejected.
    """
    words = max(1, int(prompt_tokens / max(tokens_per_word, 1e-6)) - 1)
    body = [_WORDS[i % len(_WORDS)] for i in range(words)]
    return " ".join([f"r{serial}", *body])


def calibration_text() -> str:
    """The text whose token count gives the tokens-per-word ratio (first word excluded)."""
    return " ".join(_WORDS * 8)
