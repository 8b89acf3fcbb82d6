"""Frozen artifacts (tests/data/goldens/, made by tests/data/make_goldens.py): the library and
both standalone loaders read each to the recorded tensors, and re-packing an artifact's codes
gives the recorded bytes. A writer or reader change that alters what a released artifact
means, or what the same codes pack to, fails here."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch
from helpers import standalone_loader

from recurnorm.budget import format as fmt
from recurnorm.budget import read_artifact, spec, unpack
from recurnorm.budget.rans import side_header

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
import make_goldens  # noqa: E402

INDEX = json.loads((DATA / "goldens.json").read_text())
NAMES = sorted(INDEX)


def _golden(name: str) -> bytes:
    data = (DATA / "goldens" / f"{name}.rnpk").read_bytes()
    assert hashlib.sha256(data).hexdigest() == INDEX[name]["sha256"], f"{name}.rnpk is not the recorded file"
    return data


def _digests(tensors: dict) -> dict:
    return {name: make_goldens.tensor_digest(t) for name, t in tensors.items()}


def test_the_goldens_cover_the_format_and_stay_small():
    files = sorted((DATA / "goldens").glob("*.rnpk"))
    assert sorted(f.stem for f in files) == NAMES
    assert sum(f.stat().st_size for f in DATA.rglob("*") if f.is_file()) < 200_000
    covered = set().union(*(make_goldens.coverage(_golden(n)) for n in NAMES))
    want = {f"rans {c}" for c in ("none", "scale", "row", "col", "grid", "block", "map", "tuple", "wide")}
    want |= {"fields", "raw", "zstd", "lqer", "alias", "version 1", "version 2", "version 3"}
    want |= {f"{c} {lay}" for c in ("deflate", "lzma") for lay in ("plain", "shuffle")}
    want |= {f"parents {c}" for c in ("rans", "deflate", "lzma")} | {"scales fields", "zeros deflate"}
    want |= {f"format {q}" for q in ("int2", "int3", "int4", "int5", "int6", "int7", "int8", "int8_pg")}
    want |= {f"format {q}" for q in ("ternary", "nf4", "fp16", "bf16", "fp32", "raw")}
    assert want <= covered, sorted(want - covered)


@pytest.mark.parametrize("name", NAMES)
def test_the_library_reads_each_golden_to_the_recorded_tensors(name):
    data = _golden(name)
    assert read_artifact(data).manifest["version"] == INDEX[name]["version"]
    assert _digests(unpack(data)) == INDEX[name]["tensors"]


@pytest.mark.parametrize("compact", [False, True], ids=["readable", "compact"])
@pytest.mark.parametrize("name", NAMES)
def test_both_standalone_loaders_read_each_golden_to_the_recorded_tensors(name, compact):
    data, loader = _golden(name), standalone_loader(compact)
    if INDEX[name]["version"] == 2:  # the loader reads the format pack writes, 3: a 2 is refused,
        with pytest.raises(ValueError, match="not a format-3"):
            loader["load"](data)
        data = make_goldens.relayout(data, 3)  # and read as the same artifact laid out as 3
    if INDEX[name]["version"] == 1 or "zstd" in (INDEX[name]["pack"]["codecs"] or ()):
        # The loader reads the portable format 3 only: anything else is refused, never misread.
        with pytest.raises(ValueError, match="not a format-3|zstd is not portable"):
            loader["load"](data)
        return
    got, ref = loader["load"](data), unpack(data)
    assert list(got) == list(ref)  # the same names in the same order
    assert _digests(got) == INDEX[name]["tensors"]
    arrays, _ = loader["decode"](data)  # numpy alone: the same bytes
    for tname, t in ref.items():
        assert arrays[tname].tobytes() == t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("name", NAMES)
def test_repacking_each_golden_gives_the_recorded_bytes(name):
    data, rec = _golden(name), INDEX[name]
    again = make_goldens.repack(data, rec["pack"]["codecs"], rec["pack"]["effort"])
    assert hashlib.sha256(again).hexdigest() == rec["repack_sha256"]
    if rec["version"] > 1:  # the packer is a function of the codes and its options
        assert again == (data if rec["version"] == spec.VERSION else make_goldens.relayout(data, spec.VERSION))
    else:  # a format-1 file re-packs to format 3: the same tensors
        assert _digests(unpack(again)) == rec["tensors"]


def test_the_format_1_golden_is_laid_out_as_format_1():
    """Header version 1, its manifest a zstd frame (flag bit 0), and rans side blobs flagged by
    one bit each (2·len + z), some of them magicless zstd frames."""
    for name in (n for n in NAMES if INDEX[n]["version"] == 1):
        data = _golden(name)
        _, version, flags, _, _ = spec.HEADER.unpack_from(data, 0)
        assert (version, flags) == (1, 1)
        manifest, payload = fmt.split_container(data)
        zstd_blobs = 0
        for t in manifest["tensors"]:
            for s in t.get("streams", {}).values():
                if s["codec"] == "rans":
                    sides = side_header(bytes(payload[s["offset"] : s["offset"] + s["length"]]), 1)[:2]
                    zstd_blobs += sum(z == spec.ZSTD for _, z in sides)
        assert zstd_blobs, name
