"""Pack QTensors (or a whole state dict) into an artifact and read it back."""

from __future__ import annotations

import hashlib
import math
import mmap
import stat
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .. import heap, parallel
from ..errors import ArtifactError, OverCapError, QuantError
from ..quant import dequantize_all
from ..quant import registry as quant_registry
from ..quant.qtensor import QTensor
from . import codecs as codecs_mod
from . import format as fmt
from . import parents, race, spec, validate
from .cap import Budget
from .codecs import DTYPES, StreamContext
from .options import PackOptions
from .rans import order0_bits


@dataclass
class Artifact:
    """A decoded artifact: its manifest, user metadata and QTensors (aliases share objects)."""

    manifest: dict
    metadata: dict
    qtensors: dict[str, QTensor]
    aliases: dict[str, str] = field(default_factory=dict)


def _sha(arr: np.ndarray, dtype: str) -> str:
    # Hashed in place when already contiguous little-endian: no copy of a big stream.
    return hashlib.sha256(np.ascontiguousarray(arr, dtype=DTYPES[dtype]).reshape(-1).view(np.uint8)).hexdigest()


def _check_qtensor(name: str, qt: QTensor, check: bool = True) -> None:
    """QuantError for what an artifact cannot hold, or its readers would refuse: the packer
    never writes an artifact that `verify` refuses."""
    if not isinstance(qt, QTensor):
        raise QuantError(f"tensor {name}: expected a QTensor, got {type(qt).__name__}")
    why = check and validate.shape_problem(qt.shape)
    if why:
        raise QuantError(
            f"tensor {name!r}: {why} (an artifact holds at most {spec.MAX_NDIM} dims, each < 2^40, and so is "
            "the product of those that are not 0)"
        )
    codes = np.asarray(qt.codes)
    if codes.ndim != 2 or codes.size < qt.numel:
        raise QuantError(f"tensor {name}: codes {codes.shape} must be 2-D and hold {qt.numel} values")
    for kind in ("scales", "zeros"):
        arr = getattr(qt, kind)
        if arr is not None and np.asarray(arr).shape != (codes.shape[0],):
            raise QuantError(f"tensor {name}: {kind} must have one value per code row")
    try:
        fmt.dumps(qt.params)
    except (TypeError, ValueError) as exc:
        raise QuantError(f"tensor {name}: params are not JSON-serializable: {exc}") from None
    if not check:
        return
    for kind in ("codes", "scales", "zeros"):
        arr = getattr(qt, kind)
        if arr is not None and validate.shape_problem(np.shape(arr)):
            raise QuantError(f"tensor {name!r} {kind}: {validate.shape_problem(np.shape(arr))}")
    why = quant_registry.get(qt.format, **qt.params).check_values(qt)
    if why:  # e.g. float16 weights at +-65504, whose fp16-rounded int8 scale lands past it
        raise QuantError(f"tensor {name!r}: {qt.format} {why}; keep it float (--keep-float {name!r})")


def pack_qtensors(
    qtensors,
    metadata: dict | None = None,
    codecs=None,
    effort: str = "normal",
    *,
    options: PackOptions | None = None,
    check: bool = True,
    jobs: int = 1,
    payload=None,
) -> bytes:
    """Entropy-pack QTensors into artifact bytes; one QTensor under two names is stored once.

    effort: "normal" (fast), or "max": a wider codec search for the last bytes, and every
    tensor's rows predicted from earlier similar rows (parents.py; not only tall ones); never
    larger than "normal". options: instead of effort, a PackOptions (options.py): for_effort(effort)
    is what effort means, and a variant of it is a dataclasses.replace.
    check: refuse (QuantError) names, shapes and values that readers refuse; False only to
    forge such artifacts (tests/hostile_corpus.py).
    jobs: tensors coded at once (the same bytes for any number). qtensors may make each QTensor
    as asked (no tied names); with payload (a binary file), the payload is written to it tensor by
    tensor, in order, and the header and manifest come back (to go before it).
    """
    if options is not None and effort != "normal":
        raise QuantError("give effort or options, not both")
    options = options or PackOptions.for_effort(effort)
    heap.settle()  # temporaries from the heap, not fresh pages (heap.py)
    metadata = dict(metadata or {})
    try:
        fmt.dumps(metadata)
    except (TypeError, ValueError) as exc:
        raise QuantError(f"metadata is not JSON-serializable: {exc}") from None
    if options.also_normal and payload is None:  # (the search ranks codings by estimates: "max" may miss)
        tries = (PackOptions(), replace(options, also_normal=False))
        return min((_pack(qtensors, metadata, codecs, o, check, jobs) for o in tries), key=len)
    return _pack(qtensors, metadata, codecs, options, check, jobs, payload)


