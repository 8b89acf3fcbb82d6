"""Checkpoints of any size: pack streams a .safetensors file tensor by tensor (the same bytes
as packing it in memory, for any --jobs), readers bound decode memory by --max-decoded-bytes
alone (no element wall), and older format versions still read."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from recurnorm.budget import api, spec, validate
from recurnorm.budget import format as fmt
from recurnorm.cli.main import main
from recurnorm.errors import ArtifactError
from recurnorm.export.pack import pack_checkpoint
from recurnorm.export.spec import build_policy


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama") / "hf"
    d.mkdir()
    g = torch.Generator().manual_seed(0)
    sd = {
        "model.embed_tokens.weight": (torch.randn(600, 64, generator=g) * 0.02).bfloat16(),
        "model.layers.0.mlp.up_proj.weight": (torch.randn(160, 64, generator=g) * 0.05).bfloat16(),
        "model.layers.0.self_attn.q_proj.weight": (torch.randn(64, 64, generator=g) * 0.05).bfloat16(),
        "model.layers.0.input_layernorm.weight": torch.ones(64, dtype=torch.bfloat16),
        "model.norm.weight": torch.randn(64, generator=g),
        "position_ids": torch.arange(256),
    }
    save_file({f"_orig_mod.{k}": v for k, v in sd.items()}, d / "model.safetensors")
    (d / "config.json").write_text(json.dumps({"hidden_size": 64}))
    return d, sd


@pytest.mark.parametrize("quant", ["int8", "int4", "bf16", "int6:lqer=2"])
def test_streamed_pack_is_the_in_memory_artifact_for_any_jobs(ckpt, tmp_path, quant):
    d, _ = ckpt
    outs = []
    for jobs in (1, 2):
        out = tmp_path / f"j{jobs}.rnpk"
        r = _run("pack", d, "-q", quant, "--jobs", jobs, "-o", out)
        assert r.exit_code == 0, r.output
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert outs[0] == pack_checkpoint(d, build_policy(quant)).data  # (the whole state dict in memory)
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]


def test_unpack_writes_each_tensor_as_unpacking_all_at_once(ckpt, tmp_path):
    d, sd = ckpt
    art, out = tmp_path / "a.rnpk", tmp_path / "w.safetensors"
    assert _run("pack", d, "-q", "bf16", "-o", art).exit_code == 0
    assert _run("unpack", art, "-o", out).exit_code == 0
    back = load_file(out)
    assert set(back) == set(sd) and all(torch.equal(back[k], v) for k, v in sd.items())  # bf16 is lossless
    from helpers import write_safetensors

    whole = tmp_path / "whole.safetensors"
    with open(whole, "wb") as f:  # the writer of a whole state dict gives the same file
        write_safetensors(f, api.unpack(art.read_bytes()))
    assert whole.read_bytes() == out.read_bytes()


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_self_check_decodes_the_bytes_written_each_once(ckpt, tmp_path, monkeypatch, jobs):
    """The payload is written once, in place, past the header's 48 bytes; the manifest follows
    it and the header goes last into its room. The self-check decodes the file's bytes: one that
    the disk gets wrong is found, and nothing is written."""
    from recurnorm import io as rio
    from recurnorm.export import stream

    d, _ = ckpt
    writes, headers, flip = [], [], []

    class Recorded(rio.WriteBehind):
        def write(self, data):
            data = bytearray(data)
            writes.append(len(data))
            data[len(data) // 2] ^= 1 if len(writes) in flip else 0
            super().write(data)

    real = stream.write_at
    monkeypatch.setattr(stream, "WriteBehind", Recorded)
    monkeypatch.setattr(stream, "write_at", lambda f, pos, data: (headers.append((pos, len(data))), real(f, pos, data)))
    out = tmp_path / "a.rnpk"
    assert _run("pack", d, "-q", "bf16", "--jobs", jobs, "-o", out).exit_code == 0
    good = out.read_bytes()
    manifest, _ = fmt.read_container(good)
    assert headers == [(0, spec.HEADER_SIZE)] and sum(writes) == manifest["payload_length"]
    assert len(good) == spec.HEADER_SIZE + sum(writes) + spec.HEADER.unpack_from(good)[3]  # the manifest last
    writes.clear()
    flip.append(3)  # the payload's 3rd stream lands with one bit changed
    bad = tmp_path / "b.rnpk"
    r = _run("pack", d, "-q", "bf16", "--jobs", jobs, "-o", bad)
    assert r.exit_code != 0 and "would not pass verify" in r.output and "checksum mismatch" in r.output
    assert not bad.exists() and not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]
    flip.clear()
    assert _run("pack", d, "-q", "bf16", "--jobs", jobs, "-o", bad).exit_code == 0 and bad.read_bytes() == good


def test_a_system_without_pwrite_packs_the_same_bytes(ckpt, tmp_path, monkeypatch):
    """Windows has no os.pwrite: the header goes in under a lock with a seek, which moves the
    file's position; the artifact is the same."""
    import os

    d, _ = ckpt
    outs = [tmp_path / "a.rnpk", tmp_path / "b.rnpk"]
    assert _run("pack", d, "-q", "int8", "-o", outs[0]).exit_code == 0
    monkeypatch.delattr(os, "pwrite")
    assert _run("pack", d, "-q", "int8", "-o", outs[1]).exit_code == 0
    assert outs[0].read_bytes() == outs[1].read_bytes()


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_write_that_fails_is_what_pack_reports(ckpt, tmp_path, monkeypatch, jobs):
    """The disk fills while the payload is written: that error reaches the user, and the temp
    file goes."""
    import errno

    from recurnorm import io as rio

    d, _ = ckpt
    real, calls = rio.WriteBehind.done, []

    def full(self, pos, n):  # (called by the writer thread once each write is in the file)
        calls.append(pos)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, pos, n)

    monkeypatch.setattr(rio.WriteBehind, "done", full)
    with pytest.raises(OSError, match="No space left"):
        _run("pack", d, "-q", "bf16", "--jobs", jobs, "-o", tmp_path / "a.rnpk")
    assert calls and not list(tmp_path.iterdir())


