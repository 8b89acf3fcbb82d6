"""A corpus of hostile artifacts, crafted as an attacker would from docs/FORMAT.md.

Every case is re-signed (header and payload hashes recomputed), so it reaches the
validation pass and the codecs: bombs (small files declaring huge tensors), mistyped
fields, self/forward aliases, out-of-range codes, missing scales, zero dimensions, huge
class ids. Each must be refused with exit 4 and one line, in bounded memory and time.

    python tests/hostile_corpus.py OUT_DIR   # writes one .rnpk per case
"""

from __future__ import annotations

import copy
import functools
import json
import os
import resource
import signal
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recurnorm.budget import compress, pack_qtensors, rans, spec
from recurnorm.budget import format as fmt
from recurnorm.quant.qtensor import QTensor


def base_qtensors() -> dict[str, QTensor]:
    """One tensor per format family the reader must know (built by hand: no bitsandbytes)."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(64, 128))
    s = np.abs(w).max(1) / 7
    return {
        "int4": QTensor("int4", (64, 128), "float32", np.round(w / s[:, None]).astype(np.int8), s.astype(np.float16)),
        "ternary": QTensor(
            "ternary",
            (40, 100),
            "float32",
            rng.integers(-1, 2, size=(1, 4000)).astype(np.int8),
            np.array([0.5], np.float32),
        ),
        "nf4": QTensor(
            "nf4",
            (8, 64),
            "bfloat16",
            rng.integers(0, 16, size=(8, 64)).astype(np.uint8),
            rng.random(8).astype(np.float32),
            params={"group": 64},
        ),
        "int8": QTensor(
            "int8",
            (16, 32),
            "float32",
            rng.integers(-127, 128, size=(16, 32)).astype(np.int8),
            rng.random(16).astype(np.float16),
        ),
        "fp16": QTensor("fp16", (4, 5), "float16", rng.normal(size=(1, 20)).astype(np.float16).view(np.uint16)),
        "bf16": QTensor("bf16", (3,), "bfloat16", np.array([[0x3F80, 0x4000, 0xBF80]], np.uint16)),
        "raw": QTensor("raw", (9,), "int64", np.arange(9, dtype=np.int64).reshape(1, 9)),
        "mask": QTensor("raw", (2, 3), "bool", np.array([[1, 0, 1, 1, 1, 0]], np.bool_)),
    }


def base() -> bytes:
    qts = base_qtensors()
    qts["tied"] = qts["int8"]
    return pack_qtensors(qts, {"config": {"d_model": 8}})


def resign(manifest: dict, payload: bytes) -> bytes:
    """What a forger can do: any manifest and payload, every hash recomputed."""
    return fmt.write_container(manifest, payload)


def _entry(m: dict, name: str) -> dict:
    return next(t for t in m["tensors"] if t["name"] == name)


def _rans_body(prec: int, lanes: int, table: list[int]) -> bytes:
    """A compact rans stream body whose states never renormalize: a one-symbol table codes
    any number of units in no words (the decode-bomb shape)."""
    tblob = rans.varint_encode(np.array(table))
    return rans.varint_encode(np.array([4 * len(tblob), 0])) + tblob + struct.pack(f"<{lanes}I", *([1 << 16] * lanes))


def _bomb(shape: list[int], dtype: str, lanes: int = 4096, fmt_name: str = "int8", valid: bool = False) -> bytes:
    """One tensor of shape, output dtype, whose codes are a 16 KB one-symbol rans stream
    (valid: with the true checksums, so that it decodes)."""
    body = _rans_body(1, lanes, [2])
    numel = int(np.prod(shape))
    m = {
        "format": "rnpk",
        "version": spec.VERSION,
        "metadata": {},
        "tensors": [
            {
                "name": "bomb",
                "shape": shape,
                "dtype": dtype,
                "format": fmt_name,
                "params": {},
                "streams": {
                    "codes": {
                        "codec": "rans",
                        "params": {"offset": 0, "nsym": 1, "prec": 1, "lanes": lanes},
                        "offset": 0,
                        "length": len(body),
                        "dtype": "int8",
                        "shape": [1, numel],
                        "sha256": "0" * 64,
                    },
                    "scales": {
                        "codec": "raw",
                        "params": {},
                        "offset": len(body),
                        "length": 2,
                        "dtype": "float16",
                        "shape": [1],
                        "sha256": "0" * 64,
                    },
                },
            }
        ],
    }
    if fmt_name == "raw":
        del m["tensors"][0]["streams"]["scales"]
    if valid:  # the true hashes: all codes 0, one scale of 1.0 (a big but honest artifact)
        import hashlib

        h, zeros = hashlib.sha256(), bytes(1 << 20)
        for start in range(0, numel, len(zeros)):
            h.update(zeros[: min(len(zeros), numel - start)])
        streams = m["tensors"][0]["streams"]
        streams["codes"]["sha256"] = h.hexdigest()
        if "scales" in streams:
            streams["scales"]["sha256"] = hashlib.sha256(b"\x00\x3c").hexdigest()
    return resign(m, body + b"\x00\x3c")


def _sign_fast(text: bytes, payload: bytes = b"") -> bytes:
    """Manifest JSON bytes and payload signed, the manifest at a quick deflate level (big
    manifests at the writer's level take seconds; readers take any)."""

    from recurnorm.budget import compress

    z = compress.deflate(text, 1)
    return fmt.container(z, payload, spec.DEFLATE)


def _manifest_bomb(count: int) -> bytes:
    """A zstd manifest that decompresses to `count` empty JSON objects (~21 bytes of Python
    each once parsed)."""
    return _sign_fast(b'{"format":"rnpk","metadata":{"x":[' + b",".join([b"{}"] * count) + b']},"tensors":[]}')


def _many_aliases(count: int) -> bytes:
    """The base artifact plus `count` aliases of one tensor (~40 bytes of manifest each)."""
    import hashlib

    m, payload = fmt.split_container(BASE)
    m["tensors"] += [{"name": f"a{i:07d}", "alias_of": "int8"} for i in range(count)]
    m["payload_sha256"] = hashlib.sha256(payload).hexdigest()
    return _sign_fast(fmt.dumps(m), payload)


def _packed(qts: dict[str, QTensor]) -> bytes:
    return pack_qtensors(qts, check=False)  # forged: the packer would refuse them


def _one(name: str, **change) -> bytes:
    """The base tensor `name` alone with fields replaced (the packer does not judge them)."""
    qt = base_qtensors()[name]
    fields = {k: getattr(qt, k) for k in ("format", "shape", "dtype", "codes", "scales", "zeros", "params")}
    fields.update(change)
    return _packed({name: QTensor(**fields)})


def _edit(fn: Callable[[dict], object], base: Callable[[], bytes] = lambda: BASE) -> Callable[[], bytes]:
    """A case: the base artifact's manifest changed in place by fn, re-signed (the header's
    field flags follow the manifest)."""

    def make() -> bytes:
        m, payload = fmt.split_container(base())
        m = copy.deepcopy(m)
        fn(m)
        return resign(m, payload)

    return make


def _set(path: tuple, value) -> Callable[[dict], None]:
    """Replace manifest[path...] (first item a tensor name, then keys)."""

    def fn(m: dict) -> None:
        obj = _entry(m, path[0])
        for key in path[1:-1]:
            obj = obj[key]
        obj[path[-1]] = value

    return fn


# (field path, what it normally is): each is replaced by every value of WRONG_TYPES.
TYPED_FIELDS = [
    ("int4", "name"),
    ("int4", "shape"),
    ("int4", "dtype"),
    ("int4", "format"),
    ("int4", "params"),
    ("int4", "streams"),
    ("tied", "alias_of"),
    ("int4", "streams", "codes", "codec"),
    ("int4", "streams", "codes", "params"),
    ("int4", "streams", "codes", "offset"),
    ("int4", "streams", "codes", "length"),
    ("int4", "streams", "codes", "dtype"),
    ("int4", "streams", "codes", "shape"),
    ("int4", "streams", "codes", "sha256"),
    ("int4", "streams", "scales", "dtype"),
    ("int4", "streams", "codes", "params", "context"),
    ("int4", "streams", "codes", "params", "nsym"),
    ("int4", "streams", "codes", "params", "offset"),
    ("int4", "streams", "codes", "params", "prec"),
    ("int4", "streams", "codes", "params", "lanes"),
    ("int4", "streams", "codes", "params", "k"),
    ("int4", "streams", "codes", "params", "tuple"),
    ("int4", "params", "group"),
]
WRONG_TYPES = {
    "list": ["x"],
    "dict": {"a": 1},
    "string": "x",
    "float": 1.5,
    "negative": -1,
    "null": None,
    "bool": True,
    "huge": 2**70,
}


def _zstd_codes(m: dict, name: str, layout: str) -> None:
    s = _entry(m, name)["streams"]["codes"]
    s["codec"], s["params"] = "zstd", {"layout": layout, "offset": 0}


def _class_context(variant: str, shape: list[int], codes_shape: list[int]) -> Callable[[dict], None]:
    def fn(m: dict) -> None:
        t = _entry(m, "ternary")
        t["shape"] = shape
        s = t["streams"]["codes"]
        s["shape"] = codes_shape
        s["params"].update(context=variant, k=4)
        if variant == "grid":
            s["params"]["kc"] = 2
        t["streams"]["scales"]["shape"] = codes_shape[:1]

    return fn


def _int4_params(**change) -> Callable[[dict], None]:
    def fn(m: dict) -> None:
        _entry(m, "int4")["streams"]["codes"]["params"].update(change)

    return fn


def _aliases(count: int) -> Callable[[dict], None]:
    def fn(m: dict) -> None:
        m["tensors"] += [{"name": f"a{i:07d}", "alias_of": "int8"} for i in range(count)]

    return fn


def _move_alias_first(m: dict) -> None:
    alias = _entry(m, "tied")
    m["tensors"].remove(alias)
    m["tensors"].insert(0, alias)


CASES: dict[str, Callable[[], bytes]] = {
    # bombs: a few KB declaring GBs
    "bomb/rans-one-symbol-4096-lanes-float64": lambda: _bomb([1 << 14, (1 << 14) - 1], "float64"),
    "bomb/rans-one-symbol-float32-2^28": lambda: _bomb([1 << 14, 1 << 14], "float32"),
    "bomb/rans-one-symbol-raw-int64": lambda: _bomb([1 << 28], "int64", fmt_name="raw"),
    "bomb/int8-declares-float64-2^28": _edit(
        lambda m: (_set(("int8", "dtype"), "float64")(m), _set(("int8", "shape"), [1 << 14, (1 << 14) - 1])(m))
    ),
    "bomb/2^20-aliases": lambda: _many_aliases(1 << 20),
    "bomb/2^16-aliases": lambda: _many_aliases(1 << 16),
    "bomb/two-aliases-of-one": _edit(_aliases(9)),
    "bomb/manifest-64MiB-of-empty-objects": lambda: _manifest_bomb(22 << 20),
    "bomb/excess-padding": _edit(_set(("raw", "streams", "codes", "shape"), [1 << 14, 1 << 14])),
    "bomb/zero-width-rows": _edit(
        lambda m: (_set(("raw", "shape"), [0])(m), _set(("raw", "streams", "codes", "shape"), [1 << 39, 0])(m))
    ),
    # aliases
    "alias/self": _edit(lambda m: m["tensors"].append({"name": "me", "alias_of": "me"})),
    "alias/forward": _edit(_move_alias_first),
    "alias/chain": _edit(lambda m: m["tensors"].append({"name": "chain", "alias_of": "tied"})),
    "alias/missing": _edit(lambda m: m["tensors"].append({"name": "x", "alias_of": "nothing"})),
    "alias/extra-key": _edit(_set(("tied", "shape"), [1])),
    # what each quantizer needs
    "codes/nf4-16": lambda: _one("nf4", codes=np.full((8, 64), 16, np.uint8)),
    "codes/nf4-negative": lambda: _one("nf4", codes=np.full((8, 64), -1, np.int8)),
    "codes/int4-8": lambda: _one("int4", codes=np.full((64, 128), 8, np.int8)),
    "codes/int8-minus-128": lambda: _one("int8", codes=np.full((16, 32), -128, np.int8)),
    "codes/ternary-2": lambda: _one("ternary", codes=np.full((1, 4000), 2, np.int8)),
    "codes/raw-bool-2": lambda: _one("mask", codes=np.array([[2, 0, 1, 1, 1, 0]], np.uint8)),
    "codes/raw-int8-300": lambda: _one("raw", dtype="int8", codes=np.full((1, 9), 300, np.int16)),
    "codes/int4-float-codes": lambda: _one("int4", codes=np.zeros((64, 128), np.float32)),
    "codes/fp16-as-uint8": lambda: _one("fp16", codes=np.zeros((1, 20), np.uint8)),
    "codes/fp16-as-bool": lambda: _one("fp16", codes=np.zeros((1, 20), np.bool_)),
    "codes/bf16-as-uint32": lambda: _one("bf16", codes=np.zeros((1, 3), np.uint32)),
    "codes/fp16-inf": lambda: _one("fp16", codes=np.full((1, 20), 0x7C00, np.uint16)),
    "codes/bf16-nan": lambda: _one("bf16", codes=np.full((1, 3), 0x7FC0, np.uint16)),
    "codes/one-dimensional": _edit(_set(("raw", "streams", "codes", "shape"), [9])),
    "scales/int8-missing": lambda: _one("int8", scales=None),
    "scales/ternary-missing": lambda: _one("ternary", scales=None),
    "scales/nf4-missing": lambda: _one("nf4", scales=None),
    "scales/nan": lambda: _one("int8", scales=np.full(16, np.nan, np.float16)),
    "scales/inf": lambda: _one("nf4", scales=np.full(8, np.inf, np.float32)),
    "scales/integers": lambda: _one("int8", scales=np.ones(16, np.int16)),
    "scales/on-fp16": lambda: _one("fp16", scales=np.ones(1, np.float16)),
    "zeros/on-nf4": lambda: _one("nf4", zeros=np.ones(8, np.float32)),
    "zeros/nan": lambda: _one(
        "int8", params={"asymmetric": True}, codes=np.zeros((16, 32), np.uint8), zeros=np.full(16, np.nan, np.float16)
    ),
    "scales/wrong-length": _edit(_set(("int4", "streams", "scales", "shape"), [63])),
    "format/unknown": _edit(_set(("int4", "format"), "int99")),
    "format/unknown-option": _edit(_set(("int4", "params"), {"bits": 4})),
    "format/nf4-bad-group": _edit(_set(("nf4", "params"), {"group": 7})),
    "dtype/complex64": _edit(_set(("int4", "dtype"), "complex64")),
    "dtype/float8": _edit(_set(("int4", "dtype"), "float8_e4m3fn")),
    "dtype/stream-complex": _edit(_set(("int4", "streams", "codes", "dtype"), "complex128")),
    # codec parameters
    "zstd/layout-list": _edit(
        lambda m: (_zstd_codes(m, "raw", "plain"), _set(("raw", "streams", "codes", "params", "layout"), ["nib4"])(m))
    ),
    "zstd/packed-layout-float-dtype": _edit(
        lambda m: (_zstd_codes(m, "fp16", "nib4"), _set(("fp16", "streams", "codes", "dtype"), "float16")(m))
    ),
    "zstd/packed-layout-float-scales": _edit(
        lambda m: _entry(m, "int4")["streams"]["scales"].update(codec="zstd", params={"layout": "nib4", "offset": 0})
    ),
    "zstd/offset-float": _edit(
        lambda m: (_zstd_codes(m, "raw", "nib4"), _set(("raw", "streams", "codes", "params", "offset"), 0.5)(m))
    ),
    "rans/context-list": _edit(_set(("int4", "streams", "codes", "params", "context"), ["row"])),
    "rans/context-dict": _edit(_set(("int4", "streams", "codes", "params", "context"), {"row": 1})),
    "rans/grid-without-kc": _edit(_set(("int4", "streams", "codes", "params", "context"), "grid")),
    "rans/row-zero-dim": _edit(_class_context("row", [0, 4000], [1, 4000])),
    "rans/col-zero-dim": _edit(_class_context("col", [4000, 0], [1, 4000])),
    "rans/grid-zero-dim": _edit(_class_context("grid", [0, 0, 5], [1, 4000])),
    "rans/row-huge-dims": _edit(_class_context("row", [1 << 39, 0], [1, 4000])),
    "rans/grid-huge-dims": _edit(_class_context("grid", [1 << 39, 1 << 39, 0], [1, 4000])),
    "rans/col-huge-class-ids": _edit(_class_context("col", [1, 1 << 38], [1 << 19, 1 << 19])),
    "rans/one-dimensional-class-context": _edit(_class_context("row", [4000], [1, 4000])),
    # block contexts: rb only with block, >= 1, ids of ceil(rows / rb) x cols, bounded
    "rans/block-without-rb": _edit(_int4_params(context="block")),
    "rans/block-rb-0": _edit(_int4_params(context="block", rb=0)),
    "rans/block-huge-rb": _edit(_int4_params(context="block", rb=1 << 40)),
    "rans/block-rb-float": _edit(_int4_params(context="block", rb=1.0)),
    "rans/block-rb-with-grid": _edit(_int4_params(context="grid", k=4, kc=2, rb=8)),
    "rans/block-without-ids": _edit(_int4_params(context="block", rb=8)),
    # map contexts: kr (1-256) only with map, ids of rows + kr x cols
    "rans/map-without-kr": _edit(_int4_params(context="map", k=4)),
    "rans/map-kr-0": _edit(_int4_params(context="map", k=4, kr=0)),
    "rans/map-kr-257": _edit(_int4_params(context="map", k=4, kr=257)),
    "rans/map-kr-with-rb": _edit(_int4_params(context="map", k=4, kr=2, rb=8)),
    "rans/map-without-ids": _edit(_int4_params(context="map", k=4, kr=2)),
    "rans/map-zero-dim": _edit(
        lambda m: (
            _class_context("map", [0, 4000], [1, 4000])(m),
            _entry(m, "ternary")["streams"]["codes"]["params"].update(kr=2),
        )
    ),
}


def _lqer_base() -> bytes:
    """w (int4) with an LQER correction: factors w.lqer_l [2, 64] and w.lqer_r [2, 128] before it."""
    base = base_qtensors()["int4"]
    rng = np.random.default_rng(5)
    left = QTensor("int8", (2, 64), "float32", rng.integers(-9, 9, (2, 64)).astype(np.int8), np.ones(2, np.float16))
    right = QTensor("int8", (2, 128), "float32", rng.integers(-9, 9, (2, 128)).astype(np.int8), np.ones(2, np.float16))
    base.lowrank = (left, right)
    return pack_qtensors({"w": base, "v": base_qtensors()["ternary"]})


def _lqer(fn: Callable[[dict], object]) -> Callable[[], bytes]:
    """A case: the LQER base manifest changed by fn."""
    return _edit(fn, _lqer_base)


def _lqer_unflagged() -> bytes:
    """The LQER base with its header flag cleared: a reader that would ignore the correction."""

    data = _lqer_base()
    m, payload = fmt.split_container(data)
    raw = fmt.dumps(m)
    return fmt.container(raw, payload)


def _swap_factors(m: dict) -> None:
    t = m["tensors"]
    t[1], t[2] = t[2], t[1]  # v sorts first: [v, w.lqer_l, w.lqer_r, w]


LQER_CASES: dict[str, Callable[[], bytes]] = {
    "lqer/flag-cleared": _lqer_unflagged,
    "lqer/names-reversed": _lqer(_set(("w", "lowrank"), ["w.lqer_r", "w.lqer_l"])),
    "lqer/entries-swapped": _lqer(_swap_factors),
    "lqer/one-name": _lqer(_set(("w", "lowrank"), ["w.lqer_r"])),
    "lqer/missing-name": _lqer(_set(("w", "lowrank"), ["w.lqer_l", "nothing"])),
    "lqer/not-a-list": _lqer(_set(("w", "lowrank"), "w.lqer_l")),
    "lqer/wrong-rank-shape": _lqer(_set(("w.lqer_r", "shape"), [3, 128])),
    "lqer/on-the-wrong-tensor": _lqer(lambda m: _entry(m, "v").update(lowrank=["w.lqer_l", "w.lqer_r"])),
    "lqer/factor-float16": _lqer(_set(("w.lqer_l", "dtype"), "float16")),
    "lqer/alias-of-a-factor": _lqer(lambda m: m["tensors"].append({"name": "x", "alias_of": "w.lqer_l"})),
}
CASES.update(LQER_CASES)


def _parents_base() -> bytes:
    """An int8 random walk down its rows: packed with parents, each row from the one above."""
    walk = np.cumsum(np.random.default_rng(6).integers(-3, 4, size=(32, 16)), axis=0).clip(-127, 127)
    return pack_qtensors({"w": QTensor("int8", (32, 16), "float32", walk.astype(np.int8), np.ones(32, np.float16))})


def _parents(forged: np.ndarray | None = None, edit: Callable[[dict], object] | None = None) -> Callable[[], bytes]:
    """A case: the parents base whose parents stream holds `forged` (stored raw, hash and all),
    or whose manifest `edit` changes."""

    def make() -> bytes:
        import hashlib

        m, payload = fmt.split_container(_parents_base())
        assert "parents" in _entry(m, "w")["streams"]
        if forged is not None:
            raw = np.ascontiguousarray(forged, "<i4").tobytes()
            s = _entry(m, "w")["streams"]["parents"]
            s.update(codec="raw", params={}, offset=len(payload), length=len(raw), shape=list(forged.shape))
            s.update(dtype="int32", sha256=hashlib.sha256(raw).hexdigest())
            payload += raw
        if edit is not None:
            edit(m)
        return resign(m, payload)

    return make


def _forged_parents(row: int, d: int, k: int = 32) -> np.ndarray:
    p = np.zeros((32, 2), np.int32)
    p[1:] = (1, 32)
    p[row] = (d, k)
    return p


PARENTS_CASES: dict[str, Callable[[], bytes]] = {
    "parents/reaching-forward": _parents(_forged_parents(3, 5)),  # row 3 from row -2
    "parents/negative-distance": _parents(_forged_parents(3, -1)),
    "parents/multiplier-65": _parents(_forged_parents(3, 1, 65)),
    "parents/multiplier-minus-2^31": _parents(_forged_parents(3, 1, -(1 << 31))),
    "parents/one-row-short": _parents(np.zeros((31, 2), np.int32)),
    "parents/three-columns": _parents(np.zeros((32, 3), np.int32)),
    "parents/float": _parents(edit=_set(("w", "streams", "parents", "dtype"), "float32")),
    "parents/beside-int16-codes": _parents(edit=_set(("w", "streams", "codes", "dtype"), "int16")),
    "parents/one-dimensional-tensor": _parents(edit=_set(("w", "shape"), [512])),
    "parents/stream-kind-typo": _parents(edit=lambda m: _entry(m, "w")["streams"].update(parent={})),
}
CASES.update(PARENTS_CASES)

for _path in TYPED_FIELDS:
    for _label, _value in WRONG_TYPES.items():
        if (_path[-1] == "name" and _label == "string") or (_path[-1] == "group" and _label in ("null", "huge")):
            continue  # valid values: any string names a tensor, group None/any size dequantizes
        CASES[f"typed/{'.'.join(_path)}={_label}"] = _edit(_set(_path, _value))

# ------------------------------------------------------------------ round two (issue 25)
#
# Artifacts that verify used to accept although what unpack writes cannot be read back, or
# the weights are not finite, or the standalone loader reads them differently; artifacts that
# made the loader allocate before checking; leniencies. Every one is refused (exit 4, one
# line) by verify and unpack; the loader raises RnpkError (a ValueError) or, where noted in
# LOADER_READS, reads them. VALID holds odd artifacts the packer writes: all three read them,
# to the same bits.


def _json_signed(m: dict, payload: bytes, version: int = spec.VERSION) -> bytes:
    """m as ASCII JSON (lone surrogates as \\\\uXXXX escapes, which UTF-8 cannot hold), signed."""
    import hashlib
    import json

    m = {**m, "payload_length": len(payload), "payload_sha256": hashlib.sha256(payload).hexdigest()}
    text = json.dumps(m, sort_keys=True, separators=(",", ":")).encode()
    return fmt.container(text, payload, 0, version)


def _renamed(name: str) -> Callable[[], bytes]:
    def make() -> bytes:
        m, payload = fmt.split_container(BASE)
        _entry(m, "int8")["name"] = name
        _entry(m, "tied")["alias_of"] = name
        return _json_signed(m, payload)

    return make


def _alias_named(name: str) -> Callable[[], bytes]:
    def make() -> bytes:
        m, payload = fmt.split_container(BASE)
        _entry(m, "tied")["name"] = name
        return _json_signed(m, payload)

    return make


def _versioned(header: int, value) -> Callable[[], bytes]:
    def make() -> bytes:
        m, payload = fmt.split_container(BASE)
        m["version"] = value
        return _json_signed(m, payload, version=header)

    return make


def _with_payload(m: dict, payload: bytes) -> bytes:
    """m and payload, signed (header version 2, raw manifest)."""
    return _json_signed(m, payload)


def _overflow(**fields) -> Callable[[], bytes]:
    """One tensor whose stored values are finite but dequantize past its dtype's range."""
    return lambda: _packed({"w": QTensor(**fields)})


def _int8_overflow(dtype: str, code: int, scales: np.ndarray, zeros: np.ndarray | None = None) -> Callable[[], bytes]:
    """int8 codes [4, 8] all `code` (asymmetric when zeros are given) under these scales."""
    codes = np.full((4, 8), code, np.uint8 if zeros is not None else np.int8)
    params = {"asymmetric": True} if zeros is not None else {}
    return _overflow(format="int8", shape=(4, 8), dtype=dtype, codes=codes, scales=scales, zeros=zeros, params=params)


def _many_tables(count: int) -> bytes:
    """`count` one-code tensors, each a rans stream with 256 tables of 4096 symbols (deflated
    zeros but one row): ~200 bytes a stream, 2^20 table entries decoded."""
    import hashlib

    tables = np.zeros((256, 4096), np.int64)
    tables[0, 0] = 2
    tblob = compress.deflate(rans.varint_encode(tables.ravel()))
    body = (
        rans.varint_encode(np.array([4 * len(tblob) + spec.DEFLATE, 0]))
        + tblob
        + struct.pack("<I", 1 << 16)
        + struct.pack("<H", 0)
    )
    sha = hashlib.sha256(b"\x00").hexdigest()
    entries = []
    for i in range(count):
        codes = {"codec": "rans", "dtype": "uint8", "shape": [1, 1], "offset": i * len(body), "length": len(body)}
        codes["params"], codes["sha256"] = {"offset": 0, "nsym": 4096, "prec": 1, "lanes": 1, "k": 256}, sha
        codes["params"]["context"] = "scale"
        entries.append({"name": f"t{i:05d}", "shape": [1], "dtype": "float32", "format": "int8", "params": {}})
        entries[-1]["streams"] = {
            "codes": codes,
            "scales": {"codec": "raw", "dtype": "float16", "shape": [1], "offset": count * len(body), "length": 2},
        }
        entries[-1]["streams"]["scales"].update(params={}, sha256=hashlib.sha256(b"\x00\x3c").hexdigest())
    m = {"format": "rnpk", "version": spec.VERSION, "metadata": {}, "tensors": entries}
    return resign(m, body * count + b"\x00\x3c")


def _deflate_bomb(declared: list[int]) -> bytes:
    """A raw int8 tensor declaring `declared` values (GBs), whose deflate stream is 64 MB of
    zeros in 64 KB: refused from the declared size, before anything is inflated."""
    z = compress.deflate(bytes(64 << 20), 9)
    n = int(np.prod(declared))
    stream = {"codec": "deflate", "params": {"layout": "plain", "offset": 0}, "offset": 0, "length": len(z)}
    stream.update(dtype="int8", shape=[1, n], sha256="0" * 64)
    t = {"name": "w", "shape": declared, "dtype": "int8", "format": "raw", "params": {}, "streams": {"codes": stream}}
    return resign({"format": "rnpk", "version": spec.VERSION, "metadata": {}, "tensors": [t]}, z)


def _steps_before_arrays() -> bytes:
    """2^27 codes in one lane: 2^27 steps (readers stop at 2^16), 512 MB decoded (under the
    limit): the step count must be refused before any per-code array is made."""
    return _bomb([1 << 13, 1 << 14], "float32", lanes=1, valid=True)


def _garbage_side(kind: int) -> Callable[[], bytes]:
    """The int4 codes' rans table blob replaced by garbage declared as deflate or lzma."""

    def make() -> bytes:
        m, payload = fmt.split_container(BASE)
        s = _entry(m, "int4")["streams"]["codes"]
        body = bytes(payload[s["offset"] : s["offset"] + s["length"]])
        (tl, _), (il, iz), pos = rans.side_header(body, 2)
        junk = b"\xff\x00garbage" * 4
        new = rans.varint_encode(np.array([4 * len(junk) + kind, 4 * il + iz])) + junk + body[pos + tl :]
        payload = payload[: s["offset"]] + new + payload[s["offset"] + s["length"] :]
        delta = len(new) - s["length"]
        for t in m["tensors"]:
            for other in t.get("streams", {}).values():
                if other["offset"] > s["offset"]:
                    other["offset"] += delta
        s["length"] = len(new)
        return resign(m, payload)

    return make


def _deep_manifest(depth: int) -> bytes:
    m, payload = fmt.split_container(BASE)
    text = fmt.dumps(m)
    assert text.startswith(b'{"format"')
    text = b'{"deep":' + b"[" * depth + b"]" * depth + b"," + text[1:]
    return _sign_fast(text, payload)


R2_CASES: dict[str, Callable[[], bytes]] = {
    # 1. names the .safetensors unpack writes cannot hold
    "r2-names/__metadata__": _renamed("__metadata__"),
    "r2-names/alias-__metadata__": _alias_named("__metadata__"),
    "r2-names/lone-surrogate": _renamed("\ud800"),
    "r2-names/lone-low-surrogate-inside": _renamed("a\udfffb"),
    # 2. finite scales and zeros whose products overflow the output dtype
    "r2-overflow/float64-scale-1e300-into-bf16": _int8_overflow("bfloat16", 1, np.full(4, 1e300)),
    "r2-overflow/float32-3e38-x-127": _int8_overflow("float32", 127, np.full(4, 3e38, np.float32)),
    "r2-overflow/zeros-1e300": _int8_overflow("float32", 1, np.ones(4, np.float32), zeros=np.full(4, 1e300)),
    "r2-overflow/float16-scale-600-x-127-into-float16": _int8_overflow("float16", 127, np.full(4, 600, np.float16)),
    "r2-overflow/fp32-1e10-as-float16": _overflow(
        format="fp32", shape=(3,), dtype="float16", codes=np.array([[1e10, 1, 2]], np.float32).view(np.uint32)
    ),
    "r2-overflow/bf16-4e37-as-float16": _overflow(
        format="bf16", shape=(1,), dtype="float16", codes=np.array([[0x7E00]], np.uint16)
    ),
    "r2-overflow/nf4-absmax-1e6-into-float16": _overflow(
        format="nf4",
        shape=(64,),
        dtype="float16",
        codes=np.zeros((1, 64), np.uint8),
        scales=np.full(1, 1e6, np.float32),
        params={"group": 64},
    ),
    # 3. what the loader reads differently: see VALID (uint64 offsets past int64)
    # 4. bounds the loader applies before allocating
    "r2-loader/steps-before-arrays-512MB": _steps_before_arrays,
    "r2-loader/deflate-bomb-declares-8GB": lambda: _deflate_bomb([1 << 16, 1 << 15]),
    "r2-loader/64-streams-of-2^20-table-entries": lambda: _many_tables(64),
    "r2-loader/table-blob-bad-deflate": _garbage_side(spec.DEFLATE),
    "r2-loader/table-blob-bad-lzma": _garbage_side(spec.LZMA),
    "r2-loader/manifest-nested-100": lambda: _deep_manifest(100),
    "r2-loader/manifest-nested-5000": lambda: _deep_manifest(5000),
    "r2-loader/manifest-NaN": lambda: _sign_fast(
        fmt.dumps(fmt.split_container(BASE)[0]).replace(b'"metadata":{', b'"metadata":{"x":NaN,'),
        fmt.split_container(BASE)[1],
    ),
    # 7. leniencies
    "r2-lenient/version-true-header-1": _versioned(1, True),
    "r2-lenient/version-2.0": _versioned(2, 2.0),
}


def _fields_base() -> bytes:
    """601 bf16 words (zeros and a denormal among them) coded with fields."""
    w = (np.random.default_rng(7).standard_normal(601) * 0.02).astype(np.float32)
    w[:3] = 0.0, -0.0, 1e-39
    qt = QTensor("bf16", (601,), "bfloat16", (w.view(np.uint32) >> 16).astype(np.uint16).reshape(1, -1))
    return pack_qtensors({"f": qt}, codecs=("fields", "raw"))


def _fields(fn: Callable[[dict, bytes], bytes | None]) -> Callable[[], bytes]:
    """A case: the fields stream's entry (and params) changed by fn(stream, body), which may
    return a new body (the stream's length follows it)."""

    def make() -> bytes:
        m, payload = fmt.split_container(_fields_base())
        s = m["tensors"][0]["streams"]["codes"]
        assert s["codec"] == "fields"
        body = fn(s, payload)
        body = body if isinstance(body, bytes) else payload
        s["length"] = len(body)
        return resign(m, body)

    return make


def _tail(**change) -> Callable[[dict, bytes], None]:
    return lambda s, body: s["params"].update(change)


def _grow_tail(s: dict, body: bytes) -> bytes:
    """One byte more in the tail, declared."""
    t = s["params"]["tail"]
    s["params"]["tail"] = t + 1
    return body[:t] + b"\0" + body[t:]


def _pad_bit(s: dict, body: bytes) -> bytes:
    """A padding bit set in the sign's plane, the tail's last (601 words: 7 padding bits)."""
    b = bytearray(body)
    b[s["params"]["tail"] - 1] |= 1
    return bytes(b)


FIELDS_CASES: dict[str, Callable[[], bytes]] = {
    "fields/truncated": _fields(lambda s, b: b[:-7]),
    "fields/tail-declared-longer": _fields(lambda s, b: s["params"].update(tail=s["params"]["tail"] + 1)),
    "fields/tail-declared-shorter": _fields(lambda s, b: s["params"].update(tail=s["params"]["tail"] - 1)),
    "fields/tail-one-byte-more": _fields(_grow_tail),
    "fields/tail-past-the-end": _fields(_tail(tail=1 << 30)),
    "fields/tail-negative": _fields(_tail(tail=-5)),
    "fields/tail-zstd": _fields(_tail(tz=spec.ZSTD)),
    "fields/tail-bad-deflate": _fields(_tail(tz=spec.DEFLATE)),
    "fields/tail-compressor-7": _fields(_tail(tz=7)),
    "fields/tail-padding-bit": _fields(_pad_bit),
    "fields/stray-offset": _fields(_tail(offset=1)),
    "fields/count-2^24": _fields(lambda s, b: s.update(shape=[1, 1 << 24])),
    "fields/uint8-words": _fields(lambda s, b: s.update(dtype="uint8")),
    "fields/mant-huge": _fields(_tail(mant=1 << 40)),
    "fields/mant-negative": _fields(_tail(mant=-3)),
    "fields/mant-15": _fields(_tail(mant=15)),
    "fields/mant-string": _fields(_tail(mant="7")),
    "fields/hi-over-mant": _fields(_tail(hi=8)),
    "fields/hi-negative": _fields(_tail(hi=-1)),
    "fields/no-rans-params": _fields(lambda s, b: s["params"].pop("nsym")),
    "fields/no-tail": _fields(lambda s, b: s["params"].pop("tail")),
    "fields/lo-past-the-exponent": _fields(_tail(lo=1 << 12)),
}
R2_CASES.update(FIELDS_CASES)


def _stack() -> bytes:
    """A bank [2, 32, 16] of int8 random walks down its stacked rows: packed with a view
    [64, 16] (spec.FIELD_FLAGS) and parents across its 64 rows."""
    walk = np.cumsum(np.random.default_rng(7).integers(-3, 4, size=(64, 16)), axis=0).clip(-127, 127)
    bank = QTensor("int8", (2, 32, 16), "float32", walk.astype(np.int8), np.ones(64, np.float16))
    data = pack_qtensors({"bank": bank})
    entry = _entry(fmt.split_container(data)[0], "bank")
    assert entry["view"] == [64, 16] and "parents" in entry["streams"]  # (what the cases forge)
    return data


def _stack_edit(fn: Callable[[dict], object]) -> Callable[[], bytes]:
    return _edit(fn, _stack)


VIEW_CASES: dict[str, Callable[[], bytes]] = {
    "view/rows-past-the-parents": _stack_edit(_set(("bank", "view"), [128, 8])),
    "view/more-values-than-the-tensor": _stack_edit(_set(("bank", "view"), [1 << 20, 1 << 20])),
    "view/fewer-values-than-the-tensor": _stack_edit(_set(("bank", "view"), [64, 8])),
    "view/three-dims": _stack_edit(_set(("bank", "view"), [2, 32, 16])),
    "view/not-a-list": _stack_edit(_set(("bank", "view"), "64x16")),
    "view/on-a-vector": _stack_edit(lambda m: _entry(m, "bank").update(shape=[1024], view=[64, 16])),
}
R2_CASES.update(VIEW_CASES)
CASES.update(R2_CASES)
# The loader may read these (its checks stop at what decoding needs: it hands back a dict, and
# metadata is the caller's): verify refuses them for what unpack's file or the checks need.
LOADER_MAY_READ = {
    "r2-names/__metadata__",
    "r2-names/alias-__metadata__",
    "r2-names/lone-surrogate",
    "r2-names/lone-low-surrogate-inside",
    "r2-loader/manifest-nested-100",
    "r2-lenient/version-true-header-1",
    "r2-lenient/version-2.0",
    "fields/tail-padding-bit",
    "fields/lo-past-the-exponent",  # (heads past the word wrap out of it: a second spelling)
    "view/fewer-values-than-the-tensor",  # (the loader checks a view where it reads it, in contexts and
    "view/on-a-vector",  # parents: its rows are the parents' here, and its codes have no class context)
}


def _uint64_offset(codec: str) -> bytes:
    """uint64 values from 2^63 + 1: the stream's symbol offset is past int64."""
    rng = np.random.default_rng(5)
    codes = (np.uint64(2**63 + 1) + rng.integers(0, 5, size=(1, 3000)).astype(np.uint64)).astype(np.uint64)
    return pack_qtensors({"big": QTensor("raw", (3000,), "uint64", codes)}, codecs=[codec, "raw"])


def _valid_bomb(dtype: str) -> bytes:
    return _bomb([1 << 11, (1 << 14) - 1], dtype, valid=True)


# Odd artifacts the packer writes (or that are honest): verify 0, unpack 0, and the loader
# returns the same bits, in the same bounds.
VALID: dict[str, Callable[[], bytes]] = {
    "valid/uint64-offset-past-int64-rans": lambda: _uint64_offset("rans"),
    "valid/uint64-offset-past-int64-deflate": lambda: _uint64_offset("deflate"),
    "valid/int64-offset-minus-2^63-rans": lambda: pack_qtensors(
        {"low": QTensor("raw", (50,), "int64", np.full((1, 50), -(2**63), np.int64) + np.arange(50).reshape(1, 50))},
        codecs=["rans", "raw"],
    ),
    "valid/empty-dims": lambda: pack_qtensors(
        {
            "a": QTensor("fp32", (0, 1 << 30), "float32", np.zeros((1, 0), np.uint32)),
            "b": QTensor("int8", (5, 0), "float32", np.zeros((5, 0), np.int8), np.ones(5, np.float16)),
        }
    ),
    "valid/stacked-view": _stack,
    "valid/int8-128MB-decoded-float32": lambda: _valid_bomb("float32"),
    "valid/int8-128MB-decoded-bfloat16": lambda: _valid_bomb("bfloat16"),
}

BASE = base()


@functools.cache
def bases() -> list[bytes]:
    """Artifacts to mutate: every format family, each codec and packed layout, and rans with
    none/col/grid contexts and 1-4 lanes."""
    from helpers import embedding_like

    qts = base_qtensors()
    grid = {
        "e": QTensor("ternary", (256, 128), "float32", embedding_like().reshape(1, -1), np.array([0.5], np.float32))
    }
    # Rows and columns of different spread: the packer picks col and grid contexts, 2-4 lanes.
    rng = np.random.default_rng(1)
    R, C = 256, 512
    w = rng.normal(size=(R, C)) * np.exp(rng.normal(size=(R, 1))) * np.exp(rng.normal(size=(1, C)))
    s = np.abs(w).max(1) / 7
    col = rng.normal(size=(R, C)) * np.exp(2 * rng.normal(size=(1, C)))
    cs = np.abs(col).max() / 7
    tern = (rng.random((1, 1 << 18)) < 0.3).astype(np.int8) * rng.choice([-1, 1], size=(1, 1 << 18)).astype(np.int8)
    contexts = {
        "grid": QTensor(
            "int4", (R, C), "float32", np.clip(np.round(w / s[:, None]), -7, 7).astype(np.int8), s.astype(np.float16)
        ),
        "col": QTensor(
            "int4",
            (R, C),
            "float32",
            np.clip(np.round(col / cs), -7, 7).astype(np.int8).reshape(1, -1),
            np.array([cs], np.float32),
        ),
        "lanes": QTensor("ternary", (512, 512), "float32", tern, np.array([0.1], np.float32)),
    }
    return [
        BASE,
        pack_qtensors(qts, {"config": {}}, codecs=["zstd"]),
        pack_qtensors(qts, codecs=["raw"]),
        pack_qtensors(qts, codecs=["deflate", "raw"]),
        pack_qtensors(grid),
        pack_qtensors(contexts),
        VALID["valid/uint64-offset-past-int64-rans"](),
    ]


def build() -> dict[str, bytes]:
    """Every case's bytes."""
    return {name: make() for name, make in CASES.items()}


def write(out_dir: str | Path) -> list[Path]:
    """One file per case, named after it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in build().items():
        p = out / (name.replace("/", "__").replace("=", "_") + ".rnpk")
        p.write_bytes(data)
        paths.append(p)
    return paths


# ------------------------------------------------------------------ random mutations

_NAMES = [
    "rans",
    "zstd",
    "deflate",
    "lzma",
    "raw",
    "none",
    "scale",
    "row",
    "col",
    "grid",
    "plain",
    "shuffle",
    "trit5",
    "bits2",
    "nib4",
    "pack6",
    "byte",
    "bool",
    "uint8",
    "int8",
    "uint16",
    "int16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "bfloat16",
    "complex64",
    "int2",
    "int4",
    "int8_pg",
    "nf4",
    "ternary",
    "fp16",
    "fp32",
    "bf16",
    "codes",
    "scales",
    "zeros",
    "int4",
    "nf4",
    "tied",
    "",
]
_INTS = [
    0,
    1,
    2,
    3,
    7,
    8,
    15,
    16,
    64,
    127,
    128,
    255,
    256,
    4096,
    4097,
    65536,
    2**16 + 1,
    2**28,
    2**31,
    2**32,
    2**39,
    2**40,
    2**63,
    2**64,
    2**70,
]


def _random_value(rng, depth: int = 0):
    kind = rng.randrange(8 if depth < 2 else 5)
    if kind == 0:
        return rng.choice(_INTS) * rng.choice([1, 1, -1])
    if kind == 1:
        return rng.choice(_NAMES)
    if kind == 2:
        return rng.choice([None, True, False, 0.5, -0.0, 1e308, 3.0])
    if kind == 3:
        return rng.randrange(-300, 5000)
    if kind == 4:
        # (round two: the name safetensors reserves, a lone surrogate, a float NaN)
        return rng.choice(["", "x" * rng.randrange(1, 80), "a\x00b", "é", "__metadata__", "\ud800", float("nan")])
    if kind == 5:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 6:
        return {
            rng.choice(
                _NAMES
                + ["k", "kc", "lanes", "prec", "tuple", "nsym", "offset", "layout", "context", "group", "asymmetric"]
            ): _random_value(rng, depth + 1)
            for _ in range(rng.randrange(4))
        }
    return rng.choice([[], {}, [0], [1, 1], [0, 5], [1 << 20, 1 << 20], [2, 0, 3]])


def _nodes(obj, path=()):
    """(path, value) of every node below the top level of a manifest."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        yield path + (key,), value
        yield from _nodes(value, path + (key,))


def _parent(m, path):
    obj = m
    for key in path[:-1]:
        obj = obj[key]
    return obj


def mutate_manifest(m: dict, rng) -> dict:
    """A copy of manifest m with 1-3 random edits (replace, tweak, delete, insert, swap)."""
    m = copy.deepcopy(m)
    for _ in range(rng.randrange(1, 4)):
        nodes = [p for p, _ in _nodes(m) if p[0] not in ("payload_length", "payload_sha256")]
        if not nodes:
            break
        path = rng.choice(nodes)
        parent, key = _parent(m, path), path[-1]
        value = parent[key]
        op = rng.randrange(6)
        if op == 0:
            parent[key] = _random_value(rng)
        elif op == 1 and isinstance(value, int) and not isinstance(value, bool):
            parent[key] = rng.choice(
                [
                    value + 1,
                    value - 1,
                    value * 2,
                    value // 2,
                    -value,
                    value * 1000,
                    value + (1 << rng.choice([8, 16, 31, 32, 63])),
                ]
            )
        elif op == 2:
            if isinstance(parent, dict) or len(parent) > 1:
                del parent[key]
        elif op == 3 and isinstance(value, dict):
            value[rng.choice(list(value) + ["alias_of", "context", "kc", "tuple", "scales", "zeros", "k", "lanes"])] = (
                _random_value(rng)
            )
        elif op == 4 and isinstance(value, list):
            if value and rng.random() < 0.5:
                value.append(copy.deepcopy(rng.choice(value)))
            else:
                value.insert(rng.randrange(len(value) + 1), _random_value(rng))
        else:  # copy another node of the same kind here (a stream, a params object, a shape)
            same = [p for p, v in _nodes(m) if p[-1] == key and p != path]
            if same:
                parent[key] = copy.deepcopy(_parent(m, (src := rng.choice(same)))[src[-1]])
            else:
                parent[key] = _random_value(rng)
    return m


def mutate_payload(payload: bytes, rng) -> bytes:
    """payload with 1-4 random byte flips, insertions or deletions."""
    data = bytearray(payload)
    for _ in range(rng.randrange(1, 5)):
        pos = rng.randrange(max(len(data), 1))
        op = rng.randrange(4)
        if op < 2 and data:
            data[pos] ^= rng.randrange(1, 256)
        elif op == 2:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 5)))
        elif data:
            del data[pos : pos + rng.randrange(1, 5)]
    return bytes(data)


