"""Load a text corpus, split it deterministically by document, and tokenize it.

Sources (``spec``):

- ``"default"``: CPython's own documentation topics (``pydoc_data.topics``,
  79 documents, ~465 KB), so that training works offline with no download.
- a UTF-8 text file: documents are separated by blank lines.
- a directory: every ``*.txt`` below it is one document, in sorted path order.
- ``"shards:GLOB"``: pre-tokenized FineWeb shards (``recurnorm.train.shards``).

Split rule, the same for every text source: with ``k = round(1 / val_fraction)``
document ``i`` goes to validation when ``i % k == 0`` (the default corpus
orders its documents by sorted topic name, giving 8 of 79 documents, 32,208 of
466,117 bytes). With fewer than ``k`` documents the last one is the
validation split; a single
document is cut at ``1 - val_fraction`` of its characters. Documents are
joined with a blank line inside each split.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import DataError
from .corpus import Corpus
from .documents import default_documents, read_documents, split_documents
from .tokenizer import get_tokenizer

SHARDS_PREFIX = "shards:"


def load_corpus(spec: str = "default", tokenizer: str | None = None, val_fraction: float = 0.1) -> Corpus:
    """Load, split and tokenize the corpus named by spec (see the module docstring)."""
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if spec.startswith(SHARDS_PREFIX):
        # Imported lazily: the shard reader is only needed for this source.
        from .shards import load_shard_corpus

        return load_shard_corpus(spec[len(SHARDS_PREFIX) :], tokenizer)
    if spec == "default":
        docs = default_documents()
    else:
        docs = read_documents(spec)
    train_text, val_text = split_documents(docs, val_fraction)
    return tokenize_split(train_text, val_text, tokenizer=tokenizer, source=spec)


def as_corpus(data: str | os.PathLike | Corpus, tokenizer: str | None = None) -> Corpus:
    """A Corpus from a spec ("default", a path, "shards:GLOB") or the Corpus itself."""
    if isinstance(data, (str, os.PathLike)):
        return load_corpus(str(data), tokenizer=tokenizer)
    return data


def tokenize_split(train_text: str, val_text: str, *, tokenizer: str | None = None, source: str = "text") -> Corpus:
    """Tokenize the two splits and attach the per-token byte counts of validation."""
    tok = get_tokenizer(tokenizer)
    encode = getattr(tok, "encode_array", None) or tok.encode
    train_tokens = np.asarray(encode(train_text), dtype=np.int64)
    val_tokens = np.asarray(encode(val_text), dtype=np.int64)
    for name, arr in (("train", train_tokens), ("validation", val_tokens)):
        if len(arr) < 2:
            raise DataError(f"corpus {source}: {name} split has {len(arr)} tokens, need >= 2")
    return Corpus(
        train_tokens=train_tokens,
        val_tokens=val_tokens,
        val_bytes=tok.token_bytes(val_tokens),
        vocab_size=int(tok.vocab_size),
        tokenizer="byte" if tokenizer in (None, "byte") else str(tokenizer),
        source=str(source),
    )
