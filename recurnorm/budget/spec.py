"""The wire spec of an .rnpk artifact, one table per fact: magic, versions, limits, compressor
ids, stream kinds, the portable codecs and the rans context variants. docs/FORMAT.md is its
prose; format, compress, rans, codecs, race and loader read it here. The standalone loader
(rnpk_load.py) imports nothing of recurnorm: tests/test_loader.py checks its literals equal these.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

MAGIC = b"RNPK"
VERSION = 3
# Version 1: zstd side data and manifest (see rans.split_body). Versions 1 and 2: the manifest
# comes before the payload; version 3: after it, so that a writer streaming a payload too large
# to hold writes each byte once, in place (format.container).
READ_VERSIONS = (1, 2, 3)
HEADER = struct.Struct("<4sHHQ32s")  # magic, version, flags, the stored manifest's length and SHA-256
HEADER_SIZE = HEADER.size  # 48
# Stored, and decompressed. A 16 MB model's manifest is ~50 KB, but the model's config.json
# rides in it (a tokenizer's vocabulary makes one of several MB): 8 MiB holds a 6 MB config.
# JSON of small containers parses to ~25-32 bytes of Python per byte, so this bounds parsing
# (measured on 8 MiB: empty objects 200 MB and 0.5 s, lists of objects of lists 265 MB and
# 4 s; 64 MiB took 1.4 GB).
MAX_MANIFEST_BYTES = 8 << 20
# The manifest's compressor id sits in the flags' low two bits. Per-tensor JSON repeats
# keys and hex hashes: deflate or lzma take ~80% off.
MANIFEST_COMPRESSOR_MASK = 3
# Bits 2 and 3: some tensor entry has the field; format-2 readers refuse unknown bits, so one
# that does not know a field refuses the artifact rather than read it wrong. lowrank: an LQER
# correction; view: the [rows, cols] its row/column contexts and parents see, where that is not
# [shape[0], rest] (a stack of matrices [..., r, c] quantized row by row: its [... * r, c] rows).
FIELD_FLAGS = {"lowrank": 4, "view": 8}
# Nesting: the manifest's own is 5 levels; a model's config (metadata.config) has room for 60.
# Python's JSON reader recurses ~1,000 levels deep before it gives up on its own.
MAX_JSON_DEPTH = 64
MAX_CONFIG_DEPTH = MAX_JSON_DEPTH - 4  # config.json, under the manifest's {"metadata": {"config": ...}}
MAX_NDIM = 16
MAX_TENSORS = 1 << 20
STREAM_KINDS = ("scales", "zeros", "parents", "codes")  # the order they are written and read in

# Compressor ids, shared by the header's flags, rans side data and the whole-stream codecs.
RAW, ZSTD, DEFLATE, LZMA = 0, 1, 2, 3
NAMES = {RAW: "raw", ZSTD: "zstd", DEFLATE: "deflate", LZMA: "lzma"}
PORTABLE = (RAW, DEFLATE, LZMA)  # the standard library decodes these
DEFLATE_WBITS = -15  # raw deflate: no zlib header or checksum (the artifact hashes everything)
LZMA_DICT = 1 << 22  # raw LZMA2's dictionary: every reader's (the writer's is at most this)
# The portable codecs, in the race's order: what the standard library and numpy decode, so what
# the packer writes by default and the standalone loader reads.
PORTABLE_CODECS = ("rans", "fields", "deflate", "lzma", "raw")

MAX_ALPHABET = 1 << 12  # rans symbols (or tuples of them); larger alphabets go to the other codecs
MAX_CONTEXTS = 256  # context ids are one byte a position (uint8) in every coder and the loader
MAX_PREC = 16  # interleaved coder: 32-bit states, 16-bit words leave at most 16 table bits
MAX_TUPLE = 8  # symbols a coded unit joins
MAX_LANES = 4096
MAX_STEPS = 1 << 16  # interleaved decode loop bound: ceil(n / lanes) never exceeds it
MAX_UNITS = MAX_LANES * MAX_STEPS  # the most units a stream's coder holds (a bigger stream: deflate, lzma, raw)


@dataclass(frozen=True)
class Context:
    """A rans context variant: its one more param (Choice.kc), the class ids it stores (from the
    tensor's rows, cols and that param) and the row classes its first `rows` ids declare."""

    extra: str | None = None
    extra_max: int = MAX_CONTEXTS
    ids: Callable[[int, int, int], int] | None = None
    row_classes: Callable[[int, int], int] | None = None  # from (k, kc)


CONTEXTS = {
    "none": Context(),  # one table
    "scale": Context(),  # the code row's scale bucket (no ids: decoders rank the scales)
    "row": Context(ids=lambda rows, cols, kc: rows),
    "col": Context(ids=lambda rows, cols, kc: cols),
    "grid": Context("kc", ids=lambda rows, cols, kc: rows + cols, row_classes=lambda k, kc: k // kc),
    "block": Context("rb", 1 << 40, ids=lambda rows, cols, kc: -(-rows // kc) * cols),  # kc rows a block
    "map": Context("kr", ids=lambda rows, cols, kc: rows + kc * cols, row_classes=lambda k, kc: kc),
}
