"""pack / unpack / verify / inspect through the click group, on a foreign checkpoint."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from recurnorm.budget import spec
from recurnorm.cli.main import main


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert")
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(500, 128, generator=g) * 0.02
    sd = {
        "bert.embeddings.word_embeddings.weight": emb,
        "bert.encoder.layer.0.attention.self.query.weight": torch.randn(384, 256, generator=g) * 0.05,
        "bert.encoder.layer.0.attention.self.query.bias": torch.randn(384, generator=g),
        "bert.encoder.layer.0.output.LayerNorm.weight": torch.ones(128),
        "bert.encoder.layer.0.output.LayerNorm.bias": torch.zeros(128),
        "bert.embeddings.position_ids": torch.arange(512).unsqueeze(0),
        "cls.predictions.decoder.weight": emb,  # tied
    }
    torch.save(sd, d / "model.pt")
    st = dict(sd)
    del st["cls.predictions.decoder.weight"]
    (d / "hf").mkdir()
    save_file(st, d / "hf" / "model.safetensors")
    (d / "hf" / "config.json").write_text(json.dumps({"d_model": 128}))
    return d, sd


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("src", ["model.pt", "hf"])
def test_pack_unpack_foreign(ckpts, tmp_path, src):
    d, sd = ckpts
    art = tmp_path / "a.rnpk"
    r = _run("pack", d / src, "-q", "int8", "-o", art)
    assert r.exit_code == 0, r.output
    assert _run("pack", d / src, "-q", "int8", "-o", art).exit_code == 2  # no clobber
    out = tmp_path / "w.safetensors"
    r = _run("unpack", art, "-o", out)
    assert r.exit_code == 0, r.output
    back = load_file(out)
    assert torch.equal(back["bert.embeddings.position_ids"], sd["bert.embeddings.position_ids"])
    assert torch.equal(back["bert.encoder.layer.0.output.LayerNorm.weight"], torch.ones(128))
    q = "bert.encoder.layer.0.attention.self.query.weight"
    assert (back[q] - sd[q]).abs().max() < 0.01
    if src == "model.pt":
        assert torch.equal(back["cls.predictions.decoder.weight"], back["bert.embeddings.word_embeddings.weight"])
    else:
        assert json.loads((tmp_path / "config.json").read_text()) == {"d_model": 128}
    r = _run("inspect", art, "--json")
    assert r.exit_code == 0 and json.loads(r.output)["tensors"]


def test_over_cap_refuses_and_code_counts(ckpts, tmp_path):
    d, _ = ckpts
    art = tmp_path / "a.rnpk"
    assert _run("pack", d / "model.pt", "-q", "int4", "-o", art).exit_code == 0
    size = art.stat().st_size
    code = tmp_path / "run.py"
    code.write_text("print('hi')\n")
    assert _run("verify", art, "--max-bytes", size, "--code", code).exit_code == 3
    assert _run("verify", art, "--max-bytes", size + 12).exit_code == 0
    other = tmp_path / "b.rnpk"
    r = _run("pack", d / "model.pt", "-q", "int4", "-o", other, "--max-bytes", size + 11, "--code", code)
    assert r.exit_code == 3
    assert "bytes missing" in r.output and "bits/w" in r.output
    assert not other.exists()


def test_verify_exit_codes(ckpts, tmp_path):
    d, _ = ckpts
    art = tmp_path / "a.rnpk"
    assert _run("pack", d / "model.pt", "-q", "ternary", "-o", art).exit_code == 0
    data = art.read_bytes()
    assert _run("verify", art).exit_code == 0
    r = _run("verify", art, "--json")
    assert json.loads(r.output)["ok"] is True
    cases = {
        "magic": b"NOPE" + data[4:],
        "version": data[:4] + struct.pack("<H", spec.VERSION + 1) + data[6:],
        "checksum": data[:-10] + bytes([data[-10] ^ 0x40]) + data[-9:],
        "truncated": data[: len(data) // 2],
    }
    for why, bad in cases.items():
        p = tmp_path / f"{why}.rnpk"
        p.write_bytes(bad)
        r = _run("verify", p)
        assert r.exit_code == 4, why
        assert len(r.output.strip().splitlines()) == 1
    assert _run("verify", tmp_path / "missing.rnpk").exit_code == 4


def test_pack_effort_max_is_no_larger_and_reads_the_same(ckpts, tmp_path):
    d, _ = ckpts
    sizes = {}
    for effort in ("normal", "max"):
        art = tmp_path / f"{effort}.rnpk"
        r = _run("pack", d / "hf", "-q", "int4", "--keep-float-max-numel", "0", "--effort", effort, "-o", art)
        assert r.exit_code == 0, r.output
        assert _run("verify", art).exit_code == 0
        sizes[effort] = art.stat().st_size
    assert sizes["max"] <= sizes["normal"]
    assert _run("pack", d / "hf", "--effort", "huge", "-o", tmp_path / "x.rnpk").exit_code == 2
