"""The codec race: every shortcut in options.Gates, on small stand-ins for the cases it was measured
on, skips work and keeps an artifact no larger than the full race's (the gate off, by options)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields, replace

import numpy as np
import pytest
import torch

from recurnorm import quant
from recurnorm.budget import codecs, compress, pack_qtensors, spec
from recurnorm.budget.options import Gates, PackOptions
from recurnorm.errors import QuantError

ZSTD = ("rans", "zstd", "raw")


def _golf_like(fmt: str, rows: int = 256, cols: int = 512, seed: int = 0) -> dict:
    """A trained-like matrix (heavy tails, row and column scales), as benchmarks/pack.py's golf-shaped
    cases, through one quantizer."""
    rng = np.random.default_rng(seed)
    w = rng.standard_t(5, (rows, cols)) * np.exp(rng.normal(0, 0.3, (rows, 1))) * np.exp(rng.normal(0, 0.5, (1, cols)))
    return {"w": quant.get(fmt).quantize(torch.from_numpy(w.astype(np.float32)), name="w")}


def _related_rows(rows: int = 4096, cols: int = 64, seed: int = 0) -> dict:
    """A token-embedding-like int8 matrix: a quarter stems, the rest a stem's multiple plus noise."""
    rng = np.random.default_rng(seed)
    stems = rng.standard_normal((rows // 4, cols))
    words = stems[rng.integers(0, len(stems), rows - len(stems))] * rng.uniform(0.5, 1.5, (rows - len(stems), 1))
    w = np.concatenate([stems, words + 0.2 * rng.standard_normal(words.shape)]).astype(np.float32)
    return {"emb": quant.get("int8").quantize(torch.from_numpy(w), name="emb")}


# gate -> (stand-in, codecs): the cases each gate was measured on, small.
CASES = {
    "float_probe": (_golf_like("bf16", 512), None),
    "codes_norep": (_golf_like("int8"), None),
    "lzma_race": (_golf_like("int8"), None),
    "zstd_slow_race": (_golf_like("int8"), ZSTD),
    "fields_tail": (_golf_like("bf16", 512), None),
    "parents_lzma": (_related_rows(8192), None),
    "parents_sample": (_related_rows(), None),
}


# What a gate may cost in bytes where the full race finds smaller, as measured (benchmarks/gates.py):
# lzma_race 0.04% on golf-shaped int8, whose stand-in here finds the same share.
COST = {"lzma_race": 0.001}


GATES = sorted(g.name for g in fields(Gates))


def _pack(qts, names, monkeypatch, options=None) -> tuple[bytes, int]:
    """The artifact, and the bytes laid out for, or handed to, deflate, lzma and zstd-19."""
    work = []
    with monkeypatch.context() as m:
        for mod, fn in ((compress, "deflate"), (codecs, "layout_bytes")):
            m.setattr(mod, fn, lambda x, *a, real=getattr(mod, fn): work.append(np.asarray(x).nbytes) or real(x, *a))
        m.setattr(
            compress,
            "compress",
            lambda kind, raw, *a, real=compress.compress: work.append(len(raw)) or real(kind, raw, *a),
        )
        return pack_qtensors(qts, codecs=names, options=options), sum(work)


def test_every_gate_has_a_stand_in():
    assert sorted(CASES) == GATES


@pytest.mark.parametrize("gate", GATES)
def test_gate_skips_work_and_keeps_the_full_race_s_bytes(gate, monkeypatch):
    qts, names = CASES[gate]
    gated, work = _pack(qts, names, monkeypatch)
    off = PackOptions(gates=replace(Gates(), **{gate: None}))
    full, full_work = _pack(qts, names, monkeypatch, off)
    assert work < full_work  # the gate is exercised
    assert len(gated) <= len(full) * (1 + COST.get(gate, 0))


def test_packs_with_other_options_at_once_each_write_their_own_bytes():
    """Options travel with each pack, not in module state: packs in threads with different
    options give what each gives alone, and the string effort is its PackOptions."""
    qts = {**_related_rows(2048), **_golf_like("bf16", 256)}
    variants = [
        PackOptions(),
        PackOptions.for_effort("max"),
        PackOptions(parents_search_rows=1 << 20),  # (no tensor searched)
        PackOptions(fields_side_compressors=spec.PORTABLE),
    ]
    alone = [pack_qtensors(qts, options=o) for o in variants]
    assert len(set(alone)) == len(variants)  # (each variant writes other bytes)
    assert alone[0] == pack_qtensors(qts) and alone[1] == pack_qtensors(qts, effort="max")
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda o: pack_qtensors(qts, options=o), variants * 2))
    assert together == alone * 2
    with pytest.raises(QuantError, match="not both"):
        pack_qtensors(qts, effort="max", options=PackOptions())
    with pytest.raises(AttributeError):  # (frozen: a variant is a replace, never an edit)
        PackOptions().parents_smooth = 1.0
