"""Test data and snippets shared by several test modules (and by the children they start).

Test modules import from here, never from each other: a test file stays free to change
its own private helpers.
"""

from __future__ import annotations

import textwrap

import numpy as np
import zstandard

from recurnorm.budget import pack_qtensors
from recurnorm.quant.qtensor import QTensor

# Imports of these raise inside the loader's process: it must not need them.
IMPORT_BLOCKER = textwrap.dedent("""
    import sys
    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("recurnorm", "zstandard", "constriction"):
                raise ImportError("blocked: " + name)
    sys.meta_path.insert(0, Blocker())
""")


def magicless_zstd(raw: bytes) -> bytes:
    """A zstd-19 frame without its magic number or content size: how format 1 stored rans side
    data (the library reads it still, and writes it no more)."""
    params = zstandard.ZstdCompressionParameters.from_level(
        19, format=zstandard.FORMAT_ZSTD1_MAGICLESS, write_content_size=False
    )
    return zstandard.ZstdCompressor(compression_params=params).compress(raw)


def write_safetensors(f, tensors: dict) -> None:
    """A whole state dict written as `recurnorm unpack` writes it (safetensors_out.write_each)."""
    from recurnorm.budget import safetensors_out

    specs = {n: (t.dtype, list(t.shape)) for n, t in tensors.items()}
    safetensors_out.write_each(f, specs, (([n], t) for n, t in tensors.items()))


def embedding_like(seed=10, rows=256, cols=128):
    """Ternary codes whose columns lean to one sign and whose rows differ in spread (a trained
    byte embedding looks so): row classes and column classes each pay, and together more."""
    rng = np.random.default_rng(seed)
    lean = np.where(rng.random(cols) < 0.5, 0.8, -0.8)
    spread = np.where(rng.random(rows) < 0.3, 0.4, 2.0)
    w = rng.normal(size=(rows, cols)) * spread[:, None] + lean[None, :] * spread[:, None]
    return np.clip(np.round(w / np.abs(w).mean()), -1, 1).astype(np.int8)


def joint_like(seed=20, rows=2048, cols=256, row_classes=8, col_signs=4, col_dens=4, structure=True):
    """Ternary codes with joint row x column structure (as a real token embedding measures):
    rows differ in spread (row_classes levels), columns lean to one sign (col_signs levels)
    and differ in density (col_dens levels). structure=False: the same marginal, iid."""
    rng = np.random.default_rng(seed)
    spread = np.geomspace(0.3, 3.0, row_classes)[rng.integers(0, row_classes, rows)]
    lean = np.linspace(-1.2, 1.2, col_signs)[rng.integers(0, col_signs, cols)]
    dens = np.geomspace(0.4, 2.5, col_dens)[rng.integers(0, col_dens, cols)]
    w = (rng.normal(size=(rows, cols)) + lean[None, :]) * spread[:, None] * dens[None, :]
    if not structure:
        w = rng.permutation(w.ravel()).reshape(rows, cols)
    return np.clip(np.round(w / np.abs(w).mean()), -1, 1).astype(np.int8)


def sample_qtensors(seed: int = 0) -> dict[str, QTensor]:
    """One QTensor of every kind the container stores: int8/int4/ternary codes, raw ints and
    bools, fp16/bf16 bits, uint64 extremes and an empty tensor."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(64, 96))
    s = np.abs(w).max(1) / 127
    g = rng.normal(size=(48, 64))
    gs = np.abs(g).max(1) / 7
    return {
        "int8 per-row": QTensor(
            "int8", (64, 96), "float32", np.round(w / s[:, None]).astype(np.int8), s.astype(np.float16), None, {}
        ),
        "int4.group": QTensor(
            "int4",
            (3072,),
            "bfloat16",
            np.clip(np.round(g / gs[:, None]), -7, 7).astype(np.int8),
            gs.astype(np.float32),
            rng.normal(size=48).astype(np.float32),
            {"group": 64},
        ),
        "ternary ∆": QTensor(
            "ternary",
            (50, 41),
            "float16",
            rng.choice([-1, 0, 1], size=(1, 2050)).astype(np.int8),
            np.array([0.1], np.float32),
        ),
        "buf.int64": QTensor("raw", (7,), "int64", np.array([[0, -5, 2**40, 3, 3, 3, 1]], np.int64)),
        "mask": QTensor("raw", (2, 3), "bool", np.array([[1, 0, 1, 1, 1, 0]], np.bool_)),
        "fp16": QTensor("fp16", (5,), "float16", rng.normal(size=(1, 5)).astype(np.float16).view(np.uint16)),
        "bf16": QTensor("bf16", (3,), "bfloat16", np.array([[0x3F80, 0x4000, 0xBF80]], np.uint16)),
        "u64": QTensor("raw", (2,), "uint64", np.array([[2**64 - 1, 0]], np.uint64)),
        "empty": QTensor("fp32", (0, 4), "float32", np.zeros((1, 0), np.uint32)),
    }


def fuzz_base_artifact() -> bytes:
    """The artifact test_fuzz_artifact mutates: int4, ternary (one with a grid context), raw."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(64, 128))
    s = np.abs(w).max(1) / 7
    return pack_qtensors(
        {
            "w": QTensor("int4", (64, 128), "float32", np.round(w / s[:, None]).astype(np.int8), s.astype(np.float16)),
            "t": QTensor(
                "ternary",
                (40, 100),
                "float32",
                rng.integers(-1, 2, size=(1, 4000)).astype(np.int8),
                np.array([0.5], np.float32),
            ),
            "b": QTensor("raw", (9,), "int64", np.arange(9, dtype=np.int64).reshape(1, 9)),
            "e": QTensor(
                "ternary",
                (256, 128),
                "float32",
                embedding_like().reshape(1, -1),  # a grid context
                np.array([0.5], np.float32),
            ),
        },
        {"config": {"d": 1}},
    )


def standalone_loader(compact: bool) -> dict:
    """The standalone loader's functions (decode, load, ...): rnpk_load.py as it is, or the
    compact form `recurnorm wrap --loader` ships, run from its source."""
    from recurnorm.budget import rnpk_load
    from recurnorm.budget.loader import compact_loader

    if not compact:
        return vars(rnpk_load)
    space: dict = {}
    exec(compile(compact_loader(), "rnpk_load.py", "exec"), space)  # noqa: S102 - our own generated code
    return space
