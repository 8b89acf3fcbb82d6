"""The fields coding of float words: bit-exact round trips (library, standalone loader, numpy
reference coder) and refusal of malformed streams."""

from __future__ import annotations

import hostile_corpus as hc
import numpy as np
import pytest
import torch
from helpers import standalone_loader

from recurnorm import quant
from recurnorm.budget import codecs, compress, kernel, rans, rnpk_load, spec
from recurnorm.budget.api import pack_qtensors, read_artifact, unpack, verify_bytes
from recurnorm.budget.codecs import StreamContext
from recurnorm.budget.options import PackOptions
from recurnorm.errors import ArtifactError

WORDS = {"bf16": (np.uint16, 7), "fp16": (np.uint16, 10), "fp32": (np.uint32, 23)}


def _round_trip(words: np.ndarray, fmt: str, tensor_shape=None) -> tuple[bytes, dict]:
    dt = np.dtype(WORDS[fmt][0]).name
    arr = words.reshape(1, -1)
    shape = tensor_shape or (words.size,)
    ctx = StreamContext("codes", dt, arr.shape, shape, mant=WORDS[fmt][1])
    data, params = codecs.Fields().encode(arr, ctx)
    out = codecs.Fields().decode(data, params, StreamContext("codes", dt, arr.shape, shape))
    assert out.dtype == arr.dtype and out.shape == arr.shape
    assert out.tobytes() == arr.tobytes()
    return data, params


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_every_16_bit_pattern_round_trips(fmt):
    """NaNs, infinities, denormals, -0.0: every word, in order and shuffled."""
    words = np.arange(1 << 16, dtype=np.uint16)
    _round_trip(words, fmt)
    _round_trip(np.random.default_rng(0).permutation(words), fmt, (256, 256))


def _specials(fmt: str) -> np.ndarray:
    f = {"bf16": np.float32, "fp16": np.float16, "fp32": np.float32}[fmt]
    vals = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -2.5, 1e-45, -1e-42, 6e-8, 65504.0], dtype=f)
    bits = vals.view(np.uint16 if f == np.float16 else np.uint32)
    return (bits >> 16).astype(np.uint16) if fmt == "bf16" else bits


@pytest.mark.parametrize("fmt", sorted(WORDS))
def test_random_structured_and_special_words_round_trip(fmt):
    rng = np.random.default_rng(1)
    dt, _ = WORDS[fmt]
    w = rng.standard_normal((96, 200)) * np.exp(rng.normal(0, 1, (96, 1))) * 0.02
    w[5] = 0  # a zero row, a row at bf16 precision: structure the coding sees
    f32 = w.astype(np.float32)
    f32[7] = (f32[7].view(np.uint32) & 0xFFFF0000).view(np.float32)
    words = {
        "bf16": (f32.view(np.uint32) >> 16).astype(np.uint16),
        "fp16": w.astype(np.float16).view(np.uint16),
        "fp32": f32.view(np.uint32),
    }[fmt]
    _, params = _round_trip(words.ravel(), fmt, (96, 200))
    assert params["mant"] == WORDS[fmt][1] and 0 <= params["hi"] <= codecs.HI_MAX
    _round_trip(rng.integers(0, np.iinfo(dt).max, 5000, dtype=dt, endpoint=True), fmt)  # uniform bits
    _round_trip(_specials(fmt), fmt)
    _round_trip(_specials(fmt)[:1], fmt)  # one word
    _round_trip(np.zeros(1000, dt), fmt)  # all zero: exponent 0 only


