"""Make the golden artifacts in tests/data/goldens/ and goldens.json beside them.

    python tests/data/make_goldens.py           # writes nothing that exists: --force to remake
    python tests/data/make_goldens.py --check   # exit 1 if today's writer makes other bytes

The goldens are frozen: tests/test_goldens.py reads them with the library and both
standalone loaders and compares the decoded tensors with the sha256 recorded here, and
re-packs each one's decoded codes, which must give the recorded bytes. Remake them only
for a deliberate format change (and say so in the commit): a writer that now makes other
bytes from the same codes is what the test is there to catch.

Each artifact is small (the folder stays under 200 KB) and built to make the writer take
one path: each codec (rans, fields, deflate and lzma in both layouts, raw, zstd),
each rans context (none, scale, row, col, grid, block, map; tuples; more than 64 contexts),
parents streams (each row from the one above, and rows from similar earlier rows at
--effort max) with each of their codecs, LQER factors, tied names, every quantizer. Most are
format 2 (the manifest before the payload), made from what the writer makes now as the
format-2 writer laid it out: format 3 differs only there (a format-3 golden of every quantizer
and one of parents). Two are format 1 (zstd manifest and side data), made from a format-2
one as the old writer laid it out (docs/FORMAT.md, "Version 1").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
OUT = HERE / "goldens"
INDEX = HERE / "goldens.json"
sys.path.insert(0, str(HERE.parent))  # tests/: helpers

from helpers import embedding_like, magicless_zstd  # noqa: E402

from recurnorm import quant  # noqa: E402
from recurnorm.budget import compress, pack_qtensors, read_artifact, spec, unpack  # noqa: E402
from recurnorm.budget import format as fmt  # noqa: E402
from recurnorm.budget.rans import side_header, varint_encode  # noqa: E402
from recurnorm.export.pack import export_qtensors  # noqa: E402
from recurnorm.export.policy import ExportPolicy  # noqa: E402
from recurnorm.quant.qtensor import QTensor  # noqa: E402

# -- inputs -------------------------------------------------------------------------------


def _floats(seed: int = 0) -> dict[str, torch.Tensor]:
    """Float tensors of every dtype, tied weights, integer and bool tensors, smooth rows."""
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(48, 24, generator=g)
    return {
        "embed.weight": emb,
        "head.weight": emb,  # tied: stored once, an alias
        "w32": torch.randn(32, 40, generator=g) * torch.linspace(0.2, 3, 40),
        "w16": torch.randn(17, 21, generator=g).half(),
        "wbf": torch.randn(20, 30, generator=g).bfloat16(),
        "w64": torch.randn(8, 8, generator=g).double(),
        "vec": torch.randn(50, generator=g),
        "ids": torch.arange(120).reshape(3, 40) - 7,
        "mask": torch.rand(37, generator=g) > 0.5,
        "walk": torch.randn(48, 24, generator=g).cumsum(0),  # smooth rows: parents, the row above
    }


def _quantized(fmt_name: str, **opts) -> dict[str, QTensor]:
    policy = ExportPolicy(quantizer=fmt_name, options=opts, keep_float_max_numel=0)
    return export_qtensors(_floats(), fmt_name, policy)


def _every_quantizer() -> dict[str, QTensor]:
    """One tensor per quantizer (and option that changes the stored layout)."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(16, 64, generator=g) * torch.linspace(0.3, 2, 64)
    formats = {
        "int8": {},
        "int7": {},
        "int6_asym": {"asymmetric": True},
        "int5": {},
        "int4_group": {"group": 32},
        "int3": {},
        "int2_asym": {"asymmetric": True},
        "ternary": {},
        "ternary_group": {"group": 32},
        "nf4": {},
        "int8_pg": {},
        "fp16": {},
        "bf16": {},
        "fp32": {},
        "int6_std": {"clip": "std:12.85"},
    }
    out = {}
    for name, opts in formats.items():
        q = name.split("_")[0] if name not in ("int8_pg",) else name
        out[name] = quant.get(q, **opts).quantize(w, name=name)
    return out


