"""Parameter Golf FineWeb token shards: read, write, load as a Corpus, and make.

Shard format (``fineweb_{train,val}_NNNNNN.bin``): a header of 256
little-endian int32 (1,024 bytes) with ``[0] = 20240520`` (magic), ``[1] = 1``
(version), ``[2] = n_tokens``; then ``n_tokens`` little-endian uint16 tokens.
A valid file is exactly ``1024 + 2 * n_tokens`` bytes. Each document starts
with BOS.

Bits per byte needs the bytes each validation token stands for, which only the
tokenizer knows: ``load_shard_corpus`` takes the SentencePiece model and uses
its ``token_bytes`` (the challenge's accounting). Without a model it accepts
only shards whose tokens are all below 256 (byte-level tokens, 1 byte each)
and otherwise raises ``DataError`` asking for ``--tokenizer MODEL``.
"""

from __future__ import annotations

import glob as globlib
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..errors import DataError, OutputExistsError
from ..io import atomic_write_bytes, check_writable
from .corpus import Corpus
from .documents import load_documents
from .tokens import TokenStream

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_BYTES = 2
MAX_TOKEN = np.iinfo(np.uint16).max
MAX_SHARD_TOKENS = np.iinfo(np.int32).max
DEFAULT_SHARD_TOKENS = 100_000_000  # the challenge's shard size


class Tokenizer(Protocol):
    """What sharding needs from a tokenizer."""

    vocab_size: int

    def encode(self, text: str) -> list[int]: ...


# ---------------------------------------------------------------- read / write


