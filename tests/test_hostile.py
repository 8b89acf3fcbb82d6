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

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork, /proc and RLIMIT_AS")

MEM = 1 << 30  # what a child may add to its address space
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
    assert {"bomb", "alias", "codes", "scales", "zeros", "typed", "rans", "zstd", "dtype", "format"} <= kinds
    assert len(hc.CASES) >= 200


@pytest.mark.slow  # two CLI children per artifact, 200+ artifacts
def test_every_hostile_artifact_is_refused_in_one_line_with_bounded_memory(corpus):
    """verify and unpack, in a child limited to +1 GiB of address space and a 10 s alarm."""
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
    _one_line_exit_4(r, "verify under its decoded size")
    assert hc.run_cli(["verify", str(art), "--max-decoded-bytes", str(need)], MEM, ALARM)["code"] == 0
    assert hc.run_cli(["verify", str(art), "--max-decoded-bytes", "0"], MEM, ALARM)["code"] == 2


def test_a_bomb_names_the_limit():
    r = verify_bytes(hc.CASES["bomb/rans-one-symbol-4096-lanes-float64"]())
    assert r.exit_code == 4 and "1,073,741,824 bytes" in r.reason


@pytest.mark.slow  # 300 hypothesis examples
@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_verify_ok_implies_unpack_succeeds(seed):
    """Re-signed manifest and payload mutations: verify ok must mean unpack succeeds, and
    verify ok with a loader counted must mean the standalone loader gives the same tensors."""
    from recurnorm.budget import Budget, rnpk_load

    data = hc.mutated(random.Random(seed))
    rep = verify_bytes(data)
    assert rep.exit_code in (0, 4), rep.reason
    if rep.ok:
        ref = hc.unpack_in_memory(data)
        if verify_bytes(data, Budget(loader=4000)).ok:
            got = rnpk_load.load(data)
            assert list(got) == list(ref) and all(got[k].dtype == ref[k].dtype for k in got)
