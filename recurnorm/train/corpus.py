"""Corpus: tokenized train/validation streams plus the byte accounting for bpb."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Corpus:
    """Token streams of one data source, split into train and validation.

    ``val_bytes[i]`` is the number of bytes that validation token ``i`` stands
    for (1 for the byte tokenizer; the Parameter Golf SentencePiece accounting
    otherwise), so ``bpb = sum(CE over targets) / ln 2 / sum(val_bytes of targets)``.
    """

    train_tokens: np.ndarray  # 1-D int64, or a memory-mapped tokens.TokenStream (shards)
    val_tokens: np.ndarray  # 1-D int64
    val_bytes: np.ndarray  # 1-D int64, aligned with val_tokens
    vocab_size: int
    tokenizer: str  # "byte" or the SentencePiece model path
    source: str  # "default", a path, or "shards:GLOB"

    def __post_init__(self) -> None:
        if len(self.val_bytes) != len(self.val_tokens):
            raise ValueError("val_bytes must align with val_tokens")
