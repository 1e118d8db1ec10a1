"""Decode throughput of models served by vLLM (with svdmlp's plugin), side by side in one run.

For each model directory (a dense model or an svdmlp checkpoint), one vLLM engine; for each batch size, a
prefill alone (1 new token) and a prefill plus ``--new`` tokens, both ``--repeats`` times; decode tokens/s
is ``batch * new / (t_long - t_short)`` from the medians. Every batch is generated ``--repeats`` + 1
times in one engine (the first a warm-up), so a worker that dies on a second batch of 16 shows here.
Run it in the vLLM environment (``make serve-env``)::

    .venv-vllm/bin/python benchmarks/vllm_decode.py DENSE_DIR runs/smollm2-keep0.8 runs/smollm2-keep0.6 \\
        --json runs/vllm-decode.json

Writes one JSON record per model and batch, and a Markdown table of tokens/s and ratios to the first model.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

PROMPT = "The history of the city begins in the year"
CHECK_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,")


def _same_tokens(vllm, directory: str) -> bool:
    """Whether vLLM (float32, eager) continues three prompts by 32 greedy tokens as svdmlp's engine does."""
    import torch
    from transformers import AutoTokenizer

    from svdmlp.checkpoint import load_any
    from svdmlp.engine.engine import Engine

    tokenizer = AutoTokenizer.from_pretrained(directory)
    prompts = [tokenizer(p)["input_ids"] for p in CHECK_PROMPTS]
    llm = vllm.LLM(
        directory, dtype="float32", enforce_eager=True, max_model_len=256, kv_cache_memory_bytes=1 << 28
    )
    params = vllm.SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    outputs = llm.generate(
        [vllm.inputs.TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
    )
    theirs = [list(o.outputs[0].token_ids) for o in outputs]
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    engine = Engine(load_any(directory, dtype=torch.float32)[0], max_batch=1)
    return theirs == [engine.generate([p], 32).tokens[0] for p in prompts]


def _seconds(llm, prompts, new: int) -> float:
    """Seconds to generate ``new`` tokens (greedy, never stopping early) for every prompt."""
    import vllm

    params = vllm.SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="model directories; ratios are to the first")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--new", type=int, default=64, help="decode steps timed per batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--compile", action="store_true", help="vLLM's compiled model (minutes to start)")
    parser.add_argument("--json", type=Path, help="write the records here")
    parser.add_argument(
        "--check-tokens",
        action="store_true",
        help="first, for each model: vLLM's greedy tokens against svdmlp's engine (float32, 3 prompts x 32)",
    )
    args = parser.parse_args()

    import vllm

    if args.check_tokens:
        for directory in args.models:
            print(
                json.dumps({"model": directory, "same_greedy_tokens": _same_tokens(vllm, directory)}),
                flush=True,
            )

    records = []
    for directory in args.models:
        started = time.perf_counter()
        llm = vllm.LLM(
            directory,
            dtype=args.dtype,
            enforce_eager=not args.compile,
            max_model_len=512,
            kv_cache_memory_bytes=1 << 30,
            seed=0,
        )
        load_s = time.perf_counter() - started
        prompt_ids = llm.get_tokenizer()(PROMPT)["input_ids"]
        for batch in args.batches:
            prompts = [vllm.inputs.TokensPrompt(prompt_token_ids=prompt_ids)] * batch
            _seconds(llm, prompts, 1 + args.new)  # warm-up
            short = statistics.median(_seconds(llm, prompts, 1) for _ in range(args.repeats))
            long = statistics.median(_seconds(llm, prompts, 1 + args.new) for _ in range(args.repeats))
            record = {
                "model": directory,
                "batch": batch,
                "new": args.new,
                "dtype": args.dtype,
                "compiled": args.compile,
                "load_s": round(load_s, 1),
                "prefill_s": round(short, 4),
                "decode_tokens_per_s": round(batch * args.new / (long - short), 2),
                "ms_per_step": round(1000 * (long - short) / args.new, 2),
            }
            records.append(record)
            print(json.dumps(record), flush=True)
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    base = {r["batch"]: r["decode_tokens_per_s"] for r in records if r["model"] == args.models[0]}
    print("\n| model | batch | ms/step | decode tokens/s | × first |\n|---|---|---|---|---|")
    for r in records:
        ratio = r["decode_tokens_per_s"] / base[r["batch"]]
        print(
            f"| {r['model']} | {r['batch']} | {r['ms_per_step']} | {r['decode_tokens_per_s']} | {ratio:.3f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