def read_shard(path: str | os.PathLike, mmap: bool = False) -> np.ndarray:
    """Tokens of one shard file as a uint16 array, after checking its header and size."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise DataError(f"{path}: shard file not found") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read shard ({exc})") from None
    if size < HEADER_BYTES:
        raise DataError(f"{path}: header too short: file has {size} bytes, a shard header is {HEADER_BYTES}")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, n_tokens = (int(x) for x in header[:3])
    if magic != MAGIC:
        raise DataError(f"{path}: magic {magic} != {MAGIC}")
    if version != VERSION:
        raise DataError(f"{path}: version {version} != {VERSION}")
    if n_tokens < 0:
        raise DataError(f"{path}: n_tokens {n_tokens} is negative")
    expected = HEADER_BYTES + TOKEN_BYTES * n_tokens
    if size != expected:
        kind = "truncated" if size < expected else "over-long"
        raise DataError(f"{path}: {kind}: n_tokens {n_tokens} needs {expected} bytes, file has {size}")
    if n_tokens == 0:
        return np.zeros(0, dtype=np.uint16)
    if mmap:
        return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(n_tokens,))
    tokens = np.fromfile(path, dtype="<u2", count=n_tokens, offset=HEADER_BYTES)
    if tokens.size != n_tokens:  # the file changed under us
        raise DataError(f"{path}: truncated: read {tokens.size} of n_tokens {n_tokens}")
    return tokens.astype(np.uint16, copy=False)


def shard_bytes(tokens: np.ndarray, name: str = "tokens") -> bytes:
    """The bytes of a shard file holding tokens (checked to fit uint16)."""
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise DataError(f"{name}: shard tokens must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise DataError(f"{name}: shard tokens must be integers, got dtype {arr.dtype}")
    if arr.size > MAX_SHARD_TOKENS:
        raise DataError(f"{name}: n_tokens {arr.size} does not fit the int32 header")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi > MAX_TOKEN:
            bad = lo if lo < 0 else hi
            raise DataError(f"{name}: token {bad} does not fit uint16 (0..{MAX_TOKEN})")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, VERSION, arr.size
    return header.tobytes() + arr.astype("<u2", copy=False).tobytes()


def write_shard(path: str | os.PathLike, tokens: np.ndarray, force: bool = False) -> Path:
    """Write tokens as one shard file, atomically; refuse to overwrite unless force."""
    path = Path(path)
    data = shard_bytes(tokens, name=str(path))
    check_writable(path, force)
    return atomic_write_bytes(path, data, exclusive=not force)


# ---------------------------------------------------------------- load as a Corpus


def _split_shard_files(pattern: str) -> tuple[list[Path], list[Path]]:
    if os.path.isdir(os.path.expanduser(pattern)):
        pattern = os.path.join(pattern, "*.bin")
    files = sorted(Path(p) for p in globlib.glob(os.path.expanduser(pattern)))
    files = [f for f in files if f.is_file()]
    if not files:
        raise DataError(f"no shard files match {pattern!r}")
    train, val, other = [], [], []
    for f in files:
        is_train, is_val = "train" in f.name, "val" in f.name
        if is_train == is_val:
            other.append(f)
        elif is_train:
            train.append(f)
        else:
            val.append(f)
    if other:
        raise DataError(
            f"{other[0]}: cannot tell train from validation; shard names must contain "
            "'train' or 'val' (fineweb_train_000000.bin, fineweb_val_000000.bin)"
        )
    if not val:
        raise DataError(
            f"no validation shard among the {len(files)} file(s) matching {pattern!r} "
            "(expected a name containing 'val', e.g. fineweb_val_000000.bin)"
        )
    return train, val


def _concat(files: list[Path]) -> np.ndarray:
    if not files:
        return np.zeros(0, dtype=np.int64)
    parts = [read_shard(f, mmap=True) for f in files]
    out = np.empty(sum(p.size for p in parts), dtype=np.int64)
    pos = 0
    for p in parts:
        out[pos : pos + p.size] = p
        pos += p.size
    return out


def load_shard_corpus(glob_pattern: str, tokenizer_path: Any = None) -> Corpus:
    """Load shard files matching a glob ('shards:' prefix allowed) as a Corpus.

    A directory stands for ``DIR/*.bin``. Names containing 'train' go to train, 'val' to validation (each sorted and
    concatenated); there must be at least one validation shard, train may be
    empty (evaluation only); the training tokens are a memory-mapped
    ``TokenStream``. ``tokenizer_path`` is a SentencePiece model path
    or a ``SentencePieceTokenizer``; it gives ``vocab_size`` and ``val_bytes``.
    Without one (or with "byte"), only byte-level shards (every token < 256) load, with
    vocab_size 256 and 1 byte per token.
    """
    pattern = glob_pattern[len("shards:") :] if glob_pattern.startswith("shards:") else glob_pattern
    train_files, val_files = _split_shard_files(pattern)
    # Training shards stay memory-mapped (read per batch); validation is scored whole.
    train = TokenStream([read_shard(f, mmap=True) for f in train_files])
    val = _concat(val_files)
    if tokenizer_path is None or tokenizer_path == "byte":
        hi = max((int(a.max()) for a in (train, val) if a.size), default=-1)
        if hi >= 256:
            raise DataError(
                f"shards {pattern!r} hold token ids up to {hi}: bits per byte needs the "
                "tokenizer that made them (pass --tokenizer MODEL, the SentencePiece .model)"
            )
        return Corpus(
            train_tokens=train,
            val_tokens=val,
            val_bytes=np.ones(val.size, dtype=np.int64),
            vocab_size=256,
            tokenizer="byte",
            source=f"shards:{pattern}",
        )
    tok = _as_sentencepiece(tokenizer_path)
    for files, arr in ((train_files, train), (val_files, val)):
        if arr.size and int(arr.max()) >= tok.vocab_size:
            raise DataError(
                f"{files[0].parent}: token id {int(arr.max())} is outside the vocabulary "
                f"of {tok.path} (size {tok.vocab_size}); wrong tokenizer for these shards?"
            )
    return Corpus(
        train_tokens=train,
        val_tokens=val,
        val_bytes=tok.token_bytes(val),
        vocab_size=tok.vocab_size,
        tokenizer=str(tok.path),
        source=f"shards:{pattern}",
    )


def _as_sentencepiece(tokenizer: Any):
    from .sentencepiece import SentencePieceTokenizer

    if isinstance(tokenizer, SentencePieceTokenizer):
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        return SentencePieceTokenizer(tokenizer)
    raise DataError(f"expected a SentencePiece model path, got {type(tokenizer).__name__}")


# ---------------------------------------------------------------- make shards


@dataclass
class ShardReport:
    """What ``shard_corpus`` wrote."""

    out_dir: str
    tokenizer: str
    vocab_size: int
    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    train_docs: int = 0
    val_docs: int = 0
    train_tokens: int = 0
    val_tokens: int = 0
    val_bytes: int | None = None  # by the tokenizer's accounting, when it has one

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)


def tokenize_documents(docs: list[str], tokenizer: Tokenizer) -> np.ndarray:
    """One token stream of documents, each starting with BOS when the tokenizer has one."""
    bos = getattr(tokenizer, "bos_id", None)
    batch = getattr(tokenizer, "encode_batch", None)
    encoded = batch(docs) if batch is not None else [tokenizer.encode(d) for d in docs]
    parts = []
    for ids in encoded:
        if bos is not None and bos >= 0:
            parts.append(np.array([bos], dtype=np.int64))
        parts.append(np.asarray(ids, dtype=np.int64))
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(parts)


def existing_shards(out_dir: str | os.PathLike, prefix: str = "fineweb") -> list[Path]:
    """Shard files of this prefix already in out_dir."""
    out = Path(out_dir)
    if not out.is_dir():
        return []
    return sorted(p for p in out.iterdir() if re.fullmatch(rf"{re.escape(prefix)}_(train|val)_\d+\.bin", p.name))


def shard_corpus(
    source: str | tuple[list[str], list[str]],
    tokenizer: Any,
    out_dir: str | os.PathLike,
    prefix: str = "fineweb",
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    force: bool = False,
) -> ShardReport:
    """Tokenize train/val documents into ``<prefix>_{train,val}_NNNNNN.bin`` shards.

    ``source`` is a corpus spec for ``load_documents`` or a pair (train_docs,
    val_docs); ``tokenizer`` a SentencePiece model path, "byte", or a tokenizer
    object. Each document starts with BOS when the tokenizer has one; the token stream is cut every
    ``shard_tokens`` tokens (documents may span shards). Refuses an out_dir
    that already holds shards of this prefix unless force, which also removes
    stale ones.
    """
    if not 0 < int(shard_tokens) <= MAX_SHARD_TOKENS:
        raise DataError(f"shard_tokens {shard_tokens} must be in 1..{MAX_SHARD_TOKENS}")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", prefix):
        raise DataError(f"shard prefix {prefix!r} must be a plain file-name stem")
    if isinstance(tokenizer, (str, os.PathLike)):
        from .tokenizer import get_tokenizer

        tokenizer = get_tokenizer(str(tokenizer))
    if int(tokenizer.vocab_size) > MAX_TOKEN + 1:
        raise DataError(f"tokenizer vocab_size {tokenizer.vocab_size} does not fit uint16 shard tokens")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a directory")
    old = existing_shards(out, prefix)
    if old and not force:
        raise OutputExistsError(
            f"{out} already holds {len(old)} {prefix} shard(s) ({old[0].name}, ...); pass --force to overwrite them"
        )
    if isinstance(source, str):
        train_docs, val_docs = load_documents(source)
    else:
        train_docs, val_docs = list(source[0]), list(source[1])
    if not val_docs:
        raise DataError("no validation documents to shard")

    name = str(getattr(tokenizer, "path", getattr(tokenizer, "name", type(tokenizer).__name__)))
    report = ShardReport(
        out_dir=str(out),
        tokenizer=name,
        vocab_size=int(tokenizer.vocab_size),
        train_docs=len(train_docs),
        val_docs=len(val_docs),
    )
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for split, docs in (("train", train_docs), ("val", val_docs)):
        stream = tokenize_documents(docs, tokenizer)
        files = []
        for i, start in enumerate(range(0, stream.size, int(shard_tokens))):
            path = out / f"{prefix}_{split}_{i:06d}.bin"
            write_shard(path, stream[start : start + int(shard_tokens)], force=True)
            files.append(path)
        written += files
        if split == "train":
            report.train_files = [str(p) for p in files]
            report.train_tokens = int(stream.size)
        else:
            report.val_files = [str(p) for p in files]
            report.val_tokens = int(stream.size)
            counter = getattr(tokenizer, "token_bytes", None)
            if counter is not None:
                report.val_bytes = int(counter(stream).sum())
    keep = set(written)
    for stale in old:
        if stale not in keep:
            stale.unlink()
    return report
