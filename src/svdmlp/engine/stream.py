"""Token ids to text as they arrive, for printing while the model generates.

Decoding ids one at a time breaks words and multi-byte characters apart, so each update decodes the
whole continuation so far and emits only the text that is new; text ending in an incomplete
character (U+FFFD) is held back until the next token completes it.
"""

from __future__ import annotations

from collections.abc import Callable


class TextStream:
    """Feed it token ids with :meth:`push`; it calls ``write`` with each new piece of text."""

    def __init__(self, tokenizer, write: Callable[[str], None]):
        self.tokenizer, self.write = tokenizer, write
        self.ids: list[int] = []
        self.emitted = 0  # characters of the decoded text already written

    def push(self, ids: list[int]) -> None:
        self.ids += ids
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            self._emit(text)

    def close(self) -> None:
        """Write whatever is left, complete or not."""
        self._emit(self.tokenizer.decode(self.ids, skip_special_tokens=True))

    def _emit(self, text: str) -> None:
        if len(text) > self.emitted:
            self.write(text[self.emitted :])
            self.emitted = len(text)
