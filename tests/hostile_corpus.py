"""A corpus of hostile artifacts, crafted as an attacker would from docs/FORMAT.md.

Every case is re-signed (header and payload hashes recomputed), so it reaches the
validation pass and the codecs: bombs (small files declaring huge tensors), mistyped
fields, self/forward aliases, out-of-range codes, missing scales, zero dimensions, huge
class ids. Each must be refused with exit 4 and one line, in bounded memory and time.

    python tests/hostile_corpus.py OUT_DIR   # writes one .rnpk per case
"""

from __future__ import annotations

import copy
import os
import resource
import signal
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from recurnorm.budget import format as fmt
from recurnorm.budget import pack_qtensors, rans
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
        "version": fmt.VERSION,
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
    import hashlib

    from recurnorm.budget import compress

    z = compress.deflate(text, 1)
    return fmt.HEADER.pack(fmt.MAGIC, fmt.VERSION, compress.DEFLATE, len(z), hashlib.sha256(z).digest()) + z + payload


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
    return pack_qtensors(qts)


def _one(name: str, **change) -> bytes:
    """The base tensor `name` alone with fields replaced (the packer does not judge them)."""
    qt = base_qtensors()[name]
    fields = {k: getattr(qt, k) for k in ("format", "shape", "dtype", "codes", "scales", "zeros", "params")}
    fields.update(change)
    return _packed({name: QTensor(**fields)})


def _edit(fn: Callable[[dict], object]) -> Callable[[], bytes]:
    """A case: the base manifest changed in place by fn, re-signed."""

    def make() -> bytes:
        m, payload = fmt.split_container(BASE)
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
}
for _path in TYPED_FIELDS:
    for _label, _value in WRONG_TYPES.items():
        if (_path[-1] == "name" and _label == "string") or (_path[-1] == "group" and _label in ("null", "huge")):
            continue  # valid values: any string names a tensor, group None/any size dequantizes
        CASES[f"typed/{'.'.join(_path)}={_label}"] = _edit(_set(_path, _value))

BASE = base()


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
        return rng.choice(["", "x" * rng.randrange(1, 80), "a\x00b", "é"])
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
    except (TypeError, ValueError):  # a mutation JSON cannot hold (NaN): write it by hand
        return resign({"format": "rnpk"}, payload)


def unpack_in_memory(data: bytes, max_decoded_bytes: int | None = None) -> dict:
    """What `recurnorm unpack` does, without the files: read, dequantize, serialize."""
    import io
    import json

    from recurnorm.budget import api, safetensors_out
    from recurnorm.quant import dequantize_all

    art = api.read_artifact(data, max_decoded_bytes)
    tensors = dequantize_all(art.qtensors)
    safetensors_out.write(io.BytesIO(), tensors)
    json.dumps(art.metadata.get("config"))
    return tensors


def _trim_heap() -> None:
    """Give freed heap back to the OS (glibc), so that a child's allocations show as growth
    rather than reusing pages its parent had already made resident."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def run_cli(argv: list[str], mem_bytes: int = 1 << 30, alarm_s: int = 10) -> dict:
    """Run `recurnorm ARGV` in a forked child (this process's imports are reused) whose
    address space may grow by at most mem_bytes, killed by SIGALRM after alarm_s.

    Returns exit code (or -signal), stderr, seconds and peak resident growth in bytes
    (the child's VmHWM at exit less its resident size when it started). Linux only."""
    err = tempfile.TemporaryFile()
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
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            # Real files on fds 1 and 2, whatever the parent (pytest) put in sys.stdout/stderr.
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
            resource.setrlimit(resource.RLIMIT_AS, (size + mem_bytes, resource.RLIM_INFINITY))
            signal.alarm(alarm_s)
            from recurnorm.cli.main import main

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
    if len(report) == 2:
        peak = (int(report[1]) - int(report[0])) * 1024
    else:  # killed: its rusage, against what it could have inherited
        peak = usage.ru_maxrss * 1024 - rss0
    return {"code": code, "stderr": text, "seconds": seconds, "peak_bytes": max(peak, 0)}


def _status_kb(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


if __name__ == "__main__":
    print(f"{len(write(sys.argv[1] if len(sys.argv) > 1 else 'hostile'))} cases written")