def _pack(qtensors, metadata: dict, codecs, options: PackOptions, check: bool, jobs: int = 1, payload=None) -> bytes:
    first_name: dict[int, str] = {}
    stored, aliases = [], []
    tied = isinstance(qtensors, dict)  # (a mapping that makes QTensors as asked holds no tied names)
    # Sorted names: the artifact must not depend on the dict's insertion order.
    for name in sorted(qtensors):
        if not isinstance(name, str):
            raise QuantError(f"tensor name {name!r} is not a string")
        why = check and validate.name_problem(name)
        if why:
            raise QuantError(f"tensor {name!r}: {why}: rename it")
        if tied and id(qtensors[name]) in first_name:
            aliases.append({"name": name, "alias_of": first_name[id(qtensors[name])]})
            continue
        first_name[id(qtensors[name]) if tied else len(first_name)] = name
        stored.append(name)
    entries, sha, offset, chunks = [], hashlib.sha256(), 0, []
    # Tensor by tensor, in order (jobs at once): each tensor's streams are written before the next's.
    # (a streamed checkpoint's sizes come from its header: its tensors are read when coded)
    sizes = [qtensors.numel(n) if hasattr(qtensors, "numel") else getattr(qtensors[n], "numel", 0) for n in stored]
    work = partial(_encoded, qtensors, codecs, options, check)
    write = chunks.append if payload is None else payload.write
    with closing(parallel.ordered(work, stored, jobs, sizes, _limit(sizes))) as results:
        for done, buffers in results:
            buffers = iter(buffers)
            for entry, coded in done:
                for kind, stream in entry["streams"].items():
                    (codec, params), data = coded[kind], next(buffers)
                    sha.update(data)
                    write(data)
                    stream.update(codec=codec, params=params, offset=offset, length=len(data))
                    offset += len(data)
                entries.append(entry)
    manifest = {"format": "rnpk", "version": spec.VERSION, "metadata": metadata, "tensors": entries + aliases}
    return fmt.write_container(manifest, chunks, (offset, sha.hexdigest()))


# Tensors coded side by side hold at most this many weights together, or the largest tensor
# and SIDE_BY_SIDE_WEIGHTS / 4 more: a job's memory grows with its tensor (~10 bytes a weight at
# its peak), so jobs may not multiply the largest tensor's. A 1.1B-weight model, int4, 2 jobs:
# its 65.5M-weight embedding and head side by side peaked at 1,577 MB, 904 MB with one job; one
# of them beside an 11.5M-weight layer matrix keeps the other job busy (docs/SCALE.md).
SIDE_BY_SIDE_WEIGHTS = 1 << 26


def _limit(sizes: list[int]) -> int:
    return max(SIDE_BY_SIDE_WEIGHTS, *sizes, 0) + SIDE_BY_SIDE_WEIGHTS // 4


def _encoded(qtensors, codecs, options: PackOptions, check: bool, name: str) -> tuple[list, list]:
    """_encode_tensor of a tensor as it crosses from a job: ([entry, {kind: (codec, params)}], [bytes])."""
    done = _encode_tensor(name, qtensors[name], qtensors, codecs, options, check)
    return [(e, {k: c[:2] for k, c in coded.items()}) for e, coded in done], [
        coded[k][2] for e, coded in done for k in e["streams"]
    ]


