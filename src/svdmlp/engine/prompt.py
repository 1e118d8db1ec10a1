"""A prompt's token ids as the model expects them: its chat template if asked, and its BOS token
first where its convention wants one (:func:`svdmlp.arch.bos_token_id`; Gemma generates garbage
without it)."""

from __future__ import annotations

from svdmlp import arch


def encode(model, tokenizer, text: str, chat: bool = False) -> list[int]:
    """The ids of ``text`` (wrapped in the tokenizer's chat template with ``chat``), starting with the
    model's BOS token when its convention asks for one and the tokenizer did not already put it there."""
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("this model's tokenizer has no chat template; drop --chat")
        messages = [{"role": "user", "content": text}]
        ids = list(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        )
    else:
        ids = list(tokenizer(text)["input_ids"])
    bos = arch.bos_token_id(arch.of_model(model), tokenizer)
    if bos is not None and ids[:1] != [bos]:
        ids.insert(0, bos)
    if not ids:  # nothing for the model to continue from
        raise ValueError("the prompt is empty: it encodes to no token; give some text")
    return ids
