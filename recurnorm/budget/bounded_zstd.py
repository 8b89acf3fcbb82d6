"""zstd frames from untrusted artifacts: output and window memory bounded before use.

`decompress()` alone trusts the frame header: a forged content size makes it
allocate that much (a 47-byte stream asked for an exabyte), and a forged
window asks for up to 128 MB. Here the window is capped, output is read at
most `limit + 1` bytes at a time, and every failure is an ArtifactError.
"""

from __future__ import annotations

import io

import zstandard

from ..errors import ArtifactError

MAX_WINDOW = 1 << 24  # our frames use at most 8 MB windows (level 19)


def decompress(blob: bytes, limit: int, what: str, magicless: bool = False) -> bytes:
    """The first frame's bytes, at most `limit` of them (ArtifactError otherwise)."""
    fmt = zstandard.FORMAT_ZSTD1_MAGICLESS if magicless else zstandard.FORMAT_ZSTD1
    dctx = zstandard.ZstdDecompressor(format=fmt, max_window_size=MAX_WINDOW)
    chunks, got = [], 0
    try:
        with dctx.stream_reader(io.BytesIO(blob)) as reader:
            while got <= limit:
                chunk = reader.read(limit + 1 - got)
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
    except zstandard.ZstdError as exc:
        raise ArtifactError(f"{what}: zstd: {exc}") from None
    if got > limit:
        raise ArtifactError(f"{what}: zstd output larger than the {limit:,} bytes declared")
    return b"".join(chunks)