def _encode_tensor(name: str, qt: QTensor, names, codecs, options: PackOptions, check: bool) -> list[tuple[dict, dict]]:
    """(manifest entry, {kind: (codec, params, bytes)}) of a stored tensor, its LQER factors first."""
    items: list[tuple[np.ndarray, StreamContext]] = []
    # Tensors whose rows are predicted: their codes as they are race the residuals and parents.
    unpredicted: dict[str, tuple[np.ndarray, StreamContext]] = {}
    if getattr(qt, "lowrank", None) is None:  # (_entry refuses what is not a QTensor)
        entries = [_entry(name, qt, options, check, items, unpredicted)]
    else:  # the factors first, so that a reader has them when it reaches the tensor
        factors = (f"{name}.lqer_l", f"{name}.lqer_r")
        clash = [n for n in factors if n in names]
        if clash:
            raise QuantError(f"tensor {name}: its lqer factor name {clash[0]!r} is taken by another tensor")
        entries = [_entry(n, f, options, check, items, unpredicted) for n, f in zip(factors, qt.lowrank, strict=True)]
        entries.append({**_entry(name, qt, options, check, items, unpredicted), "lowrank": list(factors)})
    encoded = race.encode_all(items + list(unpredicted.values()), codecs)
    alone = dict(zip(unpredicted, encoded[len(items) :], strict=True))
    encoded = iter(encoded[: len(items)])
    out = []
    for e in entries:
        coded = {kind: next(encoded) for kind in e["streams"]}
        plain = alone.get(e["name"])  # (the sample or the search can be wrong: the race decides)
        if plain is not None and len(plain[2]) <= len(coded["codes"][2]) + len(coded["parents"][2]):
            coded["codes"] = plain
            del coded["parents"], e["streams"]["parents"]
            e["streams"]["codes"]["sha256"] = _sha(unpredicted[e["name"]][0], e["streams"]["codes"]["dtype"])
        out.append((e, coded))
    return out


def _entry(name: str, qt: QTensor, options: PackOptions, check: bool, items: list, unpredicted: dict) -> dict:
    """A tensor's manifest entry; its streams appended to items (and its codes as they are to
    unpredicted, where its rows' parents must race them)."""
    _check_qtensor(name, qt, check)
    streams, arrays = {}, {"scales": qt.scales, "zeros": qt.zeros, "codes": np.asarray(qt.codes)}
    codes, pays = arrays["codes"], None  # the tensor's rows predicted from earlier rows, where they pay
    # A stack of matrices quantized row by row (banks [layers, rows, cols]) is seen as its stacked rows,
    # not a few rows of everything: rows' contexts and parents (the best record's banked model: -2.7%).
    stack = len(qt.shape) > 2 and codes.shape == (math.prod(qt.shape[:-1]), qt.shape[-1])
    view = codes.shape if stack else tuple(qt.shape)
    if codes.dtype == np.int8 and len(qt.shape) > 1 and codes.size == qt.numel > 0:
        m = codes.reshape(view[0], -1)
        tall = len(m) >= options.parents_search_rows
        found = parents.find(m, options.parents_probes) if tall else parents.previous(m, options.parents_smooth)
        if found is not None:
            res = parents.residuals(m, found)
            pays = race.parents_pay(m, res, found, qt.scales, options)
            if pays is not False:
                arrays["parents"], arrays["codes"] = found, res.reshape(codes.shape)
    for kind in spec.STREAM_KINDS:
        arr = arrays.get(kind)
        if arr is None:
            continue
        arr = np.ascontiguousarray(arr)
        dtype = arr.dtype.name
        if dtype not in DTYPES:
            raise QuantError(f"tensor {name} {kind}: dtype {dtype} cannot be stored (use one of {', '.join(DTYPES)})")
        scales = np.asarray(qt.scales) if kind == "codes" and qt.scales is not None else None
        # Float words (codes, scales, zeros) go to the fields coding; readers decode a tensor's
        # other streams before its codes, whose scale context needs its scales.
        mant = codecs_mod.MANT.get(qt.format if kind == "codes" else dtype, 0)
        ctx = StreamContext(kind, dtype, tuple(arr.shape), view, scales, options, mant=mant)
        items.append((arr, ctx))
        streams[kind] = {"dtype": dtype, "shape": list(arr.shape), "sha256": _sha(arr, dtype)}
    if "parents" in streams and pays is None:
        unpredicted[name] = (np.ascontiguousarray(codes), items[-1][1])  # (codes: the last item)
    return {
        "name": name,
        "shape": [int(d) for d in qt.shape],
        "dtype": str(qt.dtype),
        "format": qt.format,
        "params": qt.params,
        "streams": streams,
        **({"view": list(view)} if stack else {}),
    }


