"""Corpus loading: the default corpus split, text files, directories, and bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

from recurnorm.errors import DataError
from recurnorm.train.data import load_corpus, split_documents
from recurnorm.train.tokenizer import ByteTokenizer, get_tokenizer


def test_default_split_deterministic_and_disjoint(default_corpus):
    again = load_corpus("default")
    assert np.array_equal(again.train_tokens, default_corpus.train_tokens)
    assert np.array_equal(again.val_tokens, default_corpus.val_tokens)
    c = default_corpus
    assert c.vocab_size == 256 and c.tokenizer == "byte" and c.source == "default"
    assert c.train_tokens.dtype == np.int64 and c.val_tokens.dtype == np.int64
    assert np.all(c.val_bytes == 1)
    # ~466 KB in total, split by document: no validation document appears in train.
    assert 400_000 < len(c.train_tokens) + len(c.val_tokens) < 500_000
    assert 0.03 < len(c.val_tokens) / len(c.train_tokens) < 0.2
    from pydoc_data.topics import topics

    keys = sorted(topics)
    val_keys = keys[::10]
    train_keys = [k for k in keys if k not in val_keys]
    assert len(val_keys) == 8 and not set(val_keys) & set(train_keys)
    assert bytes(c.val_tokens.astype(np.uint8)).decode() == "\n\n".join(topics[k] for k in val_keys)
    assert bytes(c.train_tokens.astype(np.uint8)).decode() == "\n\n".join(topics[k] for k in train_keys)


def test_split_rule():
    docs = [f"doc{i}" for i in range(25)]
    train, val = split_documents(docs, 0.1)
    assert val.split("\n\n") == ["doc0", "doc10", "doc20"]
    assert len(train.split("\n\n")) == 22
    # fewer documents than 1/val_fraction: the last one validates
    assert split_documents(["a", "b", "c"], 0.1) == ("a\n\nb", "c")
    # a single document is cut by characters
    assert split_documents(["x" * 90 + "y" * 10], 0.1) == ("x" * 90, "y" * 10)


def test_text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(f"paragraph {i} é" for i in range(20)), encoding="utf-8")
    c = load_corpus(str(path))
    val = bytes(c.val_tokens.astype(np.uint8)).decode("utf-8")
    assert val == "paragraph 0 é\n\nparagraph 10 é"
    assert c.source == str(path)
    assert len(c.val_bytes) == len(c.val_tokens)


def test_directory(tmp_path):
    for i in range(12):
        (tmp_path / f"f{i:02d}.txt").write_text(f"file {i} text", encoding="utf-8")
    (tmp_path / "ignored.md").write_text("not a txt", encoding="utf-8")
    c = load_corpus(str(tmp_path))
    assert bytes(c.val_tokens.astype(np.uint8)).decode() == "file 0 text\n\nfile 10 text"
    assert b"not a txt" not in bytes(c.train_tokens.astype(np.uint8))


def test_empty_file(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    with pytest.raises(DataError, match="empty.txt"):
        load_corpus(str(path))


def test_non_utf8_names_file_and_offset(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"hello world\n\ncaf\xe9 au lait")
    with pytest.raises(DataError, match=r"latin1\.txt.*offset 16"):
        load_corpus(str(path))


def test_missing_path(tmp_path):
    with pytest.raises(DataError, match="nope.txt"):
        load_corpus(str(tmp_path / "nope.txt"))


def test_dir_without_txt(tmp_path):
    (tmp_path / "a.md").write_text("x", encoding="utf-8")
    with pytest.raises(DataError, match="no .txt"):
        load_corpus(str(tmp_path))


def test_bad_val_fraction():
    with pytest.raises(DataError, match="val_fraction"):
        load_corpus("default", val_fraction=0.0)


def test_byte_tokenizer_roundtrip():
    tok = get_tokenizer(None)
    assert isinstance(tok, ByteTokenizer) and tok.vocab_size == 256
    ids = tok.encode("héllo")
    assert ids == list("héllo".encode())
    assert tok.decode(ids) == "héllo"
    assert tok.token_bytes(ids).tolist() == [1] * 6


def test_missing_tokenizer_model(tmp_path):
    with pytest.raises(DataError, match="missing.model"):
        get_tokenizer(str(tmp_path / "missing.model"))


def test_sentencepiece_corpus(sp8192_model):
    c = load_corpus("default", tokenizer=str(sp8192_model))
    assert c.vocab_size == 8192 and c.tokenizer == str(sp8192_model)
    assert len(c.val_bytes) == len(c.val_tokens)
    # Several bytes per token on average, and never a negative count.
    assert c.val_bytes.min() >= 0 and c.val_bytes.sum() > 2 * len(c.val_tokens)