def mutated(rng, base: bytes | None = None) -> bytes:
    """A re-signed mutation of base: its manifest, its payload, or both."""
    m, payload = fmt.split_container(base or BASE)
    which = rng.randrange(3)
    if which != 1:
        m = mutate_manifest(m, rng)
    if which != 0:
        payload = mutate_payload(payload, rng)
    try:
        return resign(m, payload)
    except (TypeError, ValueError):  # not UTF-8 (a lone surrogate), NaN, too deep: as a forger would
        try:
            return _json_signed(m, payload)
        except (TypeError, ValueError, RecursionError):
            return resign({"format": "rnpk"}, payload)


def unpack_in_memory(data: bytes, max_decoded_bytes: int | None = None) -> dict:
    """What `recurnorm unpack` does, without the files: read, dequantize, serialize."""
    import io
    import json

    from helpers import write_safetensors

    from recurnorm.budget import api
    from recurnorm.quant import dequantize_all

    art = api.read_artifact(data, max_decoded_bytes)
    tensors = dequantize_all(art.qtensors)
    write_safetensors(io.BytesIO(), tensors)
    json.dumps(art.metadata.get("config"))
    return tensors


def unpack_read_back(data: bytes) -> dict:
    """What `recurnorm unpack` writes, read back by the safetensors library (as a user would):
    {name: torch tensor}. Raises whatever that library raises on a file it cannot read."""
    import io

    from helpers import write_safetensors
    from safetensors.torch import load

    buf = io.BytesIO()
    write_safetensors(buf, unpack_in_memory(data))
    return load(buf.getvalue())