def test_inspect_packs_a_checkpoint_as_pack_does_tensor_by_tensor(ckpt, tmp_path, monkeypatch):
    import tempfile

    import recurnorm.export.load as load

    d, _ = ckpt

    def whole_state(*a, **k):
        raise AssertionError("inspect read the whole state dict")

    monkeypatch.setattr(load, "load_checkpoint_state", whole_state)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "t"))  # (where its temporary artifact goes)
    (tmp_path / "t").mkdir()
    reports = []
    for jobs in (1, 2):
        r = _run("inspect", d, "-q", "int8", "--jobs", jobs, "--json")
        assert r.exit_code == 0, r.output
        reports.append(json.loads(r.output))
    assert reports[0] == reports[1]
    assert not list((tmp_path / "t").iterdir())  # (the temporary artifact is gone)
    art = tmp_path / "a.rnpk"
    assert _run("pack", d, "-q", "int8", "-o", art).exit_code == 0
    of_artifact = json.loads(_run("inspect", art, "--jobs", 2, "--json").output)
    assert of_artifact["tensors"] == reports[0]["tensors"] and of_artifact["cap"] == reports[0]["cap"]


def test_the_decoded_limit_is_checked_before_packing(ckpt, tmp_path):
    d, _ = ckpt
    r = CliRunner().invoke(
        main, ["pack", str(d), "-q", "int8", "-o", str(tmp_path / "a.rnpk"), "--max-decoded-bytes", "1000"]
    )
    assert r.exit_code != 0 and "--max-decoded-bytes" in r.output and "at least" in r.output
    assert not (tmp_path / "a.rnpk").exists()


def test_the_default_limit_grows_with_the_artifact():
    assert validate.default_max_decoded_bytes(1000) == 1 << 30  # a few KB of hostile file: 1 GiB
    assert validate.default_max_decoded_bytes(1 << 30) > 1 << 30
    assert validate.default_max_decoded_bytes(1 << 50) < 1 << 50  # no more than the machine has


def _as_version(data: bytes, version: int) -> bytes:
    """The same artifact as an earlier format laid it out (raw manifest, flags 0): what earlier
    packers wrote (version 1's rans streams differ too: give it none)."""
    manifest, payload = fmt.split_container(data)
    manifest["version"] = version
    return fmt.container(fmt.dumps(manifest), payload, 0, version)


def test_versions_1_2_and_3_read(ckpt):
    d, sd = ckpt
    v3 = pack_checkpoint(d, build_policy("bf16")).data
    v1 = _as_version(api.pack_qtensors(api.read_artifact(v3).qtensors, codecs=("deflate", "raw")), 1)
    for data, version in ((v3, 3), (_as_version(v3, 2), 2), (v1, 1)):
        assert spec.HEADER.unpack_from(data)[1] == version
        assert api.verify_bytes(data).ok
        back = api.unpack(data)
        assert all(torch.equal(back[k], v) for k, v in sd.items())


@pytest.mark.slow  # ~1.1 GB of weights through pack, verify and unpack
def test_a_checkpoint_past_2_28_weights_packs_verifies_and_unpacks_bit_for_bit(tmp_path):
    n = (1 << 26) + 1000  # five tensors: 2^28 weights and more (the old wall), 640 MB of bf16
    ones = torch.ones(n, dtype=torch.bfloat16)
    save_file({f"w{i}": ones * i for i in range(5)}, tmp_path / "big.safetensors")
    del ones
    art, out = tmp_path / "big.rnpk", tmp_path / "back.safetensors"
    limit = 5 * n * 4 + (1 << 20)  # bf16 decodes through 4 bytes a weight
    r = _run(
        "pack",
        tmp_path / "big.safetensors",
        "-q",
        "bf16",
        "-o",
        art,
        "--max-bytes",
        10**9,
        "--max-decoded-bytes",
        limit,
    )
    assert r.exit_code == 0, r.output
    assert _run("verify", art, "--max-bytes", 10**9, "--max-decoded-bytes", limit).exit_code == 0
    with pytest.raises(ArtifactError, match="--max-decoded-bytes"):  # the default: 1 GiB for a small file
        api.read_artifact(api.read_artifact_file(art))
    assert _run("unpack", art, "-o", out, "--max-decoded-bytes", limit).exit_code == 0
    back = load_file(out)
    assert sorted(back) == [f"w{i}" for i in range(5)]
    assert all(back[f"w{i}"].shape == (n,) and bool((back[f"w{i}"] == i).all()) for i in range(5))
