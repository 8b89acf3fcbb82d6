"""FineWeb shard files: format checks, Corpus loading with bpb bytes, sharding, CLI."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from recurnorm.cli.main import main
from recurnorm.errors import DataError, OutputExistsError
from recurnorm.train import data
from recurnorm.train.documents import split_document_list
from recurnorm.train.sentencepiece import SentencePieceTokenizer, train_sentencepiece
from recurnorm.train.shards import (
    HEADER_BYTES,
    MAGIC,
    load_shard_corpus,
    read_shard,
    shard_corpus,
    write_shard,
)

TRAIN_DOCS = [
    "The first training document talks about shared blocks and per step norms.",
    "Another training document, with commas, numbers like 42 and a question?",
    "Short one.",
    "Quantization error through looped layers is amplified over the loops.",
]
VAL_DOCS = [
    "Validation text is held out from training and measured in bits per byte.",
    "The second validation document ends here.",
]


def raw_shard(magic=MAGIC, version=1, n=None, tokens=(1, 2, 3), extra=b"", header_ints=256):
    """Bytes of a shard file built by hand (independent of write_shard)."""
    n = len(tokens) if n is None else n
    header = [magic, version, n] + [0] * (header_ints - 3)
    return struct.pack(f"<{header_ints}i", *header) + struct.pack(f"<{len(tokens)}H", *tokens) + extra


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sp")
    return train_sentencepiece(data.default_documents(), out / "pydoc512", vocab_size=512)


# ---------------------------------------------------------------- format


@pytest.mark.parametrize(
    "tokens",
    [[], [0], [1, 2, 3], [65535, 0, 65535], list(range(0, 65536, 7))],
)
def test_roundtrip(tmp_path, tokens):
    path = write_shard(tmp_path / "fineweb_train_000000.bin", np.array(tokens, dtype=np.int64))
    assert path.stat().st_size == HEADER_BYTES + 2 * len(tokens)
    got = read_shard(path)
    assert got.dtype == np.uint16
    assert got.tolist() == tokens
    assert read_shard(path, mmap=True).tolist() == tokens


def test_written_bytes_match_the_format(tmp_path):
    path = write_shard(tmp_path / "x.bin", np.array([1, 2, 3], dtype=np.uint16))
    assert path.read_bytes() == raw_shard(tokens=(1, 2, 3))


def test_reads_a_hand_built_shard(tmp_path):
    path = tmp_path / "fineweb_val_000000.bin"
    path.write_bytes(raw_shard(tokens=(7, 65535, 0, 9)))
    assert read_shard(path).tolist() == [7, 65535, 0, 9]


@pytest.mark.parametrize(
    "content, pattern",
    [
        (raw_shard(magic=123), r"fineweb_val_000000\.bin: magic 123 != 20240520"),
        (raw_shard(version=2), r"fineweb_val_000000\.bin: version 2 != 1"),
        (raw_shard(n=-5), r"fineweb_val_000000\.bin: n_tokens -5 is negative"),
        (raw_shard(tokens=(1, 2, 3))[:-1], r"fineweb_val_000000\.bin: truncated: n_tokens 3"),
        (
            raw_shard(n=4, tokens=(1, 2, 3)),
            r"truncated: n_tokens 4 needs 1032 bytes, file has 1030",
        ),
        (raw_shard(extra=b"\x00\x00"), r"fineweb_val_000000\.bin: over-long: n_tokens 3"),
        (raw_shard(extra=b"\x00"), r"over-long"),
        (raw_shard(n=2**31 - 1), r"truncated: n_tokens 2147483647"),
        (raw_shard(header_ints=100, tokens=()), r"fineweb_val_000000\.bin: header too short"),
        (b"", r"header too short: file has 0 bytes"),
    ],
    ids=[
        "magic",
        "version",
        "negative",
        "truncated",
        "count-too-big",
        "extra-bytes",
        "odd-byte",
        "huge-count",
        "short-header",
        "empty",
    ],
)
def test_malformed_shards_rejected(tmp_path, content, pattern):
    path = tmp_path / "fineweb_val_000000.bin"
    path.write_bytes(content)
    with pytest.raises(DataError, match=pattern):
        read_shard(path)


def test_missing_shard(tmp_path):
    with pytest.raises(DataError, match="fineweb_val_000009.bin: shard file not found"):
        read_shard(tmp_path / "fineweb_val_000009.bin")


@pytest.mark.parametrize(
    "tokens, pattern",
    [
        (np.array([1, 65536]), "token 65536 does not fit uint16"),
        (np.array([-1, 3]), "token -1 does not fit uint16"),
        (np.array([1.5, 2.0]), "must be integers"),
        (np.zeros((2, 2), dtype=np.int64), "must be 1-D"),
    ],
)
def test_write_rejects_bad_tokens(tmp_path, tokens, pattern):
    path = tmp_path / "bad.bin"
    with pytest.raises(DataError, match=pattern):
        write_shard(path, tokens)
    assert not path.exists()


def test_write_refuses_existing_without_force(tmp_path):
    path = write_shard(tmp_path / "a.bin", np.array([1, 2]))
    with pytest.raises(OutputExistsError):
        write_shard(path, np.array([3]))
    assert read_shard(path).tolist() == [1, 2]
    write_shard(path, np.array([3]), force=True)
    assert read_shard(path).tolist() == [3]
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]  # no temp files left


# ---------------------------------------------------------------- Corpus


def test_load_shard_corpus_counts_val_text_bytes(tmp_path, trained):
    tok = SentencePieceTokenizer(trained)
    report = shard_corpus((TRAIN_DOCS, VAL_DOCS), trained, tmp_path, shard_tokens=16)
    assert len(report.train_files) > 1 and len(report.val_files) > 1  # documents span shards
    corpus = load_shard_corpus(str(tmp_path / "fineweb_*.bin"), trained)
    expected_val = np.concatenate([[tok.bos_id] + tok.encode(d) for d in VAL_DOCS])
    expected_train = np.concatenate([[tok.bos_id] + tok.encode(d) for d in TRAIN_DOCS])
    assert corpus.val_tokens.dtype == np.int64 and corpus.train_tokens.dtype == np.int64
    assert corpus.val_tokens.tolist() == expected_val.tolist()
    assert corpus.train_tokens.tolist() == expected_train.tolist()
    val_text_bytes = sum(len(d.encode("utf-8")) for d in VAL_DOCS)
    assert int(corpus.val_bytes.sum()) == val_text_bytes == report.val_bytes
    assert corpus.vocab_size == 512
    assert corpus.tokenizer == str(trained)
    assert corpus.source.startswith("shards:")
    # the data loader's shards: source goes through the same reader
    via_data = data.load_corpus(f"shards:{tmp_path}/fineweb_*.bin", tokenizer=str(trained))
    assert via_data.val_tokens.tolist() == corpus.val_tokens.tolist()
    assert via_data.val_bytes.tolist() == corpus.val_bytes.tolist()
    assert load_shard_corpus(str(tmp_path), trained).val_tokens.size == corpus.val_tokens.size


def test_load_shard_corpus_real_model(tmp_path, sp8192_model):
    shard_corpus((TRAIN_DOCS, VAL_DOCS), sp8192_model, tmp_path)
    corpus = load_shard_corpus(str(tmp_path / "*.bin"), sp8192_model)
    assert corpus.vocab_size == 8192
    assert int(corpus.val_bytes.sum()) == sum(len(d.encode()) for d in VAL_DOCS)
    assert (corpus.val_tokens == 1).sum() == len(VAL_DOCS)


def test_load_needs_a_val_shard(tmp_path):
    write_shard(tmp_path / "fineweb_train_000000.bin", np.array([1, 2]))
    with pytest.raises(DataError, match="no validation shard"):
        load_shard_corpus(str(tmp_path / "*.bin"))


def test_load_needs_matching_files(tmp_path):
    with pytest.raises(DataError, match="no shard files match"):
        load_shard_corpus(str(tmp_path / "*.bin"))


def test_load_rejects_unclassifiable_names(tmp_path):
    write_shard(tmp_path / "fineweb_val_000000.bin", np.array([1, 2]))
    write_shard(tmp_path / "mystery.bin", np.array([1, 2]))
    with pytest.raises(DataError, match="mystery.bin"):
        load_shard_corpus(str(tmp_path / "*.bin"))


def test_load_without_tokenizer(tmp_path):
    write_shard(tmp_path / "fineweb_train_000000.bin", np.array([300, 2]))
    write_shard(tmp_path / "fineweb_val_000000.bin", np.array([1, 2, 3]))
    with pytest.raises(DataError, match="--tokenizer MODEL"):
        load_shard_corpus(str(tmp_path / "*.bin"))
    # byte-level shards (all tokens < 256) load at 1 byte per token
    write_shard(tmp_path / "fineweb_train_000000.bin", np.array([200, 2]), force=True)
    corpus = load_shard_corpus(f"shards:{tmp_path}/*.bin")
    assert corpus.vocab_size == 256 and corpus.tokenizer == "byte"
    assert corpus.val_bytes.tolist() == [1, 1, 1]
    assert corpus.train_tokens.tolist() == [200, 2]


def test_load_rejects_tokens_outside_vocab(tmp_path, trained):
    write_shard(tmp_path / "fineweb_val_000000.bin", np.array([1, 600]))
    with pytest.raises(DataError, match="token id 600 is outside the vocabulary"):
        load_shard_corpus(str(tmp_path / "*.bin"), trained)


def test_load_rejects_corrupt_shard(tmp_path):
    (tmp_path / "fineweb_val_000000.bin").write_bytes(raw_shard(magic=7))
    with pytest.raises(DataError, match="magic 7 != 20240520"):
        load_shard_corpus(str(tmp_path / "*.bin"))


# ---------------------------------------------------------------- sharding


def test_default_corpus_split_matches_the_text_loader(tmp_path, trained):
    docs = data.default_documents()
    train, val = split_document_list(docs)
    assert ("\n\n".join(train), "\n\n".join(val)) == data.split_documents(docs)
    assert len(val) == 8
    report = shard_corpus("default", trained, tmp_path)
    assert (report.train_docs, report.val_docs) == (len(train), len(val))
    corpus = load_shard_corpus(str(tmp_path / "*.bin"), trained)
    assert (corpus.val_tokens == 1).sum() == len(val)  # one BOS per document
    assert corpus.val_tokens[0] == 1 and corpus.train_tokens[0] == 1


@pytest.mark.parametrize("docs", [["only one document here"], ["a b c", "d e f", "g h i"]])
def test_small_document_lists_split_like_the_text_loader(docs):
    train, val = split_document_list(docs)
    assert ("\n\n".join(train), "\n\n".join(val)) == data.split_documents(docs)


def test_shard_corpus_no_clobber_and_force_removes_stale(tmp_path, trained):
    first = shard_corpus((TRAIN_DOCS, VAL_DOCS), trained, tmp_path, shard_tokens=8)
    assert len(first.train_files) > 2
    with pytest.raises(OutputExistsError, match="--force"):
        shard_corpus((TRAIN_DOCS, VAL_DOCS), trained, tmp_path)
    shard_corpus((TRAIN_DOCS, VAL_DOCS), trained, tmp_path, force=True)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["fineweb_train_000000.bin", "fineweb_val_000000.bin"]


def test_shard_corpus_byte_tokenizer(tmp_path):
    report = shard_corpus((TRAIN_DOCS, VAL_DOCS), "byte", tmp_path)
    corpus = load_shard_corpus(str(tmp_path / "*.bin"))
    assert corpus.val_tokens.size == report.val_tokens == sum(len(d) for d in VAL_DOCS)


# ---------------------------------------------------------------- CLI


def test_cli_shard(tmp_path, trained):
    out = tmp_path / "shards"
    args = ["shard", "--data", "default", "--tokenizer", str(trained), "--out", str(out)]
    runner = CliRunner()
    result = runner.invoke(main, args + ["--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [Path(p).name for p in report["val_files"]] == ["fineweb_val_000000.bin"]
    assert read_shard(out / "fineweb_train_000000.bin").size == report["train_tokens"]
    assert read_shard(out / "fineweb_val_000000.bin").size == report["val_tokens"]

    again = runner.invoke(main, args)
    assert again.exit_code == 2
    assert "--force" in again.output

    forced = runner.invoke(main, args + ["--force", "--shard-tokens", "50000"])
    assert forced.exit_code == 0, forced.output
    assert "train shard(s)" in forced.output
    assert len(list(out.glob("fineweb_train_*.bin"))) > 1


def test_cli_shard_missing_tokenizer(tmp_path):
    missing = tmp_path / "missing.model"
    result = CliRunner().invoke(main, ["shard", "--tokenizer", str(missing), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "missing.model" in result.output
