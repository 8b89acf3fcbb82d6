"""Tokenizers: raw UTF-8 bytes by default, SentencePiece for the Parameter Golf setting.

Every tokenizer offers ``encode(text) -> list[int]``, ``vocab_size`` and
``token_bytes(tokens) -> np.ndarray`` (how many bytes of text each token stands
for), which is what bits per byte divides by.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from ..errors import DataError


class Tokenizer(Protocol):
    """What the data loader needs from a tokenizer."""

    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def token_bytes(self, tokens) -> np.ndarray: ...


class ByteTokenizer:
    """One token per UTF-8 byte: vocab 256, every token counts one byte."""

    name = "byte"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        """UTF-8 bytes of text as token ids."""
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        """UTF-8 bytes of text as an int64 array (fast path for large corpora)."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, tokens) -> str:
        """Token ids back to text; invalid UTF-8 sequences become U+FFFD."""
        return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")

    def token_bytes(self, tokens) -> np.ndarray:
        """Per-token byte counts: all ones."""
        return np.ones(len(tokens), dtype=np.int64)


def get_tokenizer(spec: str | None = None) -> Tokenizer:
    """The tokenizer for spec: None or "byte" -> ByteTokenizer, else a SentencePiece model path."""
    if spec is None or spec == "byte":
        return ByteTokenizer()
    path = Path(spec)
    if not path.is_file():
        raise DataError(f"tokenizer model {path} not found")
    # Imported lazily: sentencepiece is only needed for this path.
    from .sentencepiece import SentencePieceTokenizer

    return SentencePieceTokenizer(str(path))
