"""``svdmlp generate``: continue one prompt with a checkpoint or a model, streaming the text."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from svdmlp.cli import options


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("generate", help="generate text with a checkpoint or a model")
    p.add_argument(
        "target", nargs="?", default=None, help="checkpoint directory or model (default: built-in model)"
    )
    p.add_argument("--prompt", required=True)
    p.add_argument(
        "--max-new-tokens",
        type=options.positive_int,
        default=64,
        help="at most this many tokens (default 64; prompt and new tokens within the model's context)",
    )
    p.add_argument(
        "--temperature",
        type=options.nonnegative_float,
        default=None,
        help="0 means greedy (default: as the model's generation config says, greedy if it says nothing)",
    )
    p.add_argument(
        "--top-k",
        type=options.positive_int,
        default=None,
        help="sample among the k most likely tokens (default: as the model's)",
    )
    p.add_argument(
        "--top-p",
        type=options.probability,
        default=None,
        help="sample from the top-p probability mass (default: as the model's)",
    )
    p.add_argument("--seed", type=int, default=0, help="seeds sampling (default 0)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument(
        "--engine",
        choices=("fast", "hf"),
        default="fast",
        help="fast: static cache, CUDA-graph decoding, streamed (default); hf: Hugging Face generate",
    )
    options.add_compile(p, "the fast engine's")
    options.add_json(p, "the prompt's and the new tokens' ids and the new text")
    options.add_runtime(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> options.Outcome:
    """Continue one prompt, streaming tokens as they come (``--engine hf``: Hugging Face ``generate``)."""
    from svdmlp import checkpoint
    from svdmlp.engine import Engine
    from svdmlp.engine.engine import check_room, context_length
    from svdmlp.engine.prompt import encode
    from svdmlp.engine.stream import TextStream

    mode = options.compile_mode(args)
    if mode is not None and args.engine == "hf":
        raise ValueError("--compile compiles the fast engine's decode step; --engine hf has none")
    device, dtype = options.runtime(args)
    model, tokenizer, _ = checkpoint.load_any(args.target, args.backend, dtype, device)
    sampling, said = _sampling(args, getattr(model, "generation_config", None))
    prompt = encode(model, tokenizer, args.prompt, chat=args.chat)
    # Either engine's limit (the fast one's cache is as long as the context), before anything is printed.
    check_room(
        len(prompt),
        args.max_new_tokens,
        context_length(model),
        "the model's context",
        "max_position_embeddings",
    )
    print(f"svdmlp: sampling {said}", file=sys.stderr, flush=True)
    stream = TextStream(tokenizer, lambda text: print(text, end="", flush=True))
    if args.engine == "hf":
        new = _hf_generate(model, prompt, sampling, args.max_new_tokens, tokenizer.eos_token_id)
        stream.push(new)
    else:
        compiled = {} if mode is None else {"compile": True, "compile_mode": mode}
        result = Engine(model, max_batch=1, **compiled).generate(
            [prompt],
            args.max_new_tokens,
            sampling,
            stop_tokens=_stop_tokens(model, tokenizer),
            on_tokens=lambda tokens: stream.push(tokens[0]),
        )
        new = result.tokens[0]
    stream.close()
    print()
    record = {
        "prompt_ids": list(prompt),
        "new_ids": new,
        "text": tokenizer.decode(new, skip_special_tokens=True),
        "sampling": asdict(sampling),
        "engine": args.engine,
    }
    return options.Outcome(0, record)


def _sampling(args: argparse.Namespace, generation_config):
    """The model's own sampling (its generation config, as ``model.generate`` reads it), each option
    given overriding its part, and the words that state it (on stderr: the same command samples for
    one model and is greedy for another)."""
    from dataclasses import replace

    from svdmlp.engine import Sampling

    sampling = Sampling.of_generation_config(generation_config, args.seed)
    given = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    sampling = replace(sampling, **{key: value for key, value in given.items() if value is not None})
    if sampling.greedy:
        said = "greedy"
    else:
        top_k = f"top-k {sampling.top_k}" if sampling.top_k else "no top-k"
        said = (
            f"temperature {sampling.temperature:g}, {top_k}, top-p {sampling.top_p:g}, seed {sampling.seed}"
        )
    source = "the model's generation config" if all(v is None for v in given.values()) else "as given"
    return sampling, f"{said} ({source}; --temperature 0 for greedy)"


def _stop_tokens(model, tokenizer) -> set[int]:
    """The tokenizer's end-of-sequence id and every one the model's generation config names."""
    configured = model.generation_config.eos_token_id
    ids = set(configured if isinstance(configured, list) else [configured])
    ids.add(tokenizer.eos_token_id)
    return {i for i in ids if i is not None}


def _hf_generate(model, prompt: list[int], sampling, max_new_tokens: int, pad_id) -> list[int]:
    """Plain ``model.generate`` (dynamic cache, no graphs): the reference path."""
    import torch

    device = next(model.parameters()).device
    torch.manual_seed(sampling.seed)
    kwargs = {"do_sample": False}
    if not sampling.greedy:
        kwargs = {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p}
        kwargs["top_k"] = sampling.top_k or 0  # 0: no top-k (the generation config may default to 50)
    with torch.no_grad():
        output = model.generate(
            torch.tensor([prompt], device=device),
            max_new_tokens=max_new_tokens,
            pad_token_id=pad_id,
            **kwargs,
        )
    return output[0, len(prompt) :].tolist()
