"""One validation pass over an artifact's manifest before any stream is decoded, and one check
of the decoded values after: an artifact that passes both dequantizes and writes.

Artifacts arrive from strangers (a CI gate reads pull requests): every field is typed, each
tensor is checked against what its quantizer needs (`check_streams` before decoding,
`check_values` after), and the bytes the decoded tensors take are summed and bounded before
anything is decoded. Codec parameters are checked by each codec's decode, which knows them.
Every failure is an ArtifactError naming the tensor and field.
"""

from __future__ import annotations

import math
import os
from typing import Any

from ..errors import ArtifactError, DecodedLimitError, QuantError
from ..quant import registry as quant_registry
from . import codecs as codecs_mod
from . import format as fmt
from . import spec
from .codecs import DTYPES

DEFAULT_MAX_DECODED_BYTES = 1 << 30  # the least the default allows (a few KB of hostile artifact get this)
# The default grows with the artifact: int4 of a TinyLlama-shaped model decodes to 8 float32 bytes
# a stored byte, ternary ~25; a forged one declares 2^40 a stream. No more than the machine's memory.
DECODED_PER_STORED_BYTE = 64
MAX_NAME_CHARS = 4096  # tensor names are dotted paths; nothing legitimate comes close
FLOAT_STAGE_BYTES = 4  # quantized formats dequantize through float32, whatever the output dtype
# A rans stream's frequency tables (k x nsym^tuple entries) are decoded before its codes, and
# the standalone loader holds every stream's at once (sorted keys, counts, symbols, as int64):
# they count against the limit too. Packed models' tables are small (all-MiniLM-L6-v2 at int8:
# 43K entries, 1.4 MB counted, against 91 MB of weights); a forged one declares 2^20 a stream.
TABLE_ENTRY_BYTES = 32


def _str(v: Any, where: str, limit: int = 64) -> str:
    if not isinstance(v, str) or len(v) > limit:
        raise ArtifactError(f"{where} must be a string of at most {limit} characters, got {_short(v)}")
    return v


def _short(v: Any) -> str:
    """A hostile value, shown safely: type name and a bounded repr (control characters escaped)."""
    text = repr(v)
    return text if len(text) <= 40 else f"{type(v).__name__} {text[:37]}..."


def shape_problem(shape) -> str | None:
    """Why an artifact cannot hold a tensor or stream of this shape, or None: at most 16 dims,
    each < 2^40, and so are the dims other than 0 multiplied (torch and numpy refuse an empty
    [0, 2^39, 2^39], whose size they compute from the nonzero dims)."""
    if (
        not isinstance(shape, (list, tuple))
        or len(shape) > spec.MAX_NDIM
        or not all(fmt.is_int(d) and 0 <= d < 1 << 40 for d in shape)
        or math.prod(d for d in shape if d) >= 1 << 40
    ):
        return f"bad shape {_short(list(shape) if isinstance(shape, tuple) else shape)}"
    return None


def _shape(v: Any, where: str) -> tuple[int, ...]:
    why = shape_problem(v)
    if why:
        raise ArtifactError(f"{where}: {why}")
    return tuple(v)


def name_problem(name: str) -> str | None:
    """Why `unpack` could not write a tensor of this name into a .safetensors file that reads
    back, or None: the format keeps `__metadata__` for itself, and its JSON header holds UTF-8
    text, which has no lone surrogates (a JSON escape like \\ud800 parses to one in Python)."""
    if name == "__metadata__":
        return "the name __metadata__ is reserved by safetensors"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "the name holds a lone surrogate (not UTF-8 text)"
    return None


def default_max_decoded_bytes(stored_bytes: int) -> int:
    """The decoded bytes readers allow an artifact of stored_bytes when the caller sets no limit."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = DEFAULT_MAX_DECODED_BYTES
    return max(DEFAULT_MAX_DECODED_BYTES, min(DECODED_PER_STORED_BYTE * stored_bytes, memory))


def read_container(data, max_decoded_bytes: int | None = None, *, hashed: bool = False) -> tuple[dict, memoryview]:
    """format.read_container (header, checksums, JSON), then every manifest field before anything
    is decoded (max_decoded_bytes: default_max_decoded_bytes), then the header's field flags."""
    manifest, payload = fmt.read_container(data, hashed=hashed)
    check_manifest(manifest, max_decoded_bytes)
    for field, bit in spec.FIELD_FLAGS.items():
        if bool(spec.HEADER.unpack_from(data, 0)[2] & bit) != fmt.has_field(manifest, field):
            raise ArtifactError(f"header flag for {field!r} entries disagrees with the manifest")
    return manifest, payload


