"""Hostile artifacts: exit 4 with one line, in bounded memory and time; verify ok means unpack works."""

from __future__ import annotations

import random
import sys

import hostile_corpus as hc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recurnorm.budget import format as fmt
from recurnorm.budget import read_artifact, validate, verify_bytes
from recurnorm.errors import ArtifactError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork, /proc and RLIMIT_DATA")

MEM = 1 << 30  # what a child may add to its memory (RLIMIT_DATA)
ALARM = 10  # seconds


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return hc.write(tmp_path_factory.mktemp("hostile"))


def _one_line_exit_4(r: dict, what: str) -> None:
    lines = r["stderr"].strip().splitlines()
    assert r["code"] == 4, f"{what}: exit {r['code']}\n{r['stderr'][-2000:]}"
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{what}: {r['stderr'][-2000:]}"
    assert "Traceback" not in r["stderr"]


def test_the_corpus_covers_every_class():
    kinds = {name.split("/")[0] for name in hc.CASES}
    assert {"bomb", "alias", "codes", "scales", "zeros", "typed", "rans", "zstd", "dtype", "format", "parents"} <= kinds
    assert len(hc.CASES) >= 200


@pytest.mark.slow  # two CLI children per artifact, 200+ artifacts
def test_every_hostile_artifact_is_refused_in_one_line_with_bounded_memory(corpus):
    """verify and unpack, in a child limited to +1 GiB of memory and a 10 s alarm."""
    for path in corpus:
        r = hc.run_cli(["verify", str(path)], MEM, ALARM)
        _one_line_exit_4(r, f"verify {path.name}")
    # unpack reads the same way: the bombs and the quantizer cases, where it used to crash or swap
    for path in corpus:
        if path.name.split("__")[0] in ("bomb", "alias", "codes", "scales", "zeros", "rans"):
            r = hc.run_cli(["unpack", str(path), "-o", str(path.with_suffix(".safetensors"))], MEM, ALARM)
            _one_line_exit_4(r, f"unpack {path.name}")
            assert not path.with_suffix(".safetensors").exists()


def test_the_base_of_the_corpus_is_valid_and_unpacks(tmp_path):
    art = tmp_path / "base.rnpk"
    art.write_bytes(hc.BASE)
    assert hc.run_cli(["verify", str(art)], MEM, ALARM)["code"] == 0
    r = hc.run_cli(["unpack", str(art), "-o", str(tmp_path / "w.safetensors")], MEM, ALARM)
    assert r["code"] == 0, r["stderr"]
    assert (tmp_path / "w.safetensors").exists() and (tmp_path / "config.json").exists()


def test_decoded_bytes_are_bounded_before_decoding_and_the_limit_can_be_raised(tmp_path):
    need = validate.check_manifest(fmt.split_container(hc.BASE)[0])
    with pytest.raises(ArtifactError, match="--max-decoded-bytes"):
        read_artifact(hc.BASE, max_decoded_bytes=need - 1)
    assert read_artifact(hc.BASE, max_decoded_bytes=need).qtensors
    art = tmp_path / "a.rnpk"
    art.write_bytes(hc.BASE)
    r = hc.run_cli(["verify", str(art), "--max-decoded-bytes", str(need - 1)], MEM, ALARM)
    # a valid artifact over a limit the user set: the cap's code (3), not "corrupt" (4)
    assert r["code"] == 3 and "--max-decoded-bytes" in r["stderr"] and "Traceback" not in r["stderr"], r
    r = hc.run_cli(["unpack", str(art), "-o", str(tmp_path / "w.safetensors"), "--max-decoded-bytes", str(need - 1)])
    assert r["code"] == 3 and len(r["stderr"].strip().splitlines()) == 1, r
    assert not (tmp_path / "w.safetensors").exists()
    assert hc.run_cli(["verify", str(art), "--max-decoded-bytes", str(need)], MEM, ALARM)["code"] == 0
    assert hc.run_cli(["verify", str(art), "--max-decoded-bytes", "0"], MEM, ALARM)["code"] == 2


def test_a_bomb_names_the_limit():
    r = verify_bytes(hc.CASES["bomb/rans-one-symbol-4096-lanes-float64"]())
    assert r.exit_code == 4 and "1,073,741,824 bytes" in r.reason


# ------------------------------------------------------------------ round two (issue 25)


def _write(tmp_path, name: str, data: bytes):
    path = tmp_path / (name.replace("/", "__").replace("^", "") + ".rnpk")
    path.write_bytes(data)
    return path


def test_round_two_covers_every_class():
    kinds = {name.split("/")[0] for name in hc.R2_CASES}
    assert {"r2-names", "r2-overflow", "r2-loader", "r2-lenient"} <= kinds
    assert hc.LOADER_MAY_READ <= set(hc.R2_CASES)
    assert any("offset-past-int64" in name for name in hc.VALID)


