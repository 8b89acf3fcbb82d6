"""Documents of a text corpus and the deterministic split rule (``data``'s module docstring).

Below both readers of text: ``data`` (tokenized per split) and ``shards`` (one BOS per
document), so they read and split the same documents.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import DataError

_BLANK_LINE = re.compile(r"\n[ \t\r]*\n")
_JOIN = "\n\n"


def default_documents() -> list[str]:
    """The default corpus: CPython's pydoc topics, ordered by topic name."""
    from pydoc_data.topics import topics

    return [topics[key] for key in sorted(topics)]


def read_documents(path: str | Path) -> list[str]:
    """Documents of a text file (blank-line separated) or a directory of .txt files."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"corpus {path} does not exist")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise DataError(f"corpus directory {path} contains no .txt files")
        return [_read_text(f) for f in files]
    docs = [d for d in _BLANK_LINE.split(_read_text(path)) if d.strip()]
    return docs


def _read_text(path: Path) -> str:
    """A file's UTF-8 text; empty or undecodable files raise DataError naming the file."""
    from ..io import open_input

    try:
        with open_input(path, "corpus", DataError) as f:  # regular files only: /dev/zero never ends
            raw = f.read()
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not valid UTF-8: byte 0x{raw[exc.start]:02x} at byte offset {exc.start}") from exc
    if not text.strip():
        raise DataError(f"{path} is empty")
    return text


def split_document_list(docs: list[str], val_fraction: float = 0.1) -> tuple[list[str], list[str]]:
    """(train_docs, val_docs) by the deterministic split rule, kept per document.

    Document ``i`` goes to validation when ``i % k == 0`` (``k = round(1 /
    val_fraction)``, 10); with fewer than k documents the last one is
    validation; a single document is cut at ``1 - val_fraction`` of its characters.
    """
    if not docs:
        raise DataError("corpus has no documents")
    if len(docs) == 1:
        text = docs[0]
        cut = int(len(text) * (1.0 - val_fraction))
        if cut < 1 or cut >= len(text):
            raise DataError("corpus is too short to split into train and validation")
        return [text[:cut]], [text[cut:]]
    k = max(2, round(1.0 / val_fraction))
    val_idx = set(range(0, len(docs), k)) if len(docs) >= k else {len(docs) - 1}
    train = [d for i, d in enumerate(docs) if i not in val_idx]
    val = [d for i, d in enumerate(docs) if i in val_idx]
    return train, val


def split_documents(docs: list[str], val_fraction: float = 0.1) -> tuple[str, str]:
    """(train_text, val_text): ``split_document_list`` joined by blank lines."""
    train, val = split_document_list(docs, val_fraction)
    return _JOIN.join(train), _JOIN.join(val)


def load_documents(spec: str, val_fraction: float = 0.1) -> tuple[list[str], list[str]]:
    """Train and validation documents of "default", a text file or a .txt directory.

    The same sources as ``data.load_corpus`` read the same way and split by
    ``split_document_list``, so shards hold the same documents as the text corpus, one
    BOS per document.
    """
    docs = default_documents() if spec == "default" else read_documents(spec)
    return split_document_list(docs, val_fraction)