def _contexts() -> dict[str, QTensor]:
    """rans contexts: grid (an embedding-like ternary), col and row classes, scale buckets."""
    rng = np.random.default_rng(3)
    emb = embedding_like()
    cols = np.clip(np.round(rng.normal(size=(80, 160)) * np.where(rng.random(160) < 0.3, 0.3, 3)), -7, 7).astype(
        np.int8
    )
    rows = np.clip(np.round(rng.normal(size=(160, 80)) * np.where(rng.random((160, 1)) < 0.3, 0.3, 3)), -7, 7).astype(
        np.int8
    )
    scale = np.exp(rng.normal(0, 1.5, 256)).astype(np.float16)
    by_scale = np.clip(np.round(rng.normal(size=(256, 64)) * scale[:, None].astype(float)), -60, 60)
    return {
        "grid": QTensor("ternary", emb.shape, "float32", emb.reshape(1, -1), np.ones(1, np.float32)),
        "col": QTensor("int4", cols.shape, "float32", cols, np.ones(80, np.float16)),
        "row": QTensor("int4", rows.shape, "float32", rows, np.ones(160, np.float16)),
        "scale": QTensor("int8", (256, 64), "float32", by_scale.astype(np.int8), scale),
    }


def _tuples() -> dict[str, QTensor]:
    """A stream of over 2^20 ternary codes, mostly zero: coded as joint tuples, and small."""
    rng = np.random.default_rng(4)
    codes = (rng.random(1_050_000) < 0.004).astype(np.int8) * rng.choice(np.array([-1, 1], np.int8), 1_050_000)
    return {"sparse": QTensor("ternary", (1000, 1050), "bfloat16", codes.reshape(1, -1), np.ones(1, np.float32))}


def _blocks() -> dict[str, QTensor]:
    """A token embedding whose columns lean by region of rows: block contexts."""
    rng = np.random.default_rng(0)
    lean = np.repeat(rng.normal(0, 0.8, size=(8, 32)), 300, axis=0)[:2100]
    spread = np.exp(np.repeat(rng.normal(0, 0.3, size=(8, 32)), 300, axis=0)[:2100])
    w = torch.from_numpy((lean + spread * rng.standard_t(6, size=(2100, 32))).astype(np.float32))
    return {"emb": quant.get("int2").quantize(w, name="emb")}


def _map() -> dict[str, QTensor]:
    """Rows that come in kinds, each near a column pattern of its own: map contexts."""
    rng = np.random.default_rng(0)
    w = np.exp(rng.normal(0, 0.4, size=(2048, 1))) * rng.normal(size=(2048, 32))
    for kind in range(6):
        w[kind::8] = rng.normal(size=32) + 0.2 * rng.normal(size=(256, 32))
    return {"emb": quant.get("ternary").quantize(torch.from_numpy(w.astype(np.float32)), name="emb")}


def _related() -> dict[str, QTensor]:
    """int8 rows that are multiples of earlier rows plus noise: --effort max finds their parents."""
    g = torch.Generator().manual_seed(5)
    base = torch.randn(24, 32, generator=g)
    w = base[torch.randint(0, 24, (200,), generator=g)] * torch.rand(200, 1, generator=g).add(0.5)
    w = w + 0.2 * torch.randn(200, 32, generator=g)
    return {"related": quant.get("int8").quantize(w, name="related")}


def _walk() -> dict[str, QTensor]:
    """int8 rows each near the one above (a position embedding's random walk)."""
    g = torch.Generator().manual_seed(6)
    return {"walk": quant.get("int8").quantize(torch.randn(64, 32, generator=g).cumsum(0), name="walk")}


def _lqer() -> dict[str, QTensor]:
    policy = ExportPolicy(
        quantizer="int4",
        options={"lqer": 3, "lqer_l": "int2", "lqer_r": "int8"},
        embedding_format="int6",
        embedding_options={"lqer": 2},
        keep_float_max_numel=0,
    )
    return export_qtensors(_floats(), policy=policy)