def check_manifest(manifest: dict, max_decoded_bytes: int | None = None) -> int:
    """Check every field before anything is decoded; the decoded bytes the artifact needs.

    max_decoded_bytes: the limit on those bytes (default: default_max_decoded_bytes of the payload).
    """
    version = manifest.get("version")
    if manifest.get("format") != "rnpk" or not fmt.is_int(version) or version not in spec.READ_VERSIONS:
        raise ArtifactError("manifest format/version fields are wrong")
    if not isinstance(manifest.get("metadata", {}), dict):
        raise ArtifactError("manifest metadata is not an object")
    tensors = manifest.get("tensors")
    if not isinstance(tensors, list) or len(tensors) > spec.MAX_TENSORS:
        raise ArtifactError(f"manifest tensors must be a list of at most {spec.MAX_TENSORS:,} entries")
    plen = manifest["payload_length"]
    limit = default_max_decoded_bytes(plen) if max_decoded_bytes is None else max_decoded_bytes
    stored: dict[str, int] = {}  # name -> decoded bytes
    names: set[str] = set()
    total_bytes = 0
    n_aliases = 0
    for i, t in enumerate(tensors):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise ArtifactError("manifest tensor entry without a name")
        name = t["name"]
        if len(name) > MAX_NAME_CHARS:
            raise ArtifactError(f"tensor name of {len(name):,} characters (at most {MAX_NAME_CHARS})")
        why = name_problem(name)
        if why:
            raise ArtifactError(f"tensor {_short(name)}: {why}")
        if name in names:
            raise ArtifactError(f"tensor {name!r} appears twice")
        names.add(name)
        if "alias_of" in t:
            # Aliases name a stored tensor listed before them: no chains, no self or forward
            # references, and at most one per stored tensor (tied weights come in pairs).
            target = t["alias_of"]
            if set(t) != {"name", "alias_of"} or not isinstance(target, str) or target not in stored:
                raise ArtifactError(f"tensor {name!r}: alias must name an earlier stored tensor")
            n_aliases += 1
            if n_aliases > len(stored):
                raise ArtifactError(f"{n_aliases:,} aliases for {len(stored):,} stored tensors")
            total_bytes += stored[target]  # unpack writes a copy per name
        else:
            nbytes = _check_tensor(t, name, plen)
            if "lowrank" in t:
                _check_lowrank(t, name, tensors[max(i - 2, 0) : i], stored)
            stored[name] = nbytes
            total_bytes += nbytes
        if total_bytes > limit:
            raise (ArtifactError if max_decoded_bytes is None else DecodedLimitError)(  # caller's limit: exit 3
                f"tensor {name!r}: decoding needs more than {limit:,} bytes (--max-decoded-bytes raises the limit)"
            )
    return total_bytes


def _check_lowrank(t: dict, name: str, before: list, stored: dict[str, int]) -> None:
    """An LQER correction: the two stored entries right before the tensor, [r, rows] and
    [r, cols] float32 factors of its matrix view, each used once (then no longer aliasable)."""
    where = f"tensor {name!r} lowrank"
    names = t["lowrank"]
    if (
        not isinstance(names, list)
        or len(names) != 2
        or [e.get("name") for e in before] != names
        or not all(n in stored and "lowrank" not in e for n, e in zip(names, before, strict=False))
    ):
        raise ArtifactError(f"{where}: must name the two stored factor entries listed right before it")
    shape = t["shape"]
    if len(shape) < 2 or t["format"] == "raw":
        raise ArtifactError(f"{where}: a correction needs a float matrix, not shape {shape} format {t['format']}")
    left, right = (e["shape"] for e in before)  # [shape[0], rest], or a stack's [rest, shape[-1]]
    rows, cols = (shape[0], math.prod(shape[1:])) if left[1:] == shape[:1] else (math.prod(shape[:-1]), shape[-1])
    r = left[0] if len(left) == 2 else 0
    if not (r >= 1 and left == [r, rows] and right == [r, cols]) or any(e["dtype"] != "float32" for e in before):
        raise ArtifactError(f"{where}: factors {left} and {right} are not float32 [r, {rows}] and [r, {cols}]")
    for n in names:  # consumed: no alias may name a factor, no other tensor may reuse it
        del stored[n]