def test_a_float_head_s_tables_and_class_ids_are_lzma_d_only_at_effort_max(monkeypatch):
    """lzma-9e costs ~0.1 ms a blob and saves hundredths of a percent on float heads (codecs.py):
    at effort normal, that is."""
    kinds = []
    real = compress.compress
    monkeypatch.setattr(compress, "compress", lambda kind, raw, *a: kinds.append(kind) or real(kind, raw, *a))
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((256, 256)) * np.exp(rng.normal(0, 1.5, (256, 1)))).astype(np.float32)
    data, params = _round_trip((w.view(np.uint32) >> 16).astype(np.uint16).ravel(), "bf16", (256, 256))
    assert params["k"] > 1 and spec.DEFLATE in kinds and spec.LZMA not in kinds
    assert spec.LZMA not in [z for _, z in rans.side_header(data[params["tail"] :], 2)[:2]]
    kinds.clear()  # (effort max: lzma races there too, as everywhere)
    arr = (w.view(np.uint32) >> 16).astype(np.uint16).reshape(1, -1)
    codecs.Fields().encode(
        arr, StreamContext("codes", "uint16", arr.shape, w.shape, options=PackOptions.for_effort("max"), mant=7)
    )
    assert spec.LZMA in kinds
    codes = np.repeat(np.arange(64, dtype=np.int8), 512).reshape(1, -1)
    codecs.Rans().encode(codes, StreamContext("codes", "int8", codes.shape, (codes.size,)))
    assert spec.LZMA in kinds  # (quantized codes' side data still races lzma)


def test_fields_beats_the_byte_race_on_trained_like_bf16():
    rng = np.random.default_rng(2)
    w = torch.from_numpy(rng.standard_normal((256, 512)).astype(np.float32) * 0.02)
    qt = quant.get("bf16").quantize(w.bfloat16(), name="w")
    fields = len(pack_qtensors({"w": qt}))
    other = len(pack_qtensors({"w": qt}, codecs=("deflate", "lzma", "raw")))
    assert fields < 0.97 * other
    assert read_artifact(pack_qtensors({"w": qt})).manifest["tensors"][0]["streams"]["codes"]["codec"] == "fields"


