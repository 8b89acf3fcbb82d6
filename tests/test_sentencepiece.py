"""SentencePiece wrapper and the Parameter Golf byte accounting (bits per byte)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from recurnorm.errors import DataError
from recurnorm.train.data import default_documents
from recurnorm.train.sentencepiece import SentencePieceTokenizer, train_sentencepiece

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times; it was the age of wisdom.",
    "Shared depth models apply one block many times, and norms tell the steps apart.",
    "A",
    "x = 3 + 4 * (y - 2), print(x) # done!",
]
UNICODE = [
    "naïve café — déjà vu: 日本語のテキスト 🙂 and Ελληνικά",
    "tabs\tand\nnewlines  and   runs of spaces",
    "\u2581 literal lower-one-eighth block ▁▁ and <s> text",
]


def reference_bytes(sp: spm.SentencePieceProcessor, ids: list[int]) -> list[int]:
    """The challenge's accounting, written out token by token (no lookup tables)."""

    def boundary(t: int) -> bool:
        return sp.is_control(t) or sp.is_unknown(t) or sp.is_unused(t)

    out = []
    for i, t in enumerate(ids):
        if boundary(t):
            out.append(0)
        elif sp.is_byte(t):
            out.append(1)
        else:
            piece = sp.id_to_piece(t)
            if piece.startswith("▁"):
                after_boundary = i == 0 or boundary(ids[i - 1])
                out.append(len(piece[1:].encode("utf-8")) + (0 if after_boundary else 1))
            else:
                out.append(len(piece.encode("utf-8")))
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sp")
    return train_sentencepiece(default_documents(), out / "pydoc512", vocab_size=512)


@pytest.fixture(scope="module")
def real(sp8192_model) -> Path:
    return sp8192_model


@pytest.fixture(params=["trained", "real"])
def model(request) -> Path:
    return request.getfixturevalue(request.param)


def test_missing_model_names_file(tmp_path):
    path = tmp_path / "nope.model"
    with pytest.raises(DataError, match="nope.model"):
        SentencePieceTokenizer(path)


def test_garbage_model_names_file(tmp_path):
    path = tmp_path / "garbage.model"
    path.write_bytes(b"this is not a protobuf \x00\xff" * 10)
    with pytest.raises(DataError, match="garbage.model"):
        SentencePieceTokenizer(path)


def test_real_model_ids(real):
    tok = SentencePieceTokenizer(real)
    assert tok.vocab_size == 8192
    assert tok.bos_id == 1 and tok.eos_id == 2
    assert tok.token_bytes([0, 1, 2, 3]).tolist() == [0, 0, 0, 0]  # pad, bos, eos, unk
    assert tok.is_boundary[:4].all() and not tok.is_boundary[4:].any()


def test_trained_model_layout_and_determinism(trained, tmp_path):
    tok = SentencePieceTokenizer(trained)
    assert tok.vocab_size == 512
    assert (tok.bos_id, tok.eos_id, tok.sp.unk_id(), tok.sp.pad_id()) == (1, 2, 3, 0)
    assert sum(tok.sp.is_byte(i) for i in range(tok.vocab_size)) == 256
    again = train_sentencepiece(default_documents(), tmp_path / "again", vocab_size=512)
    assert again.with_suffix(".vocab").read_bytes() == trained.with_suffix(".vocab").read_bytes()
    with pytest.raises(FileExistsError):
        train_sentencepiece(["text"], tmp_path / "again", vocab_size=512)


@pytest.mark.parametrize("text", PROSE + UNICODE)
def test_encode_decode_roundtrip(model, text):
    tok = SentencePieceTokenizer(model)
    ids = tok.encode(text)
    # the normalizer collapses whitespace runs and newlines; check single-spaced text exactly
    if not any(s in text for s in ("  ", "\n", "\t", "\u2581")) and not text.startswith(" "):
        assert tok.decode(ids) == text


def test_token_bytes_matches_reference_on_documents(model):
    tok = SentencePieceTokenizer(model)
    docs = default_documents()[::7] + PROSE + UNICODE
    ids: list[int] = []
    for doc in docs:  # as in the shards: each document starts with BOS
        ids += [tok.bos_id] + tok.encode(doc)
    got = tok.token_bytes(np.array(ids, dtype=np.uint16))
    assert got.dtype == np.int64
    assert got.tolist() == reference_bytes(tok.sp, ids)
    # without the leading BOS the first token follows the start of the stream
    assert tok.token_bytes(ids[1:]).tolist() == reference_bytes(tok.sp, ids[1:])


def test_token_bytes_matches_reference_on_random_ids(model):
    tok = SentencePieceTokenizer(model)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, tok.vocab_size, size=5000)
    ids[::13] = tok.bos_id  # many boundaries
    ids[5::17] = tok.sp.unk_id()
    assert tok.token_bytes(ids).tolist() == reference_bytes(tok.sp, ids.tolist())


@pytest.mark.parametrize("text", PROSE)
def test_single_spaced_prose_counts_its_utf8_bytes(model, text):
    tok = SentencePieceTokenizer(model)
    ids = tok.encode(text)
    n = len(text.encode("utf-8"))
    assert int(tok.token_bytes([tok.bos_id] + ids).sum()) == n
    assert int(tok.token_bytes(ids).sum()) == n
    # after a non-boundary token the leading space of the first word is a real byte
    word = tok.encode("word")
    assert int(tok.token_bytes(word + ids).sum()) == len(("word " + text).encode()) - (
        0 if tok.sp.id_to_piece(ids[0]).startswith("▁") else 1
    )


def test_leading_space_rule_is_exercised(trained):
    # the trained model adds SentencePiece's dummy prefix: "▁The" after BOS is 3 bytes, not 4
    tok = SentencePieceTokenizer(trained)
    ids = tok.encode("The cat")
    assert tok.sp.id_to_piece(ids[0]).startswith("▁")
    assert tok.token_bytes([tok.bos_id] + ids).tolist()[1] == len(tok.sp.id_to_piece(ids[0])[1:])
    assert tok.token_bytes(ids, prev=ids[-1])[0] == tok.token_bytes(ids)[0] + 1


def test_multibyte_text_counts_via_byte_fallback(real):
    tok = SentencePieceTokenizer(real)
    text = "café 日本 🙂"
    ids = [tok.bos_id] + tok.encode(text)
    assert any(tok.sp.is_byte(i) for i in ids)
    assert int(tok.token_bytes(ids).sum()) == len(text.encode("utf-8"))


def test_token_bytes_rejects_bad_ids(trained):
    tok = SentencePieceTokenizer(trained)
    with pytest.raises(DataError, match="512"):
        tok.token_bytes([1, 512])
    with pytest.raises(DataError, match="-1"):
        tok.token_bytes(np.array([-1, 4]))
    with pytest.raises(DataError):
        tok.token_bytes(np.zeros((2, 2), dtype=np.int64))
    assert tok.token_bytes([]).size == 0