def _check_tensor(t: dict, name: str, plen: int) -> int:
    """The decoded bytes of one stored tensor entry, after checking every field."""
    where = f"tensor {name!r}"
    shape = _shape(t.get("shape"), where)
    numel = math.prod(shape)
    rows = _matrix_rows(t, shape, where)
    _str(t.get("dtype"), f"{where} dtype")
    _str(t.get("format"), f"{where} format")
    if not isinstance(t.get("params"), dict):
        raise ArtifactError(f"{where}: params is not an object")
    out_size = quant_registry.ITEMSIZE.get(t["dtype"])  # (bytes per element dequantize returns: the original dtype's)
    if out_size is None:
        raise ArtifactError(f"{where}: unsupported tensor dtype {_short(t['dtype'])}")
    try:
        quantizer = quant_registry.get(t["format"], **t["params"])
    except QuantError as exc:
        raise ArtifactError(f"{where}: {exc}") from None
    if quantizer.float_only != t["dtype"].startswith(("float", "bfloat")):
        # What a float format would give an integer tensor (or raw integers a float one) depends
        # on how a reader casts (torch and numpy differ): no writer makes one, so none is read.
        kind = "a float" if quantizer.float_only else "an integer or bool"
        raise ArtifactError(f"{where}: format {t['format']} stands for {kind} tensor, not {t['dtype']}")
    streams = t.get("streams")
    if not isinstance(streams, dict) or "codes" not in streams or set(streams) - set(spec.STREAM_KINDS):
        raise ArtifactError(f"{where}: streams must hold codes (and scales/zeros/parents)")
    shapes = {
        kind: _check_stream(streams[kind], f"{where} {kind}", plen) for kind in spec.STREAM_KINDS if kind in streams
    }
    stream_bytes = sum(math.prod(shapes[k]) * DTYPES[streams[k]["dtype"]].itemsize for k in shapes)
    tables = sum(_table_entries(streams[k]["codec"], streams[k]["params"]) for k in shapes)
    G_L = shapes["codes"]
    if len(G_L) != 2:
        raise ArtifactError(f"{where} codes: shape {list(G_L)} is not [groups, group length]")
    G, L = G_L
    # Padding fills the last group only: G = ceil(numel / L) (G * L = numel when both are 0).
    if G * L < numel or (G * L > numel and (G - 1) * L >= numel):
        raise ArtifactError(
            f"{where} codes: shape {list(G_L)} does not hold {numel} values with padding in the last group only"
        )
    for kind in ("scales", "zeros"):
        if kind in shapes and shapes[kind] != (G,):
            raise ArtifactError(f"{where} {kind}: expected one value per code row ({G})")
    if "parents" in shapes and (
        len(shape) < 2
        or shapes["parents"] != (rows, 2)
        or streams["parents"]["dtype"] != "int32"
        or streams["codes"]["dtype"] != "int8"
        or G * L != numel
    ):
        raise ArtifactError(f"{where} parents: expected int32 [rows, 2] beside int8 codes without padding")
    why = quantizer.check_streams({k: streams[k]["dtype"] for k in shapes if k != "parents"})
    if why:
        raise ArtifactError(f"{where}: {why}")
    stage = out_size if t["format"] == "raw" else max(out_size, FLOAT_STAGE_BYTES)
    return max(numel * stage, stream_bytes) + 8 * G + TABLE_ENTRY_BYTES * tables


def _matrix_rows(t: dict, shape: tuple[int, ...], where: str) -> int:
    """The rows of the matrix a tensor's row contexts and parents see: its view's, or shape[0]."""
    if "view" not in t:
        return shape[0] if shape else 1
    view = _shape(t["view"], f"{where} view")
    if len(view) != 2 or len(shape) < 2 or math.prod(view) != math.prod(shape):
        raise ArtifactError(f"{where}: view {list(view)} is not a [rows, cols] matrix of its shape {list(shape)}")
    return view[0]


def _check_stream(s: dict, where: str, plen: int) -> tuple[int, ...]:
    """A stream entry's shape, after checking its codec, dtype, params, hash and place in the payload."""
    if not isinstance(s, dict):
        raise ArtifactError(f"{where}: not an object")
    codec, dtype = s.get("codec"), s.get("dtype")
    if not isinstance(codec, str) or codec not in codecs_mod.available():
        raise ArtifactError(f"{where}: unknown codec {_short(codec)}")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ArtifactError(f"{where}: unsupported dtype {_short(dtype)}")
    if not isinstance(s.get("params"), dict) or not isinstance(s.get("sha256"), str):
        raise ArtifactError(f"{where}: params/sha256 missing")
    off, length = s.get("offset"), s.get("length")
    if not (fmt.is_int(off) and fmt.is_int(length) and 0 <= off and 0 <= length and off + length <= plen):
        raise ArtifactError(f"{where}: bytes [{off}, {off}+{length}) outside the payload")
    shape = _shape(s.get("shape"), where)
    if codec == "raw" and length != math.prod(shape) * DTYPES[dtype].itemsize:
        raise ArtifactError(f"{where}: raw stream length does not match its shape")
    return shape


def _table_entries(codec: str, params: dict) -> int:
    """Frequency-table entries a rans stream declares (k x nsym^tuple); 0 for other codecs and
    for parameters out of range, which the codec's decode refuses before making anything."""
    if codec not in ("rans", "fields"):  # (a fields stream's heads are a rans stream)
        return 0
    k, nsym, t = params.get("k", 1), params.get("nsym"), params.get("tuple", 1)
    if (
        not all(fmt.is_int(v) and v >= 1 for v in (k, nsym, t))
        or k > spec.MAX_CONTEXTS
        or nsym > spec.MAX_ALPHABET
        or t > spec.MAX_TUPLE
    ):
        return 0
    return k * nsym**t


def check_decoded(name: str, qt) -> None:
    """After decoding: code values in the format's range, finite scales and zeros."""
    why = quant_registry.get(qt.format, **qt.params).check_values(qt)
    if why:
        raise ArtifactError(f"tensor {name!r}: {why}")
