"""Where prompt token counts come from: the model's tokenizer, locally or through the server.

Prompts are built to exact token counts (:class:`~vllm_operator.bench.workload.PromptBuilder`)
with whichever tokenizer is at hand, in this order:

1. A local tokenizer (``--tokenizer``: a folder with ``tokenizer.json``, the file itself, or,
   with ``transformers`` installed, any name it can load). Read with the ``tokenizers``
   library, else ``transformers``; neither is a dependency of the operator image.
2. The server's own tokenizer: vLLM serves ``POST /tokenize``. Exact, and needs nothing
   installed, at the price of one HTTP round trip per word calibrated (about 150, once).
3. One token per word (:class:`~vllm_operator.bench.workload.WordTokenizer`), when neither
   is available; prompt lengths are then approximate, and the report says so.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

import httpx

from vllm_operator.bench.workload import Tokenizer, WordTokenizer

logger = logging.getLogger(__name__)


class LocalTokenizer:
    """A tokenizer read from disk with ``tokenizers`` (or ``transformers``)."""

    def __init__(self, source: str) -> None:
        self.source = source
        path = Path(source)
        file = path / "tokenizer.json" if path.is_dir() else path
        self._encode: Any
        if file.is_file() and _has("tokenizers"):
            tokenizers = importlib.import_module("tokenizers")
            tok = tokenizers.Tokenizer.from_file(str(file))
            self._encode = lambda text: list(tok.encode(text, add_special_tokens=False).ids)
        elif _has("transformers"):
            transformers = importlib.import_module("transformers")
            tok = transformers.AutoTokenizer.from_pretrained(source)
            self._encode = lambda text: list(tok.encode(text, add_special_tokens=False))
        else:
            raise RuntimeError(
                f"cannot read tokenizer {source}: install `tokenizers` (for a tokenizer.json) "
                "or `transformers`, or leave --tokenizer out to use the server's /tokenize"
            )

    def encode(self, text: str) -> list[int]:
        result: list[int] = self._encode(text)
        return result


class ServerTokenizer:
    """The server's ``POST /tokenize`` (vLLM), through a synchronous client.

    Prompts are built before a level starts, so blocking calls are fine (the caller runs
    them in a thread).
    """

    def __init__(self, endpoint: str, model: str, *, timeout_s: float = 30.0) -> None:
        self.model = model
        self.client = httpx.Client(base_url=endpoint.rstrip("/"), timeout=timeout_s)

    def encode(self, text: str) -> list[int]:
        response = self.client.post(
            "/tokenize",
            json={"model": self.model, "prompt": text, "add_special_tokens": False},
        )
        response.raise_for_status()
        data = response.json()
        tokens = data.get("tokens")
        if isinstance(tokens, list):
            return [int(t) for t in tokens]
        return list(range(int(data["count"])))

    def close(self) -> None:
        self.client.close()


def choose_tokenizer(endpoint: str, model: str, local: str | None) -> tuple[Tokenizer, str]:
    """The best tokenizer available and a word for reports (local, server, words)."""
    if local:
        return LocalTokenizer(local), "local"
    server = ServerTokenizer(endpoint, model)
    try:
        server.encode("hello world")
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        server.close()
        logger.warning(
            "Server has no usable /tokenize (%s); prompt lengths are approximate (one token "
            "per word). Pass --tokenizer for exact lengths.",
            exc,
        )
        return WordTokenizer(), "words"
    return server, "server"


def _has(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
