"""SentencePiece tokenizer with the Parameter Golf byte accounting for bits per byte.

The challenge counts, per *target* token, how many bytes of the original text
it stands for:

- control, unknown and unused tokens (``<s>``, ``</s>``, ``<pad>``, ``<unk>``)
  count 0 and are *boundary* tokens;
- a byte-fallback token (``<0xNN>``) counts 1;
- any other token counts the UTF-8 length of its piece, where a leading "▁"
  (U+2581, SentencePiece's space) counts 1 only when the previous token is not
  a boundary token (after BOS the space is the dummy prefix SentencePiece
  added, not a byte of the text).

``token_bytes`` implements exactly that with three lookup tables built once
per tokenizer (``base_bytes``, ``has_leading_space``, ``is_boundary``), as the
challenge's ``build_sentencepiece_luts`` does. The first token of an array has
no previous token; it is treated as following a boundary (as if after BOS), so
``sum(token_bytes(encode(text)))`` is the UTF-8 length of single-spaced text
whether or not BOS is prepended.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..io import check_writable

SPACE = "\u2581"  # "▁"


class SentencePieceTokenizer:
    """A SentencePiece model plus the challenge's per-token byte accounting."""

    def __init__(self, model_path: str | os.PathLike):
        import sentencepiece as spm

        path = Path(model_path)
        if not path.is_file():
            raise DataError(f"{path}: SentencePiece model not found")
        try:
            sp = spm.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError, ValueError) as exc:
            raise DataError(f"{path}: not a valid SentencePiece model ({exc})") from None
        if sp.vocab_size() <= 0:
            raise DataError(f"{path}: SentencePiece model has an empty vocabulary")
        self.path = path
        self.sp = sp
        self._build_tables()

    def _build_tables(self) -> None:
        sp = self.sp
        n = int(sp.vocab_size())
        base = np.zeros(n, dtype=np.int64)
        lead = np.zeros(n, dtype=bool)
        boundary = np.ones(n, dtype=bool)
        for i in range(n):
            if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
                continue
            boundary[i] = False
            if sp.is_byte(i):
                base[i] = 1
                continue
            piece = sp.id_to_piece(i)
            if piece.startswith(SPACE):
                lead[i] = True
                piece = piece[1:]
            base[i] = len(piece.encode("utf-8"))
        for table in (base, lead, boundary):
            table.setflags(write=False)
        self.base_bytes = base
        self.has_leading_space = lead
        self.is_boundary = boundary

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer({str(self.path)!r}, vocab_size={self.vocab_size})"

    @property
    def name(self) -> str:
        """The model path, as recorded in ``Corpus.tokenizer``."""
        return str(self.path)

    @property
    def vocab_size(self) -> int:
        """Number of token ids."""
        return int(self.sp.vocab_size())

    @property
    def bos_id(self) -> int | None:
        """The BOS id, or None when the model has none."""
        bos = int(self.sp.bos_id())
        return bos if bos >= 0 else None

    @property
    def eos_id(self) -> int | None:
        """The EOS id, or None when the model has none."""
        eos = int(self.sp.eos_id())
        return eos if eos >= 0 else None

    def encode(self, text: str) -> list[int]:
        """Token ids of text (no BOS/EOS added)."""
        return list(self.sp.encode(text))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of several texts at once (no BOS/EOS added)."""
        return [list(ids) for ids in self.sp.encode(list(texts))]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of token ids."""
        return self.sp.decode([int(i) for i in ids])

    def token_bytes(self, tokens: np.ndarray | Sequence[int], prev: int | None = None) -> np.ndarray:
        """Bytes each token stands for (int64), by the challenge's accounting.

        ``prev`` is the token before ``tokens[0]``; None means a boundary
        (start of the stream), so a leading "▁" of the first token counts 0.
        """
        ids = np.asarray(tokens)
        if ids.ndim != 1:
            raise DataError(f"token_bytes expects a 1-D token array, got shape {ids.shape}")
        if ids.size == 0:
            return np.zeros(0, dtype=np.int64)
        if not np.issubdtype(ids.dtype, np.integer):
            raise DataError(f"token ids must be integers, got dtype {ids.dtype}")
        ids = ids.astype(np.int64, copy=False)
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            raise DataError(f"token id {bad} outside the vocabulary of {self.path} (size {self.vocab_size})")
        prev_boundary = np.empty(ids.shape, dtype=bool)
        prev_boundary[1:] = self.is_boundary[ids[:-1]]
        if prev is None:
            prev_boundary[0] = True
        else:
            if not 0 <= int(prev) < self.vocab_size:
                raise DataError(f"previous token id {prev} outside the vocabulary of {self.path}")
            prev_boundary[0] = self.is_boundary[int(prev)]
        return self.base_bytes[ids] + (self.has_leading_space[ids] & ~prev_boundary)


def train_sentencepiece(
    texts: Iterable[str],
    model_prefix_path: str | os.PathLike,
    vocab_size: int = 512,
    *,
    add_dummy_prefix: bool = True,
    force: bool = False,
) -> Path:
    """Train a small deterministic BPE model (byte fallback) and return its .model path.

    Ids follow the challenge's SP8192 model: pad 0, bos 1, eos 2, unk 3. Each
    line of each text is one training sentence. Writes ``<prefix>.model`` and
    ``<prefix>.vocab`` atomically (trained in a temp folder, then renamed).
    """
    import sentencepiece as spm

    prefix = Path(model_prefix_path)
    model_path = prefix.with_name(prefix.name + ".model")
    vocab_path = prefix.with_name(prefix.name + ".vocab")
    check_writable(model_path, force)
    check_writable(vocab_path, force)
    lines = [line for text in texts for line in text.splitlines() if line.strip()]
    if not lines:
        raise DataError("train_sentencepiece: no non-empty text to train on")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=prefix.parent, prefix=f".{prefix.name}.", suffix=".tmp"))
    try:
        corpus = tmp / "input.txt"
        corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
        with open(os.devnull, "w") as devnull:
            try:
                spm.SentencePieceTrainer.train(
                    input=str(corpus),
                    model_prefix=str(tmp / "m"),
                    vocab_size=int(vocab_size),
                    model_type="bpe",
                    byte_fallback=True,
                    character_coverage=1.0,
                    add_dummy_prefix=add_dummy_prefix,
                    pad_id=0,
                    bos_id=1,
                    eos_id=2,
                    unk_id=3,
                    num_threads=1,
                    input_sentence_size=0,
                    shuffle_input_sentence=False,
                    max_sentence_length=1 << 16,
                    minloglevel=2,
                    logstream=devnull,
                )
            except (RuntimeError, OSError) as exc:
                raise DataError(f"training a SentencePiece model failed: {exc}") from None
        os.replace(tmp / "m.vocab", vocab_path)
        os.replace(tmp / "m.model", model_path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return model_path