# name: (QTensors, pack options). Codecs None: the default (portable) race.
PORTABLE_V1 = ("rans", "deflate", "lzma", "raw")  # a format-1 writer's set, less zstd (added below)
CASES = {
    "v2_int8": (lambda: _quantized("int8"), {}),
    "v2_int4": (lambda: _quantized("int4"), {}),
    "v2_ternary": (lambda: _quantized("ternary"), {}),
    "v2_quantizers": (_every_quantizer, {}),
    "v2_deflate": (lambda: _quantized("int6", asymmetric=True), {"codecs": ["deflate", "raw"]}),
    "v2_lzma": (lambda: _quantized("int6", asymmetric=True), {"codecs": ["lzma", "raw"]}),
    "v2_raw": (lambda: _quantized("int4"), {"codecs": ["raw"]}),
    "v2_zstd": (lambda: _quantized("int8"), {"codecs": ["zstd", "raw"]}),
    "v2_contexts": (_contexts, {}),
    "v2_tuples": (_tuples, {}),
    "v2_blocks": (_blocks, {}),
    "v2_map": (_map, {}),
    "v2_parents_max": (_related, {"effort": "max"}),
    "v2_parents_rans": (_walk, {"effort": "max", "codecs": ["rans", "raw"]}),
    "v2_parents_lzma": (_related, {"effort": "max", "codecs": ["lzma", "raw"]}),
    "v2_lqer": (_lqer, {}),
    "v1_contexts": (
        lambda: {k: v for k, v in _contexts().items() if k in ("col", "scale")},
        {"codecs": list(PORTABLE_V1), "version": 1},
    ),
    "v1_int4": (lambda: _quantized("int4"), {"codecs": list(PORTABLE_V1), "version": 1}),
    "v3_quantizers": (_every_quantizer, {"version": 3}),
    "v3_parents_rans": (_walk, {"effort": "max", "codecs": ["rans", "raw"], "version": 3}),
}


def relayout(data: bytes, version: int) -> bytes:
    """A format-2 or -3 artifact laid out as the other (the same stored manifest but for its
    version field, the same payload): they differ only in where the manifest goes."""
    _, _, flags, mlen, _ = spec.HEADER.unpack_from(data, 0)
    manifest, payload = fmt.split_container(data)
    manifest["version"] = version
    stored = compress.compress(flags & spec.MANIFEST_COMPRESSOR_MASK, fmt.dumps(manifest))
    return fmt.container(stored, payload, flags, version)


# -- format 1 -----------------------------------------------------------------------------


def _rans_v1(body: bytes) -> bytes:
    """A format-2 rans stream as format 1 laid it out: each side blob raw or a magicless zstd
    frame, whichever is smaller, flagged by one bit (2·len + z) instead of a compress id."""
    *heads, pos = side_header(body, 2)
    blobs = []
    for n, kind in heads:
        raw = compress.decompress(kind, body[pos : pos + n], 1 << 30, "side blob", magicless=True)
        pos += n
        z = magicless_zstd(raw) if raw else b""
        blobs.append((z, 1) if raw and len(z) < len(raw) else (raw, 0))
    head = varint_encode(np.array([2 * len(b) + z for b, z in blobs]))
    return head + b"".join(b for b, _ in blobs) + body[pos:]


def to_version1(data: bytes) -> bytes:
    """A format-2 artifact (no fields streams, no LQER) rewritten as format 1."""
    manifest, payload = fmt.split_container(data)
    streams = sorted((s for t in manifest["tensors"] for s in t.get("streams", {}).values()), key=lambda s: s["offset"])
    parts, at = [], 0
    for s in streams:
        assert s["codec"] in ("rans", "deflate", "lzma", "raw", "zstd"), s["codec"]
        body = bytes(payload[s["offset"] : s["offset"] + s["length"]])
        body = _rans_v1(body) if s["codec"] == "rans" else body
        s["offset"], s["length"] = at, len(body)
        parts.append(body)
        at += len(body)
    new_payload = b"".join(parts)
    manifest.update(version=1, payload_length=len(new_payload), payload_sha256=hashlib.sha256(new_payload).hexdigest())
    stored = compress.compress(spec.ZSTD, fmt.dumps(manifest))  # flag bit 0: a zstd frame
    return fmt.container(stored, new_payload, spec.ZSTD, 1)


