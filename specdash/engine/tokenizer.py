"""Text <-> ids. Checkpoints bring a `tokenizer.json`; random-weight presets use raw bytes."""

from __future__ import annotations

from tokenizers import Tokenizer


class TextTokenizer:
    def __init__(self, hf: Tokenizer | None) -> None:
        self.hf = hf

    @property
    def vocab_size(self) -> int:
        assert self.hf is not None
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        assert self.hf is not None
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        assert self.hf is not None
        return self.hf.decode(ids, skip_special_tokens=False)

    def __eq__(self, other: object) -> bool:
        """Same vocabulary and special tokens: what a draft must share with its target."""
        if not isinstance(other, TextTokenizer) or self.hf is None or other.hf is None:
            return NotImplemented
        return self.hf.get_vocab(with_added_tokens=True) == other.hf.get_vocab(
            with_added_tokens=True
        )

    __hash__ = None  # type: ignore[assignment]


class ByteTokenizer(TextTokenizer):
    """UTF-8 bytes as token ids, for random-weight presets that ship no tokenizer."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__(None)
        self._vocab = vocab_size

    @property
    def vocab_size(self) -> int:
        return self._vocab

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteTokenizer)