def test_the_numpy_reference_coder_writes_the_same_bytes(monkeypatch):
    words = (np.random.default_rng(3).standard_normal(20000).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    compiled = _round_trip(words, "bf16", (100, 200))
    monkeypatch.setattr(kernel, "c", None)
    monkeypatch.setattr(rans, "_FALLBACK_NOTE_UNITS", 1 << 62)
    assert _round_trip(words, "bf16", (100, 200)) == compiled


@pytest.mark.parametrize("fmt", sorted(WORDS))
def test_the_kernel_and_numpy_split_and_join_words_alike(fmt, monkeypatch):
    """Every head width, lengths off a multiple of 8, and the two refusals, both ways."""
    dt, m = WORDS[fmt]
    rng = np.random.default_rng(5)
    for n in (0, 1, 7, 8, 9, 1001, 9001):  # (9001: past the kernel's blocks of 4096 words)
        w = rng.integers(0, np.iinfo(dt).max, n, dtype=dt, endpoint=True)
        odd = np.frombuffer(b"\0" + w.tobytes(), dt, offset=1)  # unaligned words: the kernel reads bytes
        assert [bytes(x) for x in codecs.split_words(odd, m, 2)] == [bytes(x) for x in codecs.split_words(w, m, 2)]
        for h in range(codecs.HI_MAX + 1):
            got = []
            for compiled in (kernel._built, None):
                monkeypatch.setattr(kernel, "c", compiled)
                head, tail = codecs.split_words(w, m, h)
                assert codecs.join_words(head, tail, m, h, w.itemsize).tobytes() == w.tobytes()
                bad_pad = bytearray(tail)
                if n % 8:
                    bad_pad[-1] |= 1  # a bit past the last word in the sign's plane
                    with pytest.raises(ValueError, match="padding"):
                        codecs.join_words(head, bytes(bad_pad), m, h, w.itemsize)
                if n:
                    wide = head.copy()
                    wide[-1] = 1 << (8 * w.itemsize - 1 - m + h)  # reaches the sign bit
                    with pytest.raises(ValueError, match="exponent out of range"):
                        codecs.join_words(wide, tail, m, h, w.itemsize)
                got.append((head.tobytes(), bytes(tail)))
            assert got[0] == got[1]


def _state() -> dict[str, tuple[str, torch.Tensor]]:
    rng = np.random.default_rng(4)
    w = torch.from_numpy(rng.standard_normal((64, 300)).astype(np.float32) * 0.05)
    w[0, :4] = torch.tensor([0.0, -0.0, 1e-40, -1e-39])
    return {
        "a.bf16": ("bf16", w.bfloat16()),
        "b.fp32": ("fp32", w.clone()),
        "c.fp16": ("fp16", w.half()),
        "d.one": ("fp32", torch.tensor([1.5])),
        "e.empty": ("bf16", torch.zeros(0, 4, dtype=torch.bfloat16)),
        "f.int8": ("int8", w.clone()),
    }


@pytest.mark.parametrize("compact", [False, True])
def test_library_and_standalone_loader_read_the_same_bits(compact):
    qts = {k: quant.get(f).quantize(v, name=k) for k, (f, v) in _state().items()}
    data = pack_qtensors(qts)
    used = {t["name"]: t["streams"]["codes"]["codec"] for t in read_artifact(data).manifest["tensors"]}
    assert {used[k] for k in ("a.bf16", "b.fp32", "c.fp16")} == {"fields"}
    assert verify_bytes(data).ok
    got, _ = standalone_loader(compact)["decode"](data)
    ref = unpack(data)
    for name, t in ref.items():
        bits = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        assert got[name].shape == tuple(t.shape) and got[name].tobytes() == bits.numpy().tobytes(), name
    for name, (_, v) in _state().items():  # passthrough: the very bits went in
        if name != "f.int8":
            assert torch.equal(ref[name].view(torch.uint8), v.view(torch.uint8)), name


def test_a_tail_deflates_only_the_chunks_that_repeat_and_every_reader_inflates_it(monkeypatch):
    """fp32 rows cast from bf16 (low mantissa bytes all zero) in the first chunk of each byte
    plane: those chunks are deflated, the random ones stored, in one raw deflate stream."""
    rng = np.random.default_rng(5)
    w = torch.from_numpy(rng.standard_normal((256, 512)).astype(np.float32) * 0.05)
    w[:32] = w[:32].bfloat16().float()
    levels = []
    real = compress.deflate
    monkeypatch.setattr(compress, "deflate", lambda raw, lv=9: levels.append(lv) or real(raw, lv))
    data = pack_qtensors({"w": quant.get("fp32").quantize(w, name="w")})
    params = read_artifact(data).manifest["tensors"][0]["streams"]["codes"]["params"]
    levels = [lv for lv in levels if isinstance(lv, list)]
    assert params["tz"] == spec.DEFLATE and 0 < sum(levels[0]) < len(levels[0])
    assert torch.equal(unpack(data)["w"], w)
    for compact in (False, True):
        assert standalone_loader(compact)["decode"](data)[0]["w"].tobytes() == w.numpy().tobytes()
    raw = bytes(70000) + rng.bytes(70000)  # (and where a deflated chunk would not be smaller: stored)
    for lv in ([0, 0, 0], [1, 1, 1], [9, 0, 1]):
        assert compress.decompress(spec.DEFLATE, real(raw, lv), len(raw), "t") == raw


@pytest.mark.parametrize("name", sorted(n for n in hc.R2_CASES if n.startswith("fields/")))
def test_malformed_fields_streams_are_refused_by_the_library_and_the_loader(name):
    data = hc.R2_CASES[name]()
    report = verify_bytes(data)
    assert not report.ok and report.exit_code == 4 and report.reason
    with pytest.raises(ArtifactError):
        unpack(data)
    if name in hc.LOADER_MAY_READ:
        return
    with pytest.raises(rnpk_load.RnpkError):
        rnpk_load.decode(data)


def test_the_loader_profile_reads_fields_params():
    from recurnorm.budget import format as fmt
    from recurnorm.budget.loader import loader_problem

    data = hc._fields_base()
    assert loader_problem(data, fmt.split_container(data)[0]) is None
    zstd = hc.FIELDS_CASES["fields/tail-zstd"]()
    assert "zstd-compressed fields tail" in loader_problem(zstd, fmt.split_container(zstd)[0])