# -- what is recorded ------------------------------------------------------------------------


def tensor_digest(t: torch.Tensor) -> dict:
    """dtype, shape and the sha256 of a decoded tensor's bytes (C order, native = little endian)."""
    flat = t.detach().contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "sha256": hashlib.sha256(raw).hexdigest(),
    }


def repack(data: bytes, codecs=None, effort: str = "normal") -> bytes:
    """The artifact's decoded codes packed again with the options it was made with."""
    art = read_artifact(data)
    return pack_qtensors(art.qtensors, art.metadata, codecs=codecs, effort=effort)


def coverage(data: bytes) -> list[str]:
    """What of the format an artifact exercises: codec/layout/context labels of its streams."""
    manifest = read_artifact(data).manifest
    seen = {f"version {manifest['version']}"}
    for t in manifest["tensors"]:
        if "lowrank" in t:
            seen.add("lqer")
        if "alias_of" in t:
            seen.add("alias")
        for kind, s in t.get("streams", {}).items():
            p = s["params"]
            label = s["codec"]
            if s["codec"] == "rans":
                label += " " + p.get("context", "none")
                if p.get("tuple", 1) > 1:
                    seen.add("rans tuple")
                if p.get("k", 1) > 64:
                    seen.add("rans wide")
            elif s["codec"] in ("deflate", "lzma"):
                label += " " + p.get("layout", "plain")
            seen.add(label)
            if kind in ("parents", "scales", "zeros"):
                seen.add(f"{kind} {s['codec']}")
        seen.add(f"format {t.get('format')}" if "format" in t else "alias")
    return sorted(seen)


def make() -> dict[str, tuple[bytes, dict]]:
    out = {}
    for name, (build, options) in CASES.items():
        options = dict(options)
        version = options.pop("version", 2)
        data = pack_qtensors(
            build(), {"golden": name}, codecs=options.get("codecs"), effort=options.get("effort", "normal")
        )
        if version < 3:
            data = relayout(data, 2)
        if version == 1:
            data = to_version1(data)
        out[name] = (data, {"version": version, **options})
    return out


def record(data: bytes, options: dict) -> dict:
    codecs, effort = options.get("codecs"), options.get("effort", "normal")
    return {
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "pack": {"codecs": codecs, "effort": effort},
        "version": options["version"],
        "repack_sha256": hashlib.sha256(repack(data, codecs, effort)).hexdigest(),
        "covers": coverage(data),
        "tensors": {name: tensor_digest(t) for name, t in unpack(data).items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--force", action="store_true", help="remake goldens that exist")
    ap.add_argument("--check", action="store_true", help="exit 1 if today's writer makes other bytes")
    args = ap.parse_args()
    made = make()
    if args.check:
        index = json.loads(INDEX.read_text())
        bad = [n for n, (d, _) in made.items() if hashlib.sha256(d).hexdigest() != index.get(n, {}).get("sha256")]
        print(
            "\n".join(f"{'differs' if n in index else 'new'}: {n}" for n in bad) or f"all {len(made)} goldens identical"
        )
        return 1 if bad else 0
    if INDEX.exists() and not args.force:
        print(f"{INDEX} exists: --force to remake the goldens (a deliberate format change only)")
        return 2
    OUT.mkdir(exist_ok=True)
    index = {}
    for name, (data, options) in made.items():
        (OUT / f"{name}.rnpk").write_bytes(data)
        index[name] = record(data, options)
        print(f"{name}: {len(data):,} B  {', '.join(index[name]['covers'])}")
    INDEX.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    print(f"{sum(len(d) for d, _ in made.values()):,} B in {len(made)} goldens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
