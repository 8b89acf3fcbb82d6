"""The standalone loader as shipped code: its readable source and a compact form for the cap.

`rnpk_load.py` (beside this file) reads artifacts with the standard library and numpy
alone, so it can live in the counted code of a submission. Its compact form is the
same program with docstrings and comments dropped and private names shortened, in the
self-extracting file `recurnorm wrap --encoding latin1` writes (lzma, a latin-1 literal):
the trick Parameter Golf competitors use for their own code, applied to ours.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..codewrap import Payload, minify_renamed
from ..codewrap.api import program_name
from ..codewrap.selfextract import make
from . import format as fmt
from . import spec

SOURCE = Path(__file__).with_name("rnpk_load.py")
MODULE = "rnpk_load"  # the name programs import it by
PUBLIC = {"load", "decode", "RnpkError"}  # the names a user calls (and catches), kept as they are


def loader_source() -> str:
    """The loader's readable Python source."""
    return SOURCE.read_text(encoding="utf-8")


def minified_loader() -> str:
    """The loader minified: no docstrings or comments, short private names (fields too,
    unless a numpy array has an attribute of that name)."""
    return minify_renamed(loader_source(), PUBLIC, set(dir(np.ndarray)))


def compact_loader() -> bytes:
    """The compact loader file's bytes: the minified loader as a self-extracting file
    (latin-1: write these bytes as they are; 4,000 bytes at most, tests/test_loader.py)."""
    return make(Payload(((program_name(f"{MODULE}.py"), minified_loader()),), "lzma", "latin1"))


def loader_problem(data: bytes, manifest: dict) -> str | None:
    """Why the standalone loader cannot read a (valid) artifact, or None when it can: it reads
    format 3 with portable compressors everywhere (header, streams, rans side data)."""
    from . import rans

    _, version, flags, mlen, _ = spec.HEADER.unpack_from(data, 0)
    if version != spec.VERSION:
        return f"format version {version} (the loader reads {spec.VERSION}: pack it again)"
    if flags & spec.MANIFEST_COMPRESSOR_MASK not in spec.PORTABLE:
        return "the manifest is zstd-compressed"
    payload = fmt.spans(data, version, mlen)[1]
    for t in manifest["tensors"]:
        for kind, s in t.get("streams", {}).items():
            where = f"tensor {t['name']!r} {kind}"
            if s["codec"] not in spec.PORTABLE_CODECS:
                return f"{where} uses the {s['codec']} codec"
            body = payload[s["offset"] : s["offset"] + s["length"]]
            if s["codec"] == "fields":  # its tail, then a rans body
                if s["params"]["tz"] not in spec.PORTABLE:
                    return f"{where} has a zstd-compressed fields tail"
                body = body[s["params"]["tail"] :]
            sides = rans.side_header(body, 2)[:2] if s["codec"] in ("rans", "fields") else ()
            if any(z not in spec.PORTABLE for _, z in sides):  # (the table's and the class ids')
                return f"{where} has zstd-compressed rans side data"
    return None