def _trim_heap() -> None:
    """Give freed heap back to the OS (glibc), so that a child's allocations show as growth
    rather than reusing pages its parent had already made resident."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _limit_memory(mem_bytes: int) -> None:
    """Let this process's private writable memory grow by at most mem_bytes (RLIMIT_DATA: what
    malloc, numpy and torch take). Not RLIMIT_AS: that also counts the address space threads
    reserve and never touch (64 MB per malloc arena, 8 MB of stack each), so a dozen threads
    of torch's pools and --jobs spent a +1 GiB limit on a 75-tensor toy checkpoint."""
    used = _status_kb("VmData") * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (used + mem_bytes, resource.RLIM_INFINITY))


def run_cli(
    argv: list[str], mem_bytes: int = 1 << 30, alarm_s: int = 10, before: Callable[[], object] | None = None
) -> dict:
    """Run `recurnorm ARGV` in a forked child (this process's imports are reused) whose
    memory may grow by at most mem_bytes (_limit_memory), killed by SIGALRM after alarm_s; `before`
    runs in the child first (a test's patch).

    Returns exit code (or -signal), stdout, stderr, seconds and peak resident growth in bytes
    (the child's VmHWM at exit less its resident size when it started). Linux only."""
    err = tempfile.TemporaryFile()
    out = tempfile.TemporaryFile()
    _trim_heap()
    rss0 = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
    rpipe, wpipe = os.pipe()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: limits, then the CLI exactly as a user runs it
        code = 70
        os.close(rpipe)
        rss_start = _status_kb("VmRSS")
        try:
            os.dup2(err.fileno(), 2)
            os.dup2(out.fileno(), 1)
            # Real files on fds 1 and 2, whatever the parent (pytest) put in sys.stdout/stderr.
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            _limit_memory(mem_bytes)
            signal.alarm(alarm_s)
            from recurnorm.cli.main import main

            if before is not None:
                before()

            try:
                main.main(args=argv, prog_name="recurnorm", standalone_mode=True)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - a traceback would reach stderr: report it
            import traceback

            traceback.print_exc()
            code = 71
        finally:
            sys.stderr.flush()
            sys.stdout.flush()
            os.write(wpipe, f"{rss_start} {_status_kb('VmHWM')}".encode())
            os._exit(code)
    os.close(wpipe)
    _, status, usage = os.wait4(pid, 0)
    seconds = time.perf_counter() - start
    with os.fdopen(rpipe, "rb") as f:
        report = f.read().split()
    code = os.waitstatus_to_exitcode(status)
    err.seek(0)
    text = err.read().decode("utf-8", "replace")
    err.close()
    out.seek(0)
    stdout = out.read().decode("utf-8", "replace")
    out.close()
    if len(report) == 2:
        peak = (int(report[1]) - int(report[0])) * 1024
    else:  # killed: its rusage, against what it could have inherited
        peak = usage.ru_maxrss * 1024 - rss0
    return {"code": code, "stdout": stdout, "stderr": text, "seconds": seconds, "peak_bytes": max(peak, 0)}


