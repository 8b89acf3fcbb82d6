"""Checkpoint folders split into shards (Hugging Face's index + files): packed streamed or in
memory, to the artifact of the same tensors in one file; a broken index or shard is refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from recurnorm.cli.main import main
from recurnorm.errors import CheckpointError
from recurnorm.export.load import load_checkpoint_state
from recurnorm.export.pack import pack_checkpoint
from recurnorm.export.spec import build_policy
from recurnorm.export.stream import open_streamed


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    sd = {
        f"model.layers.{i}.mlp.up_proj.weight": (torch.randn(96, 32, generator=g) * 0.05).bfloat16() for i in range(4)
    }
    sd["model.embed_tokens.weight"] = (torch.randn(300, 32, generator=g) * 0.02).bfloat16()
    sd["model.norm.weight"] = torch.ones(32)
    return sd


def _split(folder, sd: dict, suffix: str = "safetensors", index_name: str = "model.safetensors.index.json") -> dict:
    """sd in two shards plus the index that names them, as Hugging Face saves a large model."""
    folder.mkdir(parents=True)
    names = sorted(sd)
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2])):
        file = f"model-{i + 1:05d}-of-00002.{suffix}"
        shard = {n: sd[n] for n in part}
        save_file(shard, folder / file) if suffix == "safetensors" else torch.save(shard, folder / file)
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / index_name).write_text(json.dumps(index))
    (folder / "config.json").write_text(json.dumps({"hidden_size": 32}))
    return index


@pytest.fixture
def one_and_shards(tmp_path):
    """The same tensors as one model.safetensors and as shards, in folders of the same name
    (the artifact records the checkpoint's name)."""
    sd = _tensors()
    one = tmp_path / "one" / "m"
    one.mkdir(parents=True)
    save_file(sd, one / "model.safetensors")
    (one / "config.json").write_text(json.dumps({"hidden_size": 32}))
    shards = tmp_path / "shards" / "m"
    _split(shards, sd)
    return one, shards, sd


@pytest.mark.parametrize("quant", ["bf16", "int8"])
def test_a_sharded_checkpoint_packs_to_the_artifact_of_its_one_file(one_and_shards, tmp_path, quant):
    one, shards, sd = one_and_shards
    assert open_streamed(shards) is not None  # (read tensor by tensor, each from its shard)
    want = tmp_path / "one.rnpk"
    assert _run("pack", one, "-q", quant, "-o", want).exit_code == 0
    for jobs in (1, 2):  # streamed, tensor by tensor from each shard
        out = tmp_path / f"shards{jobs}.rnpk"
        r = _run("pack", shards, "-q", quant, "--jobs", jobs, "-o", out)
        assert r.exit_code == 0, r.output
        assert out.read_bytes() == want.read_bytes()
    assert pack_checkpoint(shards, build_policy(quant)).data == want.read_bytes()  # (in memory)
    assert _run("verify", out).exit_code == 0
    back = tmp_path / "back.safetensors"
    assert _run("unpack", out, "-o", back).exit_code == 0
    assert set(load_file(back)) == set(sd)


def test_pytorch_bin_shards_load_as_their_safetensors(tmp_path):
    sd = _tensors()
    _split(tmp_path / "bin", sd, "bin", "pytorch_model.bin.index.json")
    state, config = load_checkpoint_state(tmp_path / "bin")
    assert config == {"hidden_size": 32}
    assert set(state) == set(sd) and all(torch.equal(state[n], sd[n]) for n in sd)
    out = tmp_path / "bin.rnpk"
    assert _run("pack", tmp_path / "bin", "-q", "int8", "-o", out).exit_code == 0


def test_a_folder_of_pytorch_model_bin_packs_with_its_config(tmp_path):
    sd = _tensors()
    folder = tmp_path / "gpt"
    folder.mkdir()
    torch.save(sd, folder / "pytorch_model.bin")  # (older Hugging Face models: no safetensors)
    (folder / "config.json").write_text(json.dumps({"hidden_size": 32}))
    packed = pack_checkpoint(folder, build_policy("int8"))
    assert packed.metadata["config"] == {"hidden_size": 32} and {r["name"] for r in packed.rows} == set(sd)


def _broken(tmp_path, edit):
    folder = tmp_path / "m"
    index = _split(folder, _tensors())
    edit(folder, index["weight_map"])
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def _move_to_other_shard(folder, wm):
    name = next(iter(sorted(wm)))
    wm[name] = next(f for f in wm.values() if f != wm[name])


@pytest.mark.parametrize(
    "edit, says",
    [
        (
            lambda f, wm: wm.update({"model.norm.weight": "../m/model-00001-of-00002.safetensors"}),
            "is not a file name in",
        ),
        (lambda f, wm: wm.update({"model.norm.weight": "/etc/passwd"}), "is not a file name in"),
        (
            lambda f, wm: (f / "model-00002-of-00002.safetensors").unlink(),
            "its shard model-00002-of-00002.safetensors is missing",
        ),
        (_move_to_other_shard, "which the index"),
        (lambda f, wm: wm.clear(), 'expected a "weight_map"'),
    ],
    ids=["parent", "absolute", "missing", "moved", "empty"],
)
def test_a_broken_index_or_shard_is_refused_by_name(tmp_path, edit, says):
    folder = _broken(tmp_path, edit)
    for packed_in_memory in (False, True):
        args = ["--effort", "max"] if packed_in_memory else []  # (its two passes hold every tensor: no streaming)
        r = _run("pack", folder, "-q", "int8", "-o", tmp_path / "x.rnpk", *args)
        assert r.exit_code == 1 and says in r.output and str(folder) in r.output, r.output
    with pytest.raises(CheckpointError, match=says.replace("(", r"\(")):
        load_checkpoint_state(folder)
    assert not (tmp_path / "x.rnpk").exists()


def test_a_tensor_in_two_shards_is_refused(tmp_path):
    sd = _tensors()
    folder = tmp_path / "m"
    _split(folder, sd)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    name = sorted(sd)[0]  # in shard 1; shard 2 gets it too, and the index lists it there only
    index["weight_map"][name] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    second = folder / "model-00002-of-00002.safetensors"
    save_file({**load_file(second), name: sd[name]}, second)
    r = _run("pack", folder, "-q", "int8", "-o", tmp_path / "x.rnpk")
    assert r.exit_code == 1 and repr(name) in r.output, r.output


def test_a_folder_without_weights_says_what_it_looked_for(tmp_path):
    r = _run("pack", tmp_path, "-o", tmp_path.parent / "x.rnpk")
    assert r.exit_code == 1
    assert "model.safetensors" in r.output and "model.safetensors.index.json" in r.output


def test_pack_never_writes_over_a_shard_or_the_index(one_and_shards):
    _, shards, _ = one_and_shards
    for target in ("model-00001-of-00002.safetensors", "model.safetensors.index.json"):
        before = (shards / target).read_bytes()
        r = _run("pack", shards, "-q", "int8", "-o", shards / target, "--force")
        assert r.exit_code == 2 and "is an input of this command" in r.output, r.output
        assert (shards / target).read_bytes() == before


def test_an_index_of_more_tensors_than_an_artifact_holds_is_refused_before_any_shard_is_read(tmp_path, monkeypatch):
    import recurnorm.export.load as load

    folder = tmp_path / "m"
    _split(folder, _tensors())
    for shard in folder.glob("*.safetensors"):
        shard.unlink()  # (never opened: the index alone is refused)
    monkeypatch.setattr(load, "MAX_PACK_TENSORS", 3)
    r = _run("pack", folder, "-q", "int8", "-o", tmp_path / "x.rnpk")
    assert r.exit_code == 1 and "model.safetensors.index.json: 6 tensors" in r.output, r.output