def _decode_stream(
    payload: memoryview, s: dict, kind: str, tensor: dict, scales: np.ndarray | None, version: int
) -> np.ndarray:
    matrix = tuple(tensor.get("view", tensor["shape"]))  # what its row/column contexts see (spec.FIELD_FLAGS)
    ctx = StreamContext(kind, s["dtype"], tuple(s["shape"]), matrix, scales, version=version)
    # In place, no copy (verify of a 1.1B-weight bf16 artifact: 85 MB less peak RSS); no decoder returns a view of it
    arr = codecs_mod.get(s["codec"]).decode(payload[s["offset"] : s["offset"] + s["length"]], s["params"], ctx)
    if _sha(arr, s["dtype"]) != s["sha256"]:
        raise ArtifactError(f"tensor {tensor['name']!r} {kind}: decoded checksum mismatch")
    return arr


def read_artifact(data: bytes, max_decoded_bytes: int | None = None) -> Artifact:
    """Validate and decode artifact bytes (ArtifactError on anything wrong).

    max_decoded_bytes: refuse artifacts whose tensors decode to more than this many bytes
    (default validate.default_max_decoded_bytes: 64 a stored byte, from 1 GiB up to the
    machine's memory), checked before decoding.
    """
    manifest, tensors = iter_artifact(data, max_decoded_bytes)
    qtensors: dict[str, QTensor] = {}
    aliases: dict[str, str] = {}
    for entries, qt in tensors:
        t = entries[-1]
        if "alias_of" in t:
            aliases[t["name"]] = t["alias_of"]
        qtensors[t["name"]] = qtensors[t["alias_of"]] if "alias_of" in t else qt
    return Artifact(manifest, manifest.get("metadata", {}), qtensors, aliases)


def iter_artifact(data: bytes, max_decoded_bytes: int | None = None, fn=None, jobs: int = 1, *, hashed: bool = False):
    """(manifest, its tensors decoded one at a time, after read_artifact's checks): ([entries],
    QTensor) per stored tensor (an LQER tensor's factor entries first, the factors on its
    QTensor), ([alias entry], None) per alias. A mapped file's pages are let go as read.
    fn: fn(entries, QTensor) of each instead, decoded and run jobs at once (parallel.ordered: fn
    returns (JSON-able, [bytes-like]); close the results with contextlib.closing). hashed: as format's;
    with jobs, the payload's checksum is one more job, beside the decoding (its mismatch raised first)."""
    heap.settle()
    beside = jobs > 1 and not hashed
    manifest, payload = validate.read_container(data, max_decoded_bytes, hashed=hashed or beside)
    units: list[list[dict]] = [[]]  # (validate checked that factors come just before their tensor)
    factors = {n for t in manifest["tensors"] for n in t.get("lowrank", ())}
    for t in manifest["tensors"]:
        units[-1].append(t)
        if t["name"] not in factors:
            units.append([])
    sizes = [sum(math.prod(t.get("shape", ())) for t in u) for u in units[:-1]]
    work = partial(_unit, manifest, payload, fn or (lambda *item: item))
    results = parallel.ordered(work, units[:-1], jobs, sizes, _limit(sizes))
    return manifest, _checked_beside(results, manifest, payload) if beside else results


def _checked_beside(results, manifest: dict, payload: memoryview):
    with ThreadPoolExecutor(1) as pool:  # (verify of a 1.1B-weight bf16 artifact: 0.85 s less)
        check = pool.submit(fmt.check_payload, manifest, payload)
        try:
            yield from results
        except Exception:
            check.result()  # (a corrupt payload: that, not what decoding it hit)
            raise
        check.result()


def _unit(manifest: dict, payload: memoryview, fn, unit: list[dict]):
    return fn(*next(_decoded({**manifest, "tensors": unit}, payload)))  # (one item a unit)


