"""zstd frames from untrusted artifacts: output and window memory bounded before use.

`ZstdDecompressor.decompress` trusts the frame header: a forged content size
makes it allocate that much (a 47-byte stream asked for an exabyte), and a
forged window asks for up to 128 MB. Here the header is read first, the window
is capped, output stops at `limit` bytes, truncated frames are errors, and
every failure is an ArtifactError.
"""

from __future__ import annotations

import zstandard

from ..errors import ArtifactError

MAX_WINDOW = 1 << 24  # our frames use at most 8 MB windows (level 19)


def decompress(blob: bytes, limit: int, what: str, magicless: bool = False) -> bytes:
    """The frame's bytes, at most `limit` of them (ArtifactError otherwise)."""
    fmt = zstandard.FORMAT_ZSTD1_MAGICLESS if magicless else zstandard.FORMAT_ZSTD1
    try:
        header = zstandard.get_frame_parameters(blob, format=fmt)
        if header.content_size != zstandard.CONTENTSIZE_UNKNOWN and header.content_size > limit:
            raise ArtifactError(
                f"{what}: zstd frame declares {header.content_size:,} bytes, more than the {limit:,} expected"
            )
        dctx = zstandard.ZstdDecompressor(format=fmt, max_window_size=MAX_WINDOW)
        out = dctx.decompress(blob, max_output_size=max(limit, 1))
    except zstandard.ZstdError as exc:
        raise ArtifactError(f"{what}: zstd: {exc}") from None
    if len(out) > limit:
        raise ArtifactError(f"{what}: zstd output larger than the {limit:,} bytes expected")
    return out
