"""Write a tiny random-weight LoRA adapter for one of make_tiny_model.py's models.

The adapter tests need an adapter a real vLLM loads, and no hub is reachable here. This
writes one in the layout PEFT saves and vLLM reads: ``adapter_config.json`` (peft_type
LORA, r, lora_alpha, target_modules) and ``adapter_model.safetensors`` with a
``lora_A``/``lora_B`` pair for each targeted projection of each layer. The weights are
seeded random, and B is not zero (PEFT starts B at zero, which would make the adapter a
no-op): with greedy decoding an adapter's output differs from the base model's, which is
how a test tells that a request was answered by the adapter.

The format is written by hand rather than with the ``peft`` library: it is two files of a
documented layout, and the vLLM venv this runs in does not have peft.

    "$PY" scripts/make_tiny_adapter.py --name tiny-lora-a   # last line: the adapter folder
    "$PY" scripts/make_tiny_adapter.py --list

Adapters are cached like the models: ``$VLLM_OP_CACHE/adapters/<name>-<hash>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_model import SHAPES, write_folder

GENERATOR_VERSION = 1


@dataclasses.dataclass(frozen=True)
class AdapterShape:
    base: str
    rank: int
    seed: int
    alpha: int = 16
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


ADAPTERS: dict[str, AdapterShape] = {
    "tiny-lora-a": AdapterShape(base="tiny-llama", rank=8, seed=1),
    "tiny-lora-b": AdapterShape(base="tiny-llama", rank=8, seed=2),
    # Above vLLM's default --max-lora-rank of 16: refused by a server started with it.
    "tiny-lora-r32": AdapterShape(base="tiny-llama", rank=32, seed=3),
}


def adapter_key(name: str, shape: AdapterShape) -> str:
    blob = json.dumps(
        {"name": name, "shape": dataclasses.asdict(shape), "v": GENERATOR_VERSION},
        sort_keys=True,
    )
    return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def cache_root() -> Path:
    default = Path.home() / ".cache" / "vllm-operator"
    return Path(os.environ.get("VLLM_OP_CACHE", default)) / "adapters"


def _projection_shapes(base: str) -> dict[str, tuple[int, int]]:
    """(in, out) of each attention projection of the base model."""
    s = SHAPES[base]
    q = s.num_attention_heads * s.head_dim
    kv = s.num_key_value_heads * s.head_dim
    return {
        "q_proj": (s.hidden_size, q),
        "k_proj": (s.hidden_size, kv),
        "v_proj": (s.hidden_size, kv),
        "o_proj": (q, s.hidden_size),
    }


def _write(out: Path, shape: AdapterShape) -> None:
    import torch
    from safetensors.torch import save_file

    base = SHAPES[shape.base]
    dims = _projection_shapes(shape.base)
    generator = torch.Generator().manual_seed(shape.seed)
    tensors = {}
    for layer in range(base.num_hidden_layers):
        for target in shape.targets:
            fan_in, fan_out = dims[target]
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            a = torch.randn(shape.rank, fan_in, generator=generator) / fan_in**0.5
            b = torch.randn(fan_out, shape.rank, generator=generator)
            tensors[f"{prefix}.lora_A.weight"] = a.to(getattr(torch, base.dtype)).contiguous()
            tensors[f"{prefix}.lora_B.weight"] = b.to(getattr(torch, base.dtype)).contiguous()
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": shape.base,
        "r": shape.rank,
        "lora_alpha": shape.alpha,
        "lora_dropout": 0.0,
        "target_modules": list(shape.targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "inference_mode": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")


def make(name: str, *, root: Path, force: bool = False) -> Path:
    """Write adapter ``name`` under ``root`` unless it is there already; its folder."""
    shape = ADAPTERS[name]
    target = root / adapter_key(name, shape)
    if (target / "adapter_config.json").is_file() and not force:
        return target
    return write_folder(target, lambda tmp: _write(tmp, shape))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="tiny-lora-a", choices=sorted(ADAPTERS))
    parser.add_argument("--cache", type=Path, default=None, help="default: $VLLM_OP_CACHE/adapters")
    parser.add_argument("--force", action="store_true", help="regenerate even if cached")
    parser.add_argument("--list", action="store_true", help="print the adapters as JSON")
    args = parser.parse_args(argv)
    if args.list:
        print(json.dumps({n: dataclasses.asdict(s) for n, s in ADAPTERS.items()}, indent=2))
        return 0
    print(make(args.name, root=args.cache or cache_root(), force=args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