def _decoded(manifest: dict, payload: memoryview):
    factor_names = {n for t in manifest["tensors"] for n in t.get("lowrank", ())}
    factors: dict[str, tuple[dict, QTensor]] = {}
    for t in manifest["tensors"]:
        if "alias_of" in t:
            yield [t], None
            continue
        st, dec = t["streams"], {}
        for kind in spec.STREAM_KINDS:
            if kind in st:
                dec[kind] = _decode_stream(payload, st[kind], kind, t, dec.get("scales"), manifest["version"])
        fmt.release(payload)
        if "parents" in dec:  # (validate checked: [rows, 2], and the codes are the tensor's [rows, cols])
            m = dec["codes"].reshape(len(dec["parents"]), -1)
            dec["codes"] = parents.restore(m, dec["parents"], f"tensor {t['name']!r}").reshape(dec["codes"].shape)
        qt = QTensor(
            t["format"], tuple(t["shape"]), t["dtype"], dec["codes"], dec.get("scales"), dec.get("zeros"), t["params"]
        )
        validate.check_decoded(t["name"], qt)
        if t["name"] in factor_names:
            factors[t["name"]] = (t, qt)
            continue
        ents = [factors[n][0] for n in t.get("lowrank", ())] + [t]
        if "lowrank" in t:  # its factors were decoded just before it (validate checked the order)
            qt.lowrank = tuple(factors.pop(n)[1] for n in t["lowrank"])
        yield ents, qt


# ----------------------------------------------------------------- statistics


def tensor_stats(manifest: dict, qtensors: dict[str, QTensor] | None = None) -> list[dict]:
    """Per stored tensor: name, shape, format, codecs, packed bytes, bits/weight, order-0 bound."""
    rows = []
    owner = {n: t["name"] for t in manifest["tensors"] for n in t.get("lowrank", ())}
    if qtensors is not None and owner:  # the factors live on their tensor's QTensor
        qtensors = dict(qtensors)
        for t in manifest["tensors"]:
            factors = getattr(qtensors.get(t["name"]), "lowrank", None) or ()
            qtensors.update(zip(t.get("lowrank", ()), factors, strict=False))
    for t in manifest["tensors"]:
        if "alias_of" in t:
            rows.append({"name": t["name"], "alias_of": t["alias_of"], "bytes": 0})
            continue
        numel = math.prod(t["shape"])
        packed = sum(s["length"] for s in t["streams"].values())
        row = {
            "name": t["name"],
            "shape": t["shape"],
            "dtype": t["dtype"],
            "format": t["format"],
            "codec": "/".join(f"{k}:{_codec_label(s)}" for k, s in sorted(t["streams"].items())),
            "bytes": packed,
            "numel": numel,
            "bits_per_weight": packed * 8 / numel if numel else 0.0,
        }
        if t["name"] in owner:  # an LQER factor: its bytes are part of what its tensor costs
            row["lowrank_of"] = owner[t["name"]]
        if qtensors is not None and t["name"] in qtensors:
            qt = qtensors[t["name"]]
            side = sum(s["length"] for k, s in t["streams"].items() if k in ("scales", "zeros"))
            # Not of 4-byte words (fp32's): nearly each its own symbol, a bound that says nothing of
            # the fields coding, and its sort took 2/3 of verify's time on all-mpnet-base-v2 fp32.
            bound = order0_bits(qt.codes) / 8 if np.asarray(qt.codes).itemsize <= 2 else None
            row["codes_bytes"] = packed - side  # (a parents stream is part of how the codes are coded)
            row["side_bytes"] = side
            row["order0_bytes"] = bound
            row["overhead"] = (row["codes_bytes"] / bound - 1.0) if bound else None
        rows.append(row)
    return rows


def decoded_stats(data: bytes, max_decoded_bytes: int | None = None, jobs: int = 1, *, hashed: bool = False):
    """(manifest, tensor_stats rows) of artifact bytes, decoded one tensor at a time, jobs at once
    (hashed: as iter_artifact's)."""
    manifest, results = iter_artifact(data, max_decoded_bytes, _stats, jobs, hashed=hashed)
    with closing(results):
        return manifest, [row for rows, _ in results for row in rows]


