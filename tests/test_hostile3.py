"""Hostile inputs, round three (issue 43): names that reach a terminal, special files as
inputs and outputs, limits checked before the work, odd state dicts, half-done writes, exit
codes; and the library and the standalone loader agreeing on every dtype and offset.

Each CLI case of tests/hostile_corpus.py's R3_CASES runs in a forked child with +1 GiB of
memory (RLIMIT_DATA) and a 10 s alarm, so a regression fails instead of taking the machine."""

from __future__ import annotations

import json
import sys

import hostile_corpus as hc
import numpy as np
import pytest

from recurnorm.budget import format as fmt
from recurnorm.budget import pack_qtensors, verify_bytes
from recurnorm.budget.codecs import DTYPES
from recurnorm.quant.qtensor import QTensor

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork, FIFOs and RLIMIT_DATA")

MEM = 1 << 30
ALARM = 10


def test_round_three_covers_every_class():
    kinds = {name.split("/")[0] for name in hc.R3_CASES}
    assert {"names", "special-out", "special-in", "limits", "odd", "writes", "codes"} <= kinds
    assert set(hc.CONTROL_CHARS) >= {chr(c) for c in [*range(32), 127, *range(0x80, 0xA0), 0x202E, 0x2066]}


@pytest.mark.parametrize("name", sorted(hc.R3_CASES))
def test_each_class_is_one_line_with_its_exit_code_and_writes_only_what_was_asked(name, tmp_path):
    """The exit code the class calls for; a refusal is one error line, never a traceback; no
    control or bidi character on stdout or stderr; no file in the folder created, changed or
    replaced (a FIFO or device node stays one) except the outputs asked for; within the
    child's +1 GiB and 10 s (an alarm or the memory limit would end it otherwise)."""
    r = hc.run_input_case(name, tmp_path, MEM, ALARM)
    assert r["code"] == r["expected"], r["stderr"]  # (the whole dict shows truncated)
    assert r["one_line"] and not r["traceback"], r
    assert not r["controls"], r
    assert not r["changed"], r


def test_the_names_cases_print_every_name_escaped(tmp_path):
    """The escaped spelling is what shows: the names are there, only made printable."""
    r = hc.run_cli(["inspect", str(hc._names_ckpt(tmp_path))], MEM, ALARM)
    assert r["code"] == 0
    assert r"\x1b]0;owned\x07\x1b[31mred\r\u202etxt.evil" in r["stdout"]  # in both tables
    assert r["stdout"].count(r"\u202e") >= 2 and r"w\x9b" in r["stdout"]


def _many_cores():
    import os

    os.sched_getaffinity = lambda pid: set(range(64))


def test_pack_on_a_64_core_machine_under_the_memory_limit(tmp_path):
    """The default --jobs is the cores available: 64 threads' stacks and arenas fit in no
    +1 GiB limit, and pack codes on the threads the system gives, never a traceback."""
    r = hc.run_cli(hc._pack_args(tmp_path, hc._names_ckpt(tmp_path)), MEM, ALARM, _many_cores)
    assert r["code"] == 0 and "Traceback" not in r["stderr"], r["stderr"][-2000:]


def test_pack_dot_names_the_artifact_after_the_folder(tmp_path):
    r = hc.run_input_case("odd/pack-dot", tmp_path, MEM, ALARM)
    assert r["code"] == 0 and (tmp_path / "ckpt.rnpk").is_file(), r


def test_unpack_leaves_the_old_pair_when_the_second_part_fails(tmp_path):
    r = hc.run_input_case("writes/unpack-second-part-fails", tmp_path, MEM, ALARM)
    assert r["code"] == 1 and "config.json" in r["stderr"], r
    assert (tmp_path / "u" / "w.safetensors").read_bytes() == b"old weights"
    assert (tmp_path / "u" / "config.json").read_text() == "{}"
    assert sorted(p.name for p in (tmp_path / "u").iterdir()) == ["config.json", "w.safetensors"]  # no temp left


def test_sigint_is_130_with_one_line_and_no_file(tmp_path):
    r = hc.run_input_case("codes/sigint", tmp_path, MEM, ALARM)
    assert r["code"] == 130 and r["stderr"].strip().splitlines()[-1] == "interrupted", r
    assert not (tmp_path / "o.rnpk").exists()


