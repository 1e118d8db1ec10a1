"""svdmlp's perplexity of a built-in model against a plain transformers loop over the same windows.

The reference loads the model's GGUF file with transformers itself (float32, the GGUF's own tokenizer)
and scores each window with the model's own loss, the BOS token put first where the model's convention
wants one, exactly as ``svdmlp eval`` does; svdmlp scores its cached conversion (bf16 weights read
into float32, its cached tokenizer). A difference beyond the bf16 rounding of the weights means the
tokenization, the special tokens, the masking or the conversion differ.

    python benchmarks/perplexity_vs_transformers.py gemma-3-270m --text shakespeare-heldout --text gsm8k
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from svdmlp import arch, corpora, models
from svdmlp.evaluate import suite


def plain_perplexity(model, tokenizer, text: str, seq_len: int, windows: int, bos: int | None) -> float:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    total, count = 0.0, 0
    for index in range(min(windows, len(ids) // seq_len)):
        window = ([] if bos is None else [bos]) + ids[index * seq_len : (index + 1) * seq_len]
        inputs = torch.tensor([window])
        with torch.no_grad():
            loss = model(input_ids=inputs, labels=inputs).loss
        total += float(loss) * (len(window) - 1)
        count += len(window) - 1
    return math.exp(total / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(models.PACKAGED))
    parser.add_argument("--text", action="append", required=True)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--max-windows", type=int, default=8)
    args = parser.parse_args()
    texts = [(name, corpora.read_text(name)) for name in args.text]

    model, tokenizer, _ = models.load_dense(args.model)
    settings = suite.EvalSettings(seq_len=args.seq_len, max_windows=args.max_windows)
    ours = suite.score(model, tokenizer, texts, settings, "svdmlp")
    del model

    packaged = models.PACKAGED[args.model]
    with tempfile.TemporaryDirectory() as scratch:
        gguf = Path(scratch) / packaged.gguf_name
        with open(gguf, "wb") as whole:
            for part in packaged.part_paths():
                with open(part, "rb") as chunk:
                    shutil.copyfileobj(chunk, whole, 1 << 24)
        reference = AutoModelForCausalLM.from_pretrained(
            scratch, gguf_file=gguf.name, dtype=torch.float32
        ).eval()
        own_tokenizer = AutoTokenizer.from_pretrained(scratch, gguf_file=gguf.name)
    bos = arch.bos_token_id(arch.of_model(reference), own_tokenizer)
    rows = []
    for name, text in texts:
        theirs = plain_perplexity(reference, own_tokenizer, text, args.seq_len, args.max_windows, bos)
        rows.append(
            {
                "model": args.model,
                "text": name,
                "svdmlp": ours["perplexity"][name],
                "transformers": theirs,
                "ratio": ours["perplexity"][name] / theirs,
                "bos": bos,
            }
        )
        print(json.dumps(rows[-1]))


if __name__ == "__main__":
    main()
