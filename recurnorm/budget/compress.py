"""General-purpose compressors for the manifest, rans side data and whole-stream codecs, by their
spec.py ids: the portable ones are what Python's standard library decodes (all the standalone
loader needs); zstd is read (format 1 used it) and written only when asked (`codecs=` "zstd").

Every decompression here is bounded: output stops at `limit` bytes (a forged stream
cannot make the reader allocate more), and a truncated or overlong stream is an error.
"""

from __future__ import annotations

import lzma
import zlib

import zstandard

from ..errors import ArtifactError
from .spec import DEFLATE, DEFLATE_WBITS, LZMA, LZMA_DICT, NAMES, PORTABLE, RAW, ZSTD

DEFLATE_LEVEL = 9
CHUNK = (1 << 16) - 1  # deflate()'s chunks where it takes a level each: a stored block's most bytes
# Raw LZMA2 (no .xz container: its header and check cost ~60 bytes a blob). The decoder
# must be told a dictionary size at least the encoder's: LZMA_DICT for every reader; the
# writer fits its dictionary to the input (as small, the same bytes on inputs we have
# measured, and 2-15x faster on the small blobs that side data is).
LZMA_DECODE_FILTERS = [{"id": lzma.FILTER_LZMA2, "dict_size": LZMA_DICT}]
ZSTD_LEVEL = 19
MAX_WINDOW = 1 << 24  # a zstd frame's window, at most (ours use 8 MB at level 19)


def deflate(raw: bytes, level: int | list[int] = DEFLATE_LEVEL) -> bytes:
    """Raw deflate (RFC 1951) of raw; or with a level per CHUNK bytes (0: a stored block), each
    chunk kept only where smaller and referring to no other's bytes (one stream all the same)."""
    if not isinstance(level, list):
        c = zlib.compressobj(level, zlib.DEFLATED, DEFLATE_WBITS)
        return c.compress(raw) + c.flush()
    out = []
    for i, v in enumerate(level):
        chunk, c = raw[i * CHUNK : (i + 1) * CHUNK], v and zlib.compressobj(v, zlib.DEFLATED, DEFLATE_WBITS)
        n, packed = len(chunk), c and c.compress(chunk) + c.flush(zlib.Z_SYNC_FLUSH)
        out += [packed] if c and len(packed) < n + 5 else [(n << 8 | (n ^ 0xFFFF) << 24).to_bytes(5, "little"), chunk]
    return b"".join(out) + b"\1\0\0\xff\xff"  # the final block, empty


def compress(kind: int, raw: bytes) -> bytes:
    """raw compressed by one compressor (RAW returns it as it is)."""
    if kind == RAW:
        return raw
    if kind == DEFLATE:
        return deflate(raw)
    if kind == LZMA:
        dict_size = min(max(1 << 12, 1 << (len(raw) - 1).bit_length()), LZMA_DICT)
        filters = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME, "dict_size": dict_size}]
        return lzma.compress(raw, format=lzma.FORMAT_RAW, filters=filters)
    if kind == ZSTD:
        return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(raw)
    raise ValueError(f"unknown compressor id {kind}")


def smallest(raw: bytes, kinds=PORTABLE) -> tuple[bytes, int]:
    """(blob, id) of the shortest form of raw among kinds (raw first on ties)."""
    forms = [(raw, RAW)] + [(compress(kind, raw), kind) for kind in kinds if kind != RAW and raw]
    return min(forms, key=lambda form: len(form[0]))


def estimate(raw: bytes) -> int:
    """About len(smallest(raw)[0]), sooner (deflate at a quick level): ranks candidates only."""
    return min(len(deflate(raw, 6)), len(raw)) if raw else 0


def decompress(kind: int, blob: bytes, limit: int, what: str, magicless: bool = False) -> bytes:
    """The bytes blob stands for, at most `limit` of them; ArtifactError on anything wrong."""
    if kind == RAW:
        out = bytes(blob)
    elif kind == ZSTD:
        out = _unzstd(blob, limit, what, magicless)
    elif kind in (DEFLATE, LZMA):
        d = (
            zlib.decompressobj(DEFLATE_WBITS)
            if kind == DEFLATE
            else lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=LZMA_DECODE_FILTERS)
        )
        try:
            out = d.decompress(blob, limit + 1)
        except (zlib.error, lzma.LZMAError) as exc:
            raise ArtifactError(f"{what}: {NAMES[kind]}: {exc}") from None
        if not d.eof and len(out) <= limit:
            raise ArtifactError(f"{what}: {NAMES[kind]} stream is truncated")
        if d.unused_data:
            raise ArtifactError(f"{what}: bytes after the end of the {NAMES[kind]} stream")
    else:
        raise ArtifactError(f"{what}: unknown compressor id {kind}")
    if len(out) > limit:
        raise ArtifactError(f"{what}: {NAMES[kind]} output larger than the {limit:,} bytes expected")
    return out


def _unzstd(blob: bytes, limit: int, what: str, magicless: bool) -> bytes:
    """A zstd frame's bytes, at most limit + 1 of them. `ZstdDecompressor.decompress` trusts the
    frame header: a forged content size makes it allocate that much (a 47-byte stream asked for
    an exabyte) and a forged window asks for up to 128 MB, so the header is read first and the
    window capped."""
    fmt = zstandard.FORMAT_ZSTD1_MAGICLESS if magicless else zstandard.FORMAT_ZSTD1
    try:
        size = zstandard.get_frame_parameters(blob, format=fmt).content_size
        if size != zstandard.CONTENTSIZE_UNKNOWN and size > limit:
            raise ArtifactError(f"{what}: zstd frame declares {size:,} bytes, more than the {limit:,} expected")
        dctx = zstandard.ZstdDecompressor(format=fmt, max_window_size=MAX_WINDOW)
        return dctx.decompress(blob, max_output_size=max(limit, 1))
    except zstandard.ZstdError as exc:
        raise ArtifactError(f"{what}: zstd: {exc}") from None
