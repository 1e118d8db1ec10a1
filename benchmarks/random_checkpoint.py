"""Write a random-weight Llama-shaped model directory in bf16, one safetensors file per unit, without
ever holding the whole model: what the bounded-memory measurements compress (BENCHMARKS.md).

    python benchmarks/random_checkpoint.py llama-3.2-1b /tmp/llama-1b
    python benchmarks/random_checkpoint.py llama-3.1-8b /tmp/llama-8b

The tokenizer is the default model's (SmolLM2's ids are all below the vocabulary size here).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from accelerate import init_empty_weights
from safetensors.torch import save_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from svdmlp import arch, lazy, models
from svdmlp.plan.shapes import PAPER_MODELS

# What the paper models' shapes (svdmlp.plan.shapes) leave out: attention heads and weight tying,
# from the models' Hugging Face configs.
ATTENTION = {
    "llama-3.2-1b": dict(num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "llama-3.1-8b": dict(num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
}


def write(shape: str, out: Path, seed: int = 0) -> None:
    mlp = next(model for model in PAPER_MODELS if model.name == shape)
    config = LlamaConfig(
        vocab_size=128256,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        hidden_size=mlp.hidden,
        intermediate_size=mlp.intermediate,
        num_hidden_layers=mlp.layers,
        **ATTENTION[shape],
    )
    with init_empty_weights():
        model = LlamaForCausalLM(config)
    model.tie_weights()
    units = lazy.units_of(model, arch.decoder_layers(model, arch.of_model(model)))
    names = {id(p): name for name, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    weight_map, done = {}, set()

    def random(parameter) -> torch.Tensor:
        if parameter.dim() == 1:  # norms
            return torch.ones(parameter.shape, dtype=torch.bfloat16)
        return (torch.randn(parameter.shape, generator=generator) * 0.02).to(torch.bfloat16)

    groups = [list(unit.parameters()) for unit in units]
    groups.append([p for p in model.parameters() if all(p is not q for group in groups for q in group)])
    for position, group in enumerate(groups):
        file = lazy.shard_name(position, len(units))
        tensors = {names[id(p)]: random(p) for p in group if id(p) not in done}
        done.update(id(p) for p in group)
        save_file(tensors, out / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file))
    (out / lazy.INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))
    config.save_pretrained(out)
    AutoTokenizer.from_pretrained(models.packaged_model_dir(models.DEFAULT_MODEL)).save_pretrained(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=ATTENTION)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    write(args.shape, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