@pytest.mark.slow  # three children per case: verify, unpack, the loader
def test_round_two_is_refused_by_verify_unpack_and_the_loader(tmp_path):
    """verify and unpack: exit 4, one line, no file written; the loader: RnpkError (a
    ValueError), or for the few it may read (LOADER_MAY_READ) a dict; all in +1 GiB and 10 s."""
    for name, make in hc.R2_CASES.items():
        path = _write(tmp_path, name, make())
        _one_line_exit_4(hc.run_cli(["verify", str(path)], MEM, ALARM), f"verify {name}")
        out = path.with_suffix(".safetensors")
        _one_line_exit_4(hc.run_cli(["unpack", str(path), "-o", str(out)], MEM, ALARM), f"unpack {name}")
        assert not out.exists() and not out.with_name("config.json").exists()
        got = hc.run_loader(path, MEM, ALARM)
        assert got["code"] == 0, (name, got)  # not killed: no alarm, no crash
        if name not in hc.LOADER_MAY_READ:
            assert not got["ok"], name
        assert got["ok"] or (got["type"] == "RnpkError" and got["value_error"]), (name, got)


@pytest.mark.slow  # one loader child per corpus case
def test_the_loader_raises_only_its_own_error_on_the_whole_corpus(corpus):
    """Every hostile artifact, round one's included: the standalone loader raises RnpkError
    (a ValueError) or reads it, never another exception, within +1 GiB and 10 s (round one's
    bombs, 2^20 aliases and 64 MiB manifest among them)."""
    for path in corpus:
        got = hc.run_loader(path, MEM, ALARM)
        assert got["code"] == 0 and (got["ok"] or got["type"] == "RnpkError"), (path.name, got)
        assert got["ok"] or got["value_error"], (path.name, got)


@pytest.mark.slow  # 128-256 MB decoded, through every reader
@pytest.mark.parametrize("name", sorted(hc.VALID))
def test_odd_valid_artifacts_read_the_same_in_verify_unpack_and_the_loader(name, tmp_path):
    """What the packer writes (uint64 offsets past int64, empty tensors) or an honest 17 KB
    artifact of 128 MB decoded: verify 0; unpack's file reads back (safetensors) with the very
    bits the loader returns; the loader's peak is within 2 x decoded bytes + 64 MB."""
    from safetensors.torch import load_file

    data = hc.VALID[name]()
    path = _write(tmp_path, name, data)
    assert hc.run_cli(["verify", str(path)], MEM, ALARM)["code"] == 0
    out = path.with_suffix(".safetensors")
    r = hc.run_cli(["unpack", str(path), "-o", str(out)], MEM, ALARM)
    assert r["code"] == 0, r["stderr"]
    written = hc.digests(load_file(str(out)))
    out.unlink()
    got = hc.run_loader(path, MEM, ALARM)
    assert got["ok"] and got["code"] == 0, got
    assert got["digests"] == written
    decoded = validate.check_manifest(fmt.split_container(data)[0])
    assert got["peak"] <= 2 * decoded + (64 << 20), (got["peak"] >> 20, decoded >> 20)


def test_the_compact_loader_raises_the_same_error(tmp_path):
    for name in ("r2-loader/deflate-bomb-declares-8GB", "r2-loader/table-blob-bad-lzma", "typed/int4.shape=string"):
        path = _write(tmp_path, name, hc.CASES[name]())
        got = hc.run_loader(path, MEM, ALARM, compact=True)
        assert got["type"] == "RnpkError" and got["value_error"], (name, got)


@pytest.mark.slow  # 300 hypothesis examples
@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_verify_ok_means_a_file_that_reads_back_and_the_loader_agrees(seed):
    """Mutations of every base (codecs, layouts, contexts): verify ok => the .safetensors unpack
    writes reads back with equal tensors, and (portable) the loader returns the same bits;
    verify refusing => the loader raises nothing but RnpkError."""
    from recurnorm.budget import Budget, rnpk_load

    data = hc.mutated(random.Random(seed), hc.bases()[seed % len(hc.bases())])
    rep = verify_bytes(data)
    assert rep.exit_code in (0, 4), rep.reason
    try:
        got = hc.digests(rnpk_load.load(data))
    except rnpk_load.RnpkError:
        got = None
    if not rep.ok:
        return
    written = hc.digests(hc.unpack_read_back(data))
    assert written == hc.digests(hc.unpack_in_memory(data))
    if verify_bytes(data, Budget(loader=4000)).ok:
        assert got == written


# Any text, surrogates included (hypothesis leaves them out unless asked), and the one
# name safetensors reserves.
NAMES = st.text(st.characters(exclude_categories=()), max_size=12) | st.sampled_from(["__metadata__", "\udc00"])


@settings(max_examples=200, deadline=None, derandomize=True)
@given(NAMES)
def test_any_name_the_packer_takes_reads_back_and_the_rest_are_refused(name):
    """Names (surrogates and __metadata__ included): pack_qtensors refuses exactly those verify
    refuses; a forged artifact verify accepts unpacks to a file that reads back by that name."""
    import numpy as np

    from recurnorm.errors import QuantError
    from recurnorm.quant.qtensor import QTensor

    qt = QTensor("raw", (3,), "int64", np.arange(3, dtype=np.int64).reshape(1, 3))
    forged = hc._json_signed(*fmt.split_container(pack_qtensors_named("x", qt)))
    m, payload = fmt.split_container(forged)
    m["tensors"][0]["name"] = name
    data = hc._json_signed(m, payload)
    rep = verify_bytes(data)
    try:
        pack_qtensors_named(name, qt)
        packs = True
    except QuantError:
        packs = False
    assert packs == rep.ok, (name, rep.reason)
    if rep.ok:
        assert list(hc.unpack_read_back(data)) == [name]


def pack_qtensors_named(name, qt):
    from recurnorm.budget import pack_qtensors

    return pack_qtensors({name: qt})