def digests(tensors: dict) -> dict[str, list]:
    """{name: [dtype, shape, sha256 of the bits]} of torch tensors (bfloat16 as its int16 bits)."""
    import hashlib

    import torch

    out = {}
    for name, t in tensors.items():
        bits = t.contiguous().view(torch.int16) if t.dtype == torch.bfloat16 else t.contiguous()
        out[name] = [str(t.dtype), list(t.shape), hashlib.sha256(bits.numpy()).hexdigest()]
    return out


def run_loader(path: str | Path, mem_bytes: int = 1 << 30, alarm_s: int = 10, compact: bool = False) -> dict:
    """The standalone loader's `load(path)` in a forked child, bounded like run_cli: whether it
    read the artifact (then the digests of what it returned) or the exception it raised (type,
    whether it is a ValueError, message), seconds, peak resident growth; killed: code -signal."""
    import json

    from helpers import standalone_loader

    load = standalone_loader(compact)["load"]
    _trim_heap()
    rpipe, wpipe = os.pipe()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(rpipe)
        rss_start = _status_kb("VmRSS")
        out: dict = {}
        try:
            _limit_memory(mem_bytes)
            signal.alarm(alarm_s)
            try:
                out = {"ok": True, "digests": digests(load(str(path)))}
            except BaseException as exc:  # noqa: BLE001 - what the caller sees is the point
                msg = str(exc)
                out = {"ok": False, "type": type(exc).__name__, "value_error": isinstance(exc, ValueError)}
                out["error"] = msg[:300]
            out["peak"] = (_status_kb("VmHWM") - rss_start) * 1024
            data = json.dumps(out).encode()
        except BaseException as exc:  # noqa: BLE001
            data = json.dumps({"ok": False, "type": type(exc).__name__, "value_error": False}).encode()
        with os.fdopen(wpipe, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(wpipe)
    with os.fdopen(rpipe, "rb") as f:
        data = f.read()
    _, status, usage = os.wait4(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    res = json.loads(data) if data else {"ok": False, "type": f"killed ({code})", "value_error": False}
    res["code"], res["seconds"] = code, time.perf_counter() - start
    res.setdefault("peak", usage.ru_maxrss * 1024)
    return res


def _status_kb(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


if __name__ == "__main__":
    print(f"{len(write(sys.argv[1] if len(sys.argv) > 1 else 'hostile'))} cases written")


# ------------------------------------------------------------------ round three (issue 43): inputs, not artifacts
#
# Each case builds its files in a folder and names one CLI run: the exit code it must give,
# the files it may write (every other file in the folder must be left as it was: kind,
# bytes, node), and whether it is a refusal (then one error line). Run by run_input_case in
# a forked child bounded like run_cli; tests/test_hostile3.py and benchmarks/fuzz.py run them.

# Every C0 and C1 control, DEL, and the bidi embeddings, overrides and isolates.
CONTROL_CHARS = "".join(
    map(chr, [*range(0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)])
)
HOSTILE_NAME = "\x1b]0;owned\x07\x1b[31mred\r\u202etxt.evil"


@dataclass
class InputCase:
    argv: list[str]
    code: int
    outputs: tuple[str, ...] = ()  # paths (relative to the folder) the run may create or replace
    before: Callable[[], object] | None = None  # runs in the child before the CLI (a patch)


def _ckpt(d: Path, names=("w", "b"), config: dict | None = None, sub: str = "ckpt") -> Path:
    import torch
    from safetensors.torch import save_file

    folder = d / sub
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    save_file({n: torch.randn(8, 8, generator=g) for n in names}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config or {"d_model": 8}))
    return folder


def _artifact(d: Path, names=("w", "b")) -> Path:
    from recurnorm.export.pack import pack_checkpoint
    from recurnorm.export.spec import build_policy

    path = d / "a.rnpk"
    path.write_bytes(pack_checkpoint(_ckpt(d, names, sub="src"), build_policy("int8")).data)
    return path


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _chr(path: Path, minor: int = 3) -> Path:
    """A character device node made here (1,3 is null, 1,5 zero): never the system's /dev/null."""
    import stat

    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    return path


def _torch_save(d: Path, obj, name: str) -> Path:
    import torch

    torch.save(obj, d / name)
    return d / name


def _names_ckpt(d: Path) -> Path:
    return _ckpt(d, [f"w{ch}{i}" for i, ch in enumerate(CONTROL_CHARS)] + [HOSTILE_NAME], {HOSTILE_NAME: 1})


def _names_artifact(d: Path) -> Path:
    return _artifact(d, [f"w{ch}{i}" for i, ch in enumerate(CONTROL_CHARS)] + [HOSTILE_NAME])


def _sigint_in_pack():
    """pack's work gets a real SIGINT (Ctrl-C) halfway."""
    import signal as sig

    from recurnorm.export import ship

    sig.signal(sig.SIGINT, sig.default_int_handler)  # Python's own: KeyboardInterrupt
    real = ship.ship

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), sig.SIGINT)
        time.sleep(5)
        return real(*args, **kwargs)

    ship.ship = interrupted