def _stats(entries: list[dict], qt: QTensor | None) -> tuple[list[dict], list]:
    return tensor_stats({"tensors": entries}, None if qt is None else {entries[-1]["name"]: qt}), []


def _codec_label(s: dict) -> str:
    p = s["params"]
    if s["codec"] == "rans" and p.get("context") == "grid":  # row classes x column classes
        return f"rans[grid{p['k'] // p['kc']}x{p['kc']}]"
    if s["codec"] == "rans" and p.get("context") == "block":  # contexts x rows per block
        return f"rans[block{p['k']},{p['rb']} rows]"
    if s["codec"] == "rans":
        return f"rans[{p.get('context', 'none')}{'x' + str(p.get('k')) if p.get('k', 1) > 1 else ''}]"
    if s["codec"] == "zstd":
        return f"zstd[{p.get('layout')}]"
    return s["codec"]


# ----------------------------------------------------------------- state dicts


def unpack(data: bytes, max_decoded_bytes: int | None = None) -> dict[str, Any]:
    """Artifact bytes to a dequantized state dict in the original dtypes."""
    return dequantize_all(read_artifact(data, max_decoded_bytes).qtensors)


# ----------------------------------------------------------------- verify


@dataclass
class VerifyReport:
    """Outcome of verifying an artifact; `to_dict()` is what --json prints."""

    path: str
    ok: bool
    exit_code: int
    reason: str = ""
    cap: dict | None = None
    tensors: list[dict] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-able form."""
        return asdict(self)


def verify_bytes(
    data: bytes, budget=None, path: str = "<bytes>", max_decoded_bytes: int | None = None, jobs: int = 1
) -> VerifyReport:
    """Decode everything, check every checksum, then the cap; never raises for a bad artifact.

    ok means `unpack` succeeds: read_artifact checks what each quantizer needs; with a loader
    in the budget, ok also means the standalone loader reads it (the portable profile). jobs:
    tensors decoded at once.
    """
    budget = budget or Budget()
    try:
        manifest, rows = decoded_stats(data, max_decoded_bytes, jobs)
    except ArtifactError as exc:
        return VerifyReport(path, False, exc.exit_code, str(exc))
    metadata = manifest.get("metadata", {})
    if budget.loader is not None:  # the loader counted must be able to read it, too
        from .loader import loader_problem

        problem = loader_problem(data, manifest)
        if problem:
            return VerifyReport(
                path, False, ArtifactError.exit_code, f"not readable by the standalone loader: {problem}"
            )
    try:
        cap = budget.check(len(data), rows)
    except OverCapError as exc:
        return VerifyReport(path, False, OverCapError.exit_code, str(exc), exc.report, rows, metadata)
    return VerifyReport(path, True, 0, "valid and under the cap", cap, rows, metadata)


def read_artifact_file(path: str | Path, max_decoded_bytes: int | None = None) -> bytes:
    """An artifact file's bytes, memory-mapped: regular files only (not /dev/zero or a FIFO), and no larger
    than its decoded bytes allow (no stream is longer than its raw form plus the manifest)."""
    path = Path(path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ArtifactError(f"{path} is not a regular file")
        decoded = max_decoded_bytes  # (the default grows with the file: no size it refuses)
        if decoded is not None and st.st_size > decoded + spec.MAX_MANIFEST_BYTES + spec.HEADER_SIZE:
            raise ArtifactError(
                f"{path}: {st.st_size:,} bytes, more than an artifact decoding to at most {decoded:,} bytes can hold"
            )
        with open(path, "rb") as f:  # mapped: pages are read as decoding reaches them, and let go
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if st.st_size else b""
    except OSError as exc:
        raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from None


def verify_artifact(path: str | Path, budget=None, max_decoded_bytes: int | None = None, jobs: int = 1) -> VerifyReport:
    """verify_bytes on a file (a missing/unreadable file is reported as corrupt)."""
    try:
        data = read_artifact_file(path, max_decoded_bytes)
    except ArtifactError as exc:
        return VerifyReport(str(path), False, ArtifactError.exit_code, str(exc))
    return verify_bytes(data, budget, str(path), max_decoded_bytes, jobs)