# ------------------------------------------------------------------ the library and the loader agree


def _rans_raw(dtype: str, values: np.ndarray) -> bytes:
    return pack_qtensors({"t": QTensor("raw", (values.size,), dtype, values.reshape(1, -1))}, codecs=["rans", "raw"])


def _loader_outcome(data: bytes):
    from helpers import standalone_loader

    out = []
    for compact in (False, True):
        try:
            got = hc.digests(standalone_loader(compact)["load"](data))
        except ValueError as exc:  # RnpkError is one
            assert type(exc).__name__ == "RnpkError", exc
            got = None
        out.append(got)
    assert out[0] == out[1]
    return out[0]


INT_DTYPES = [d for d in DTYPES if d != "bool" and not d.startswith("float")]
OFFSETS = [0, 1, -1, 2**31, 2**32 + 1, 2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1, -(2**63), -(2**63) - 1, -(2**64)]


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_every_rans_offset_is_read_alike_by_verify_and_the_loader(dtype):
    """For every integer dtype and an offset at each edge of int64/uint64: verify ok means the
    loader reads it, with unpack's bits; the loader raises nothing but RnpkError. (It may read
    what verify refuses: it adds offsets modulo the dtype's width and checks the codes' hash,
    where verify asks that the offset fit the dtype: the same bits, a stricter rule.)"""
    info = np.iinfo(dtype)
    values = (np.arange(300) % 5).astype(dtype) + np.array(info.max - 10 if info.min == 0 else 0, dtype=dtype)
    data = _rans_raw(dtype, values)
    m, payload = fmt.split_container(data)
    assert m["tensors"][0]["streams"]["codes"]["codec"] == "rans"
    for off in OFFSETS:
        m2 = json.loads(json.dumps(m))
        m2["tensors"][0]["streams"]["codes"]["params"]["offset"] = off
        forged = hc._json_signed(m2, payload)
        ok = verify_bytes(forged).ok
        got = _loader_outcome(forged)
        if ok:
            assert got == hc.digests(hc.unpack_in_memory(forged)), (dtype, off)


# numpy reads these dtype names; recurnorm writes none of them (torch takes none but the last).
FOREIGN_DTYPES = ["object", "complex64", "complex128", "datetime64[s]", "timedelta64", "S4", "U2", "V8", "longdouble"]


@pytest.mark.parametrize("where", ["tensor", "stream", "both"])
@pytest.mark.parametrize("dtype", FOREIGN_DTYPES)
def test_a_dtype_recurnorm_does_not_write_is_refused_by_both(dtype, where):
    """verify refuses (4); the loader raises RnpkError (a ValueError), never TypeError, for a
    tensor of that dtype. A stream of that dtype it may read (numpy views the bytes; their hash
    is checked): then with the bits recurnorm wrote."""
    data = _rans_raw("int64", np.arange(300, dtype=np.int64) % 7)
    m, payload = fmt.split_container(data)
    if where in ("tensor", "both"):
        m["tensors"][0]["dtype"] = dtype
    if where in ("stream", "both"):
        m["tensors"][0]["streams"]["codes"]["dtype"] = dtype
    forged = hc._json_signed(m, payload)
    assert verify_bytes(forged).exit_code == 4
    got = _loader_outcome(forged)
    assert got is None if where != "stream" else got in (None, hc.digests(hc.unpack_in_memory(data)))


@pytest.mark.parametrize("dtype", sorted({*DTYPES, "bfloat16"}))
def test_every_dtype_recurnorm_writes_is_read_alike(dtype):
    """Each dtype the format allows, packed as pack packs it: verify ok and the loader's bits equal."""
    import torch

    from recurnorm.export.pack import pack_state
    from recurnorm.export.spec import build_policy

    t = (torch.arange(64) % 3).to(getattr(torch, dtype)) if dtype != "bool" else torch.arange(64) % 2 == 0
    data = pack_state({"t": t.reshape(8, 8), "v": t[:8]}, build_policy("int8"))
    assert verify_bytes(data).ok
    assert _loader_outcome(data) == hc.digests(hc.unpack_in_memory(data))