def _fail_second_part():
    """The second of unpack's two files cannot be written (a full disk, say)."""
    from recurnorm import io

    real = io._write_temp

    def write_temp(path, write):
        if path.name == "config.json":
            raise OSError(28, "No space left on device")
        return real(path, write)

    io._write_temp = write_temp


def _pack_args(d: Path, ckpt: Path, out: str | Path = "o.rnpk", *more: str) -> list[str]:
    return ["pack", str(ckpt), "-o", str(d / out), *more]  # (d / an absolute path: that path)


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _deep_source(d: Path) -> Path:
    (d / "deep.py").write_text("x = " + "+".join(["1"] * 100_000) + "\n")
    return d / "deep.py"


def _big_source(d: Path) -> Path:
    (d / "big.py").write_text("x = 1\n" * 200_000)  # 1.2 MB
    return d / "big.py"


def _many_tensors(d: Path, n: int = 20_000, stem: str = "t") -> Path:
    import torch
    from safetensors.torch import save_file

    save_file({f"{stem}.{i}": torch.ones(4, 4) for i in range(n)}, str(d / "many.safetensors"))
    return d / "many.safetensors"


def _empty_tensors(d: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    save_file({"e": torch.zeros(0, 4), "f": torch.zeros(3, 0)}, str(d / "empty.safetensors"))
    return d / "empty.safetensors"


def _unpack_over_folder(d: Path) -> InputCase:
    art = _artifact(d)
    (d / "u").mkdir()
    (d / "u" / "w.safetensors").write_bytes(b"old weights")
    (d / "u" / "config.json").mkdir()
    return InputCase(["unpack", str(art), "-o", str(d / "u" / "w.safetensors"), "--force"], 2)


def _unpack_second_part_fails(d: Path) -> InputCase:
    art = _artifact(d)
    (d / "u").mkdir()
    (d / "u" / "w.safetensors").write_bytes(b"old weights")
    (d / "u" / "config.json").write_text("{}")
    return InputCase(["unpack", str(art), "-o", str(d / "u" / "w.safetensors"), "--force"], 1, before=_fail_second_part)


def _pack_dot(d: Path) -> InputCase:
    """`pack .` inside a checkpoint folder: the artifact is named after the folder, beside it."""
    ckpt = _ckpt(d)
    return InputCase(["pack", "."], 0, ("ckpt.rnpk",), before=lambda: os.chdir(ckpt))


def _wrap_src(d: Path) -> Path:
    (d / "src.py").write_text("print('hi')\n")
    return d / "src.py"


ROOT = hasattr(os, "geteuid") and os.geteuid() == 0  # device nodes can be made (os.mknod) only as root

R3_CASES: dict[str, Callable[[Path], InputCase]] = {
    # names: every control and bidi character, in tensor names, a config key and an output path
    "names/pack": lambda d: InputCase(
        _pack_args(d, _names_ckpt(d), f"{HOSTILE_NAME}.rnpk"), 0, (f"{HOSTILE_NAME}.rnpk",)
    ),
    "names/pack-over-cap": lambda d: InputCase(_pack_args(d, _names_ckpt(d), "o.rnpk", "--max-bytes", "100"), 3),
    "names/inspect-checkpoint": lambda d: InputCase(["inspect", str(_names_ckpt(d))], 0),
    "names/inspect-artifact": lambda d: InputCase(["inspect", str(_names_artifact(d))], 0),
    "names/verify": lambda d: InputCase(["verify", str(_names_artifact(d))], 0),
    "names/verify-over-cap": lambda d: InputCase(["verify", str(_names_artifact(d)), "--max-bytes", "100"], 3),
    "names/unpack": lambda d: InputCase(
        ["unpack", str(_names_artifact(d)), "-o", str(d / f"{HOSTILE_NAME}.safetensors")],
        0,
        (f"{HOSTILE_NAME}.safetensors", "config.json"),
    ),
    "names/plan-like": lambda d: InputCase(["plan", "--like", str(_names_ckpt(d))], 0),
    # outputs that are not regular files: never replaced, even with --force
    "special-out/pack-o-fifo": lambda d: InputCase(_pack_args(d, _ckpt(d), _fifo(d / "fifo"), "--force"), 2),
    "special-out/pack-o-folder": lambda d: InputCase(_pack_args(d, _ckpt(d), _mkdir(d / "folder"), "--force"), 2),
    "special-out/wrap-o-fifo": lambda d: InputCase(
        ["wrap", str(_wrap_src(d)), "-o", str(_fifo(d / "fifo")), "--force"], 2
    ),
    "special-out/verify-report-link-to-fifo": lambda d: InputCase(
        ["verify", str(_artifact(d)), "--report", str(_link(d / "report.json", _fifo(d / "fifo"))), "--force"], 2
    ),
    "special-out/verify-summary-fifo": lambda d: InputCase(
        ["verify", str(_artifact(d)), "--summary", str(_fifo(d / "summary.md"))], 2
    ),
    # inputs that are not regular files: refused before anything reads them (a FIFO would hang)
    "special-in/checkpoint-fifo": lambda d: InputCase(["pack", str(_fifo(d / "m.safetensors")), "-o", str(d / "o")], 2),
    "special-in/checkpoint-pt-fifo": lambda d: InputCase(["pack", str(_fifo(d / "m.pt")), "-o", str(d / "o")], 2),
    "special-in/config-json-fifo": lambda d: InputCase(_pack_args(d, _with_special_config(d, _fifo)), 2),
    "special-in/policy-fifo": lambda d: InputCase(
        _pack_args(d, _ckpt(d), "o.rnpk", "--policy", str(_fifo(d / "p"))), 2
    ),
    "special-in/wrap-source-fifo": lambda d: InputCase(["wrap", str(_fifo(d / "s.py")), "-o", str(d / "w.py")], 2),
    "special-in/wrap-check-fifo": lambda d: InputCase(
        ["wrap", "--check", str(_fifo(d / "w.py")), str(_wrap_src(d))], 2
    ),
    "special-in/calib-data-fifo": lambda d: InputCase(
        _pack_args(d, _native_ckpt(d), "o.rnpk", "--gptq", "--calib-data", str(_fifo(d / "calib.txt"))), 2
    ),
    # documented limits, checked from the argument or the header before the work they bound
    "limits/20000-tiny-tensors": lambda d: InputCase(_pack_args(d, _many_tensors(d)), 1),
    "limits/long-names-fill-the-manifest": lambda d: InputCase(_pack_args(d, _many_tensors(d, 9_000, "n" * 1000)), 1),
    "limits/wrap-source-over-1MB": lambda d: InputCase(["wrap", str(_big_source(d)), "-o", str(d / "w.py")], 1),
    "limits/roundtrip-threads-10000": lambda d: InputCase(
        ["roundtrip", "--threads", "10000", "--out", str(d / "rt")], 2
    ),
    "limits/roundtrip-jobs-10000": lambda d: InputCase(["roundtrip", "--jobs", "10000", "--out", str(d / "rt")], 2),
    "limits/demo-threads-10000": lambda d: InputCase(["demo", "--threads", "10000", "--out", str(d / "rt")], 2),
    # odd state dicts and paths
    "odd/int-keys": lambda d: InputCase(_pack_args(d, _torch_save(d, {1: _t()}, "k.pt")), 1),
    "odd/mixed-keys": lambda d: InputCase(_pack_args(d, _torch_save(d, {"w": _t(), 3: _t()}, "k.pt")), 1),
    "odd/sparse-coo": lambda d: InputCase(_pack_args(d, _torch_save(d, {"s": _t().to_sparse()}, "k.pt")), 1),
    "odd/sparse-csr": lambda d: InputCase(_pack_args(d, _torch_save(d, {"s": _t().to_sparse_csr()}, "k.pt")), 1),
    "odd/meta": lambda d: InputCase(_pack_args(d, _torch_save(d, {"m": _t().to("meta")}, "k.pt")), 1),
    "odd/plan-like-empty-tensors": lambda d: InputCase(["plan", "--like", str(_empty_tensors(d))], 0),
    "odd/wrap-100000-terms": lambda d: InputCase(["wrap", str(_deep_source(d)), "-o", str(d / "w.py")], 1),
    # multi-file outputs: a failure leaves the old pair
    "writes/unpack-config-json-is-a-folder": _unpack_over_folder,
    "writes/unpack-second-part-fails": _unpack_second_part_fails,
    "odd/pack-dot": _pack_dot,
    # exit codes
    "codes/empty-output-path": lambda d: InputCase(["pack", str(_ckpt(d)), "-o", ""], 2),
    "codes/decode-limit-set-too-small": lambda d: InputCase(
        ["verify", str(_artifact(d)), "--max-decoded-bytes", "10"], 3
    ),
    "codes/sigint": lambda d: InputCase(_pack_args(d, _ckpt(d)), 130, before=_sigint_in_pack),
}
if ROOT:
    R3_CASES.update(
        {
            "special-out/pack-o-char-device": lambda d: InputCase(
                _pack_args(d, _ckpt(d), _chr(d / "null"), "--force"), 2
            ),
            "special-out/unpack-o-char-device": lambda d: InputCase(
                ["unpack", str(_artifact(d)), "-o", str(_chr(d / "null")), "--force"], 2
            ),
            "special-out/loader-o-char-device": lambda d: InputCase(
                ["loader", "-o", str(_chr(d / "null")), "--force"], 2
            ),
            "special-out/verify-report-link-to-char-device": lambda d: InputCase(
                ["verify", str(_artifact(d)), "--report", str(_link(d / "r.json", _chr(d / "null"))), "--force"], 2
            ),
            "special-in/checkpoint-dev-zero": lambda d: InputCase(
                ["pack", str(_chr(d / "m.safetensors", 5)), "-o", str(d / "o")], 2
            ),
            "special-in/config-json-dev-zero": lambda d: InputCase(
                _pack_args(d, _with_special_config(d, lambda p: _chr(p, 5))), 2
            ),
            "special-in/policy-dev-urandom": lambda d: InputCase(
                _pack_args(d, _ckpt(d), "o.rnpk", "--policy", str(_chr(d / "p", 9))), 2
            ),
            "special-in/wrap-source-dev-zero": lambda d: InputCase(
                ["wrap", str(_chr(d / "s.py", 5)), "-o", str(d / "w.py")], 2
            ),
            "special-in/calib-data-dev-zero": lambda d: InputCase(
                _pack_args(d, _native_ckpt(d), "o.rnpk", "--gptq", "--calib-data", str(_chr(d / "calib.txt", 5))), 2
            ),
        }
    )


def _t():
    import torch

    return torch.ones(4, 4)


def _link(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    return link


def _with_special_config(d: Path, make: Callable[[Path], Path]) -> Path:
    ckpt = _ckpt(d)
    (ckpt / "config.json").unlink()
    make(ckpt / "config.json")
    return ckpt


def _native_ckpt(d: Path) -> Path:
    """An untrained recurnorm model: --gptq reads its calibration data."""
    from recurnorm.model import ModelConfig, RecurrentLM, save_checkpoint

    model = RecurrentLM(ModelConfig(d_model=16, n_heads=2, depth=2, seq_len=16, vocab_size=256))
    return save_checkpoint(model, d / "native")


def _snapshot(d: Path) -> dict[str, tuple]:
    """Every entry under d: (kind, size and hash for files, target for links)."""
    import hashlib
    import stat

    out = {}
    for root, dirs, files in os.walk(d):
        for name in dirs + files:
            p = Path(root) / name
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                out[str(p.relative_to(d))] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
            elif stat.S_ISLNK(st.st_mode):
                out[str(p.relative_to(d))] = ("link", os.readlink(p))
            else:
                out[str(p.relative_to(d))] = (stat.S_IFMT(st.st_mode), st.st_rdev)
    return out


def control_chars_in(text: str) -> list[str]:
    """Controls and format characters (bidi) other than the line break: what must never print."""
    import unicodedata

    return sorted({repr(c) for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf")})


def run_input_case(name: str, d: Path, mem_bytes: int = 1 << 30, alarm_s: int = 10) -> dict:
    """Build case `name` in folder d and run it: its exit, whether the error was one line,
    control characters printed, files changed that it was not asked to write, seconds, peak."""
    case = R3_CASES[name](d)
    before = _snapshot(d)
    r = run_cli(case.argv, mem_bytes, alarm_s, case.before)
    after = _snapshot(d)
    allowed = set(case.outputs)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k) and k not in allowed)
    # (click's usage errors: "Usage: ...", "Try ... --help", then the one "Error: ..." line)
    skip = ("note: ", "warning: ", "Usage: ", "Try ")
    errors = [ln for ln in r["stderr"].strip().splitlines() if ln.strip() and not ln.startswith(skip)]
    refusal = case.code != 0 and case.code != 3
    return {
        "case": name,
        "expected": case.code,
        "code": r["code"],
        "one_line": not refusal or (len(errors) == 1 and errors[0].startswith(("error: ", "Error: ", "interrupted"))),
        "traceback": "Traceback" in r["stderr"],
        "controls": control_chars_in(r["stdout"] + r["stderr"]),
        "changed": changed,
        "seconds": r["seconds"],
        "peak": r["peak_bytes"],
        "stderr": r["stderr"][-3000:],
    }
